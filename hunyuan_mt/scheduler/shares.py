"""What one caller may hold at once of what every caller shares, low in the tree: the web layer meters requests,
long polls, page calls and uploads with these, the document helpers their reading time.

A caller (an owner here: `callers.Caller.identity`, "key:…" or "addr:…") beyond its share is refused with
`RateLimited` (429) and the seconds until its share frees: the nearest end among what it holds, as far as it is
known (a long poll's or a parse's deadline), else the average of its last holds. The other callers are not
touched: a share is per owner, and the totals behind it (threads, helpers, the queue) are larger than one share.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Hashable

from ..errors import RateLimited

#: How much of its last holds' durations a share remembers for its estimate of the wait.
_RECENT = 16
#: Owners a time budget keeps before it forgets those with nothing in their window.
_MAX_OWNERS = 4096
#: Callers whose last wait a refusal pace remembers.
_MAX_PACED = 50_000


@dataclass
class _Owner:
    #: Each hold's start and its known end (None: unknown), by hold id.
    holds: dict[int, tuple[float, float | None]] = field(default_factory=dict)
    #: Durations of the last holds, for the wait estimate when the ends are not known.
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT))


class Share:
    """At most `per_owner` holds at once per owner (requests at work, open long polls, documents being read).

    `hold(owner, ends_at=None)` is a context manager; beyond the share it raises RateLimited before anything is
    held. Thread-safe; owners with nothing held are forgotten."""

    def __init__(self, per_owner: int, what: str, clock: Callable[[], float] = time.monotonic,
                 pool: int = 0) -> None:
        self.per_owner = per_owner
        #: What is held, for the message ("requests at work", "long polls open").
        self.what = what
        #: What every owner shares (the REST threads), or 0. With a pool, an owner past its share still gets a
        #: hold while all holds together stay within half the pool: one application sending 16 requests at once
        #: from one address got 429 for half of them on an idle server, while the other half of the pool is
        #: always there for the other callers' shares.
        self.pool = pool
        self._clock = clock
        self._lock = threading.Lock()
        self._owners: dict[Hashable, _Owner] = {}
        self._ids = 0
        self._total = 0

    def acquire(self, owner: Hashable, ends_at: float | None = None) -> int:
        """Take one of the owner's share (a hold id for `release`), or raise RateLimited with the wait."""
        now = self._clock()
        with self._lock:
            state = self._owners.setdefault(owner, _Owner())
            over = self.per_owner > 0 and len(state.holds) >= self.per_owner
            if over and not (self.pool > 0 and 2 * (self._total + 1) <= self.pool):
                wait = self._wait(state, now)
                idle = " (more only while the server is idle)" if self.pool > 0 else ""
                raise RateLimited(f"Too many {self.what}: {self.per_owner} at once allowed per caller{idle}; retry "
                                  f"in {wait} s.", wait)
            self._ids += 1
            self._total += 1
            state.holds[self._ids] = (now, ends_at)
            return self._ids

    def release(self, owner: Hashable, hold: int) -> None:
        now = self._clock()
        with self._lock:
            state = self._owners.get(owner)
            if state is None or hold not in state.holds:
                return
            started, _ = state.holds.pop(hold)
            self._total -= 1
            state.recent.append(now - started)
            if not state.holds:
                # The durations stay while the owner is active; an owner with nothing held is not kept at all, so
                # a stream of one-off callers cannot grow this table.
                del self._owners[owner]

    @contextlib.contextmanager
    def hold(self, owner: Hashable, ends_at: float | None = None) -> Iterator[None]:
        hold = self.acquire(owner, ends_at)
        try:
            yield
        finally:
            self.release(owner, hold)

    def held(self, owner: Hashable) -> int:
        with self._lock:
            state = self._owners.get(owner)
            return len(state.holds) if state is not None else 0

    def _wait(self, state: _Owner, now: float) -> int:
        """Seconds until one of the owner's holds likely ends: the nearest known end, else the typical duration of
        its last holds less the age of its oldest; at least 1."""
        known = [end - now for _, end in state.holds.values() if end is not None]
        if known:
            return max(1, math.ceil(min(known)))
        oldest = min(start for start, _ in state.holds.values())
        typical = sorted(state.recent)[len(state.recent) // 2] if state.recent else 1.0
        return max(1, math.ceil(typical - (now - oldest)))


class TimeBudget:
    """At most `seconds` of a shared resource's time per owner in any `window_s` (the document helpers' reading
    time), charged after each use, a refused use included: a caller whose reads run to the deadline spends its
    budget as fast as they run. Checked before the next use (`check`): RateLimited with the seconds until enough of
    the window has passed for the owner to be under its budget again."""

    def __init__(self, seconds: float, what: str, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.what = what
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._spent: dict[Hashable, deque[tuple[float, float]]] = {}

    def check(self, owner: Hashable) -> None:
        if self.seconds <= 0:
            return
        now = self._clock()
        with self._lock:
            spent = self._trim(owner, now)
            used = sum(s for _, s in spent)
            if used < self.seconds:
                return
            # The earliest moment the charges still in the window add up to less than the budget.
            freed, until = 0.0, now
            for stamp, seconds in spent:
                freed += seconds
                until = stamp
                if used - freed < self.seconds:
                    break
            wait = max(1, math.ceil(until + self.window_s - now))
        raise RateLimited(f"Too much {self.what}: {self.seconds:g} s per minute allowed per caller, refused "
                          f"attempts included; retry in {wait} s.", wait)

    def charge(self, owner: Hashable, seconds: float) -> None:
        if self.seconds <= 0 or seconds <= 0:
            return
        now = self._clock()
        with self._lock:
            self._trim(owner, now).append((now, seconds))

    def spent(self, owner: Hashable) -> float:
        with self._lock:
            return sum(s for _, s in self._trim(owner, self._clock()))

    def _trim(self, owner: Hashable, now: float) -> deque[tuple[float, float]]:
        if len(self._spent) > _MAX_OWNERS:  # owners whose window has emptied are dropped when the table grows
            for key in list(self._spent):
                if key != owner and not self._expire(self._spent[key], now):
                    del self._spent[key]
        return self._expire(self._spent.setdefault(owner, deque()), now)

    def _expire(self, spent: deque[tuple[float, float]], now: float) -> deque[tuple[float, float]]:
        while spent and spent[0][0] <= now - self.window_s:
            spent.popleft()
        return spent


class RefusalPace:
    """Callers that come back before the wait they were given: their next refusal is answered after the rest of
    that wait (at most `max_s`), on the event loop, where it holds no thread. A client that loops on its refusals
    without reading them (two loops posting a document whose reads ran to the deadline were answered 429 at once,
    then sent 100 requests a second, and another key's sentence took 1.7 s) then sends one every `max_s` per
    connection; one that waits as told is answered at once."""

    def __init__(self, max_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        from cachetools import TTLCache

        self.max_s = max_s
        self._clock = clock
        self._lock = threading.Lock()
        #: owner → when the wait it was last given ends (forgotten an hour on, or when the table is full).
        self._until: TTLCache[Hashable, float] = TTLCache(_MAX_PACED, 3600.0, timer=clock)

    def delay(self, owner: Hashable, retry_after_s: float) -> float:
        """Seconds to hold this refusal of `owner`, given with `retry_after_s`: the rest of its previous wait when
        it came back early (at most `max_s`), else 0."""
        now = self._clock()
        with self._lock:
            until = self._until.get(owner)
            held = 0.0 if until is None or until <= now else min(until - now, self.max_s)
            # It is told the rest of its new wait when the refusal goes out (`RateLimited.later`).
            told = max(1, math.ceil(retry_after_s - held))
            self._until[owner] = max(until or 0.0, now + held + told)
        return held
