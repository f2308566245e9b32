"""Admission: which waiting rows enter the running batch between two decode steps, and which running rows give
their place back. The engine's loop (engine.py) calls `_admit` once a round; the rules are in the engine's
docstring (bounds, slots, the fairness bound, owners' turns and shares, documents yielding to interactive rows).

`Admission` is the part of `BatchEngine` that decides; it reads and changes the engine's queue and running rows
under the engine's condition (`_cv`), and hands rows back through the engine's `_drop`, `_requeue` and `_finish`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable

from ..config import EngineConfig
from ..errors import Busy, TranslationError
from ..lora import BASE_SLOT
from .rows import EngineStats, Pending

if TYPE_CHECKING:
    from ..adapters.cache import AdapterCache

#: Seconds after the last interactive row during which document prefills stay small (engine.background_prefill_rows).
INTERACTIVE_WINDOW_S = 10.0
#: Seconds a pending switch of the decode step (`request_upgrade`) lets new rows join a running batch; after that
#: they queue until the running rows finish and the switch is made.
UPGRADE_HOLD_S = 2.0


class Admission:
    """The admission half of `BatchEngine` (its state is set up by `BatchEngine.__init__`)."""

    cfg: EngineConfig
    cache: AdapterCache
    stats: EngineStats
    max_rows: int
    max_tokens: int
    _cv: threading.Condition
    _queue: list[Pending]
    _running: dict[int, Pending]
    _prefills: list[Any]
    _batch: Any
    _drain: bool
    _oom_cap: int | None
    _upgrade: Any
    _last_interactive: float

    def _drop(self, rows: list[Pending]) -> None:
        raise NotImplementedError

    def _requeue(self, rows: list[Pending], preempted: bool) -> None:
        raise NotImplementedError

    def _finish(self, p: Pending, result: str | None = None, error: BaseException | None = None,
                score: float | None = None, tokens: tuple[list[int], list[float]] | None = None) -> None:
        raise NotImplementedError

    def _admit(self) -> list[Pending]:
        """Take rows from the queue into the batch, each with its lease. Rows that cannot enter stay queued."""
        if not self._running:
            self._drain, self._oom_cap = False, None
        cap = self.max_rows if self._oom_cap is None else min(self.max_rows, self._oom_cap)
        urgent = not self._drain and self._make_room(cap)
        live = len(self._running)
        room = cap - live
        if self._drain:
            room = 0
        now = time.monotonic()
        upgrade = self._upgrade
        if upgrade is not None and self._running and now - upgrade[2] > UPGRADE_HOLD_S:
            room = 0  # let the running rows finish: the switch waits for a point where none decodes
        # During a prefill the loop admits only rows that fit beside it (`_iterate`), and at once: gathering them
        # for `max_join_steps` steps would wait out pieces of a second or more on a 1.8B.
        beside = bool(self._prefills)
        urgent = urgent or beside
        with self._cv:
            self._expire_blocked(now)
            if room <= 0 or not self._queue:
                return []
            # Gathering rows into fewer prefills trades a few steps of waiting for throughput: not for an
            # interactive row beside a document's rows.
            if live and not urgent and not self._time_to_join(live):
                return []
            if live and not urgent and len(self._queue) > room and room < min(self.cfg.join_min_rows, cap):
                return []  # a backlog: let a group of rows finish, then refill them in one prefill
            pinned = set(self.cache.pinned())
            resident = set(self.cache.lru_order())

            def cheap(p: Pending) -> bool:
                a = p.row.adapter
                return a is None or a.key in pinned or a.key in resident

            bound = self.cfg.fairness_max_skips
            turns: dict[int, tuple[int, int]] = {}
            for background in (False, True):  # turns within a class: a caller's documents do not cost its texts
                turns.update(owner_turns([p for p in self._queue if p.background == background],
                                    [p for p in self._running.values() if p.background == background]))
            order = []
            # Interactive rows first, then background (document) rows; within each, the starved, then the rows
            # whose adapter needs no load, each group in turn between the rows' owners (`owner_turns`).
            for background in (False, True):
                queue = [p for p in self._queue if p.background == background]
                starved = sorted((p for p in queue if p.skips >= bound), key=lambda p: p.seq)
                rest = sorted((p for p in queue if p.skips < bound), key=lambda p: turns[id(p)])
                order += starved + [p for p in rest if cheap(p)] + [p for p in rest if not cheap(p)]
        longest = max((p.tokens for p in self._running.values()), default=0)
        with self._cv:
            interactive = any(not p.background for p in self._running.values()) or any(
                not p.background for p in self._queue)
        # Background rows that may still enter: beside interactive rows, up to `background_rows` in the batch;
        # while interactive rows came in the last INTERACTIVE_WINDOW_S, up to `background_prefill_rows` a prefill
        # (one that arrives meanwhile waits for a small forward, not a refill of the whole batch); with no
        # interactive traffic about, as many as fit (a document alone runs at full speed).
        background_room = (self.cfg.background_rows - sum(1 for p in self._running.values() if p.background)
                           if interactive else self.cfg.background_prefill_rows
                           if now - self._last_interactive < INTERACTIVE_WINDOW_S else room)
        admitted: list[Pending] = []
        refused: list[tuple[Pending, BaseException]] = []
        draining = False
        share, held, _ = self._owner_shares(cap)
        held_back: set[int] = set()
        for p in order:
            if len(admitted) >= room:
                break
            if not p.background and held[p.owner] >= share:
                held_back.add(id(p))  # its owner has its share while other owners have rows: the room is theirs
                continue
            rows = live + len(admitted) + 1
            if rows > 1 and max(longest, p.tokens) * rows > self.max_tokens:
                if p.skips >= bound:
                    break  # starved and short of room: nothing younger may take the room it waits for
                continue
            if p.background and background_room <= 0:
                break  # background rows come last in the order: none of the rest may enter
            if beside and not self._fits_beside(p):
                continue
            needs_slot = p.row.adapter is not None and p.row.adapter.key not in pinned
            if draining and needs_slot:
                continue  # a starved row waits for a slot to drain: do not extend any slot's lease
            try:
                lease = None if p.row.adapter is None else self.cache.try_acquire([p.row.adapter])
            except TranslationError as exc:
                refused.append((p, exc))
                continue
            if p.row.adapter is not None and lease is None:
                if p.blocked_since is None:
                    p.blocked_since = now
                # Starved: from here on only rows that hold no slot (pinned pairs, the bare backbone) enter.
                draining = draining or p.skips >= bound
                continue
            p.lease, p.slot = lease, (BASE_SLOT if lease is None else lease.slots[0])
            p.blocked_since = None
            admitted.append(p)
            background_room -= int(p.background)
            held[p.owner] += int(not p.background)
            longest = max(longest, p.tokens)
        taken = {id(p) for p in admitted} | {id(p) for p, _ in refused}
        # Per class: an interactive row going ahead of a document's is by design, not a skip; nor is another
        # owner's row whose turn came first (with one owner, a turn is the arrival order).
        latest = {bg: max((turns[id(p)] for p in admitted if p.background == bg), default=(-1, -1))
                  for bg in (False, True)}
        with self._cv:
            self._queue = [p for p in self._queue if id(p) not in taken]
            for p in self._queue:
                if id(p) in turns and id(p) not in held_back and turns[id(p)] < latest[p.background]:
                    p.skips += 1  # a row whose turn came later went ahead of it
        for p, exc in refused:
            self._finish(p, error=exc)
        now = time.monotonic()
        for p in admitted:
            self.stats.queue_ms.append((now - p.enqueued) * 1000)
        return admitted

    def _make_room(self, cap: int) -> bool:
        """Rows that have their place in the batch give it up to rows with a better claim: documents to
        interactive rows (`_yield_documents`), an owner over its share of the batch to an owner under its own
        (`_share_batch`). True when rows that have such a claim wait: they join at once."""
        if self._batch is None:
            return False
        urgent = self._yield_documents(cap)
        return self._share_batch(cap) or urgent

    def _owner_shares(self, cap: int) -> tuple[int, Counter[str | None], Counter[str | None]]:
        """(each owner's share of the batch, interactive rows running per owner, waiting per owner). While the
        interactive rows of several owners (callers, `Ticket.owner`) run or wait, each has `cap // owners` places;
        one owner alone has them all."""
        with self._cv:
            waiting = Counter(p.owner for p in self._queue if not p.background)
        held = Counter(p.owner for p in self._running.values() if not p.background)
        owners = len(set(waiting) | set(held))
        return (cap if owners <= 1 else max(1, cap // owners)), held, waiting

    def _share_batch(self, cap: int) -> bool:
        """Rows of an owner under its share of the batch that wait while the batch is full take the places of the
        newest rows of the owners over their share, which go back to the queue (they start again later; greedy
        output is the same). A caller's page flood held all 64 places, so another caller's sentence waited for
        the flood's rows to drain and then for their refill's prefill; now it enters at the next round, and the
        flood refills only up to its share while the sentence runs. True when such rows wait."""
        share, held, waiting = self._owner_shares(cap)
        if share >= cap:
            return False
        need = sum(min(count, share - held[owner]) for owner, count in waiting.items() if held[owner] < share)
        if not need:
            return False
        short = need - (cap - len(self._running))
        if short > 0:
            excess = {owner: held[owner] - share for owner in held if held[owner] > share}
            newest: list[Pending] = []
            for p in sorted(self._running.values(), key=lambda p: p.seq, reverse=True):
                if len(newest) >= short:
                    break
                if not p.background and excess.get(p.owner, 0) > 0:
                    newest.append(p)
                    excess[p.owner] -= 1
            if newest:
                self._drop(newest)
                self.stats.yielded += len(newest)
                self._requeue(newest, preempted=False)
        return True

    def _yield_documents(self, cap: int) -> bool:
        """Background rows give way to interactive ones. While interactive rows run or wait, at most
        `engine.background_rows` background rows share their batch, and fewer when the waiting interactive rows
        need the room: the newest go back to the queue (they start again later, and greedy output is the same;
        the newest have the least work to lose). A decode step's cost grows with its rows, so a short request
        beside a document then takes about the steps it takes alone, at little more than their idle cost.

        True when interactive rows wait beside running background rows: they join at once."""
        with self._cv:
            waiting = sum(1 for p in self._queue if not p.background)
        background = [p for p in self._running.values() if p.background]
        interactive = len(self._running) - len(background)
        if not background or not (waiting or interactive):
            return False
        keep = min(self.cfg.background_rows, max(0, cap - interactive - waiting))
        if len(background) > keep:
            newest = sorted(background, key=lambda p: p.seq, reverse=True)[:len(background) - keep]
            self._drop(newest)
            self.stats.yielded += len(newest)
            self._requeue(newest, preempted=False)
        return bool(waiting)

    def _time_to_join(self, live: int) -> bool:
        """Whether waiting rows should be prefilled now, while `live` rows decode (caller holds _cv).

        Each prefill is a forward of its own, so rows that arrive one by one are gathered for a few steps
        (at most `max_join_steps`), unless enough of them wait (`join_ratio` of the live rows)."""
        if len(self._queue) >= self.cfg.join_ratio * live:
            return True
        steps = self.stats.decode_steps
        return any(steps - p.steps_at_submit >= self.cfg.max_join_steps for p in self._queue)

    def _expire_blocked(self, now: float) -> None:
        """Fail rows that have waited longer than lease_timeout_s for a slot (caller holds _cv)."""
        limit = self.cache.cfg.lease_timeout_s
        expired = [p for p in self._queue if p.blocked_since is not None and now - p.blocked_since > limit]
        if not expired:
            return
        self._queue = [p for p in self._queue if all(p is not e for e in expired)]
        slots = self.cache.cfg.slots
        for p in expired:
            self.cache.count_busy()
            p.future.set_exception(Busy(
                f"Cannot attach adapter {p.row.key}: all {slots} adapter slots are held by running requests "
                f"(waited {limit:g} s); try again."))

    def _may_admit_beside(self) -> bool:
        """Whether a waiting row may start a prefill of its own beside the one under way (`_fits_beside`), which
        then runs first: otherwise a short request waits for every piece of a long prompt."""
        if len(self._prefills) != 1:
            return False
        with self._cv:
            return any(self._fits_beside(p) for p in self._queue)

    def _fits_beside(self, p: Pending) -> bool:
        """Beside the one prefill under way: an interactive row whose prompt is one forward (at most the batch's
        piece budget), or any interactive row beside a prefill of document rows only."""
        if p.background:
            return False
        budget = getattr(self._batch, "prefill_tokens", None)
        if budget is not None and p.tokens <= budget:
            return True
        prefill = self._prefills[0]
        return all(self._running[t].background for t in prefill.pending if t in self._running)


def owner_turns(queue: Iterable[Pending], running: Iterable[Pending]) -> dict[int, tuple[int, int]]:
    """Each waiting row's turn, as (rows of its owner ahead of it, arrival): the rows of different owners (callers,
    ticket.py) enter in turn, each owner's in arrival order, and an owner's running rows count as taken turns. One
    caller's flood of rows then delays another's next row by about one row per owner, not by the whole flood;
    with one owner (or none), the turns are the arrival order."""
    held: dict[str | None, int] = {}
    for p in running:
        held[p.owner] = held.get(p.owner, 0) + 1
    turns: dict[int, tuple[int, int]] = {}
    for p in sorted(queue, key=lambda p: p.seq):
        ahead = held.get(p.owner, 0)
        held[p.owner] = ahead + 1
        turns[id(p)] = (ahead, p.seq)
    return turns
