"""A request's handle on its rows while they run: cancel them, ask them to yield, hear their tokens.

The edges make one per request (a REST call, a chat stream, a page visit, a document job) and pass it down through
the service to the engine, which reads it between decode steps:

- `cancel()`: the client went away (or cancelled a job). The engine takes the rows out of the queue and out of the
  running batch at its next step and drops their adapter leases; whoever still waits on them gets `Cancelled`.
- `background`: document rows. They enter the batch after every interactive row that waits, and give their
  place up to one when the batch is full, so a long document does not hold short requests back.
- `owner`: who is charged for the rows (a caller's identity, `callers.Caller.identity`). The engine admits the
  waiting rows of different owners in turn, so one caller's thousand rows do not queue another's one row behind
  them all.
- `on_tokens(index, ids, done)`: called on the engine's thread after each decode step with the ids a row generated
  so far (`index`: the row's position in its submit; `done`: these are its final output ids). It must be quick; the service's stream only stores them and
  wakes its reader, which decodes them on its own thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

TokenListener = Callable[[int, list[int], bool], None]


@dataclass
class _Cancel:
    """Shared by a ticket and its twins (`with_listener`): cancelling one cancels all."""

    event: threading.Event = field(default_factory=threading.Event)
    reason: str = ""
    #: Called once when it is cancelled (the engine: so its loop looks for cancelled rows only then).
    watchers: set[Callable[[], None]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(eq=False)
class Ticket:
    background: bool = False
    on_tokens: TokenListener | None = None
    #: Tell `on_tokens` only when a row is done (a document's progress), not after every step.
    final_only: bool = False
    #: Whose rows these are, for the engine's turn-taking between callers; None: the server's own (one group).
    owner: str | None = None
    _cancel: _Cancel = field(default_factory=_Cancel, repr=False)

    def cancel(self, reason: str = "cancelled") -> None:
        """Cancel the request (idempotent; the first reason is kept: "client disconnected", "job cancelled")."""
        with self._cancel.lock:
            if self._cancel.event.is_set():
                return
            self._cancel.reason = reason
            self._cancel.event.set()
            watchers = list(self._cancel.watchers)
        for watcher in watchers:
            watcher()

    def watch(self, watcher: Callable[[], None]) -> None:
        """Call `watcher` when this ticket is cancelled (at once if it already is); the same one is kept once."""
        with self._cancel.lock:
            if not self._cancel.event.is_set():
                self._cancel.watchers.add(watcher)
                return
        watcher()

    @property
    def cancelled(self) -> bool:
        return self._cancel.event.is_set()

    @property
    def reason(self) -> str:
        return self._cancel.reason

    def with_listener(self, on_tokens: TokenListener | None, final_only: bool = False) -> "Ticket":
        """The same cancellation and priority with another token listener (one per engine submit: a pivot's two
        hops, or a stream's rows)."""
        return Ticket(self.background, on_tokens, final_only, self.owner, self._cancel)
