"""One address's share of the page's queue (Gradio's): how many of its events may wait or run at once.

Gradio's queue takes every event it is sent (its `max_size` bounds the whole queue, not a caller) and runs them
first come, first served. 1,000 page translations of ~5,000 characters from one keyless address were all accepted
in 24 s; two minutes later 396 still waited, another key's one-sentence /translate took 34 s and a page user on
another address got no answer in 280 s. Here a join (`/ui/gradio_api/queue/join`, `/ui/gradio_api/call/<name>`)
from an address that already has `shares.page_calls` events waiting or running in Gradio's queue, joins in
flight counted, is refused with 429 and the likely wait, before Gradio sees it; `max_size` (`shares.page_queue`)
still bounds the queue as a whole (Gradio answers 503 past it).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from ..errors import RateLimited


class PageQueueShare:
    """Events of the page per address: those in Gradio's queue (waiting or running) and joins not yet answered."""

    def __init__(self, blocks: Any, per_address: int) -> None:
        self.blocks = blocks
        self.per_address = per_address
        self._lock = threading.Lock()
        self._joining: dict[str, int] = {}

    def enter(self, address: str) -> None:
        """Count a join from `address` in, or raise RateLimited with the likely wait."""
        with self._lock:
            events = self._events(address)
            held = len(events) + self._joining.get(address, 0)
            if held >= self.per_address:
                wait = _likely_wait(self.blocks, events)
                raise RateLimited(f"Too many page requests from your address: {self.per_address} waiting or "
                                  f"running at once allowed; retry in {wait} s.", wait)
            self._joining[address] = self._joining.get(address, 0) + 1

    def leave(self, address: str) -> None:
        """The join is answered (its event is in Gradio's queue now, or was refused)."""
        with self._lock:
            left = self._joining.get(address, 0) - 1
            if left > 0:
                self._joining[address] = left
            else:
                self._joining.pop(address, None)

    def held(self, address: str) -> int:
        with self._lock:
            return len(self._events(address)) + self._joining.get(address, 0)

    def _events(self, address: str) -> list[Any]:
        """The address's events in Gradio's queue that take a place (those of functions without a concurrency
        limit, the Status tab's timer, run at once and are not counted)."""
        queue = getattr(self.blocks, "_queue", None)
        events = getattr(queue, "event_ids_to_events", None) or {}
        mine = []
        for event in list(events.values()):
            request = getattr(event, "request", None)
            client = getattr(request, "client", None)
            if getattr(client, "host", None) != address:
                continue
            if getattr(getattr(event, "fn", None), "concurrency_limit", 1) is None:
                continue
            mine.append(event)
        return mine


def _likely_wait(blocks: Any, events: list[Any]) -> int:
    """Seconds until one of `events` likely ends: Gradio's own average run time of its function less the time it
    has already been in the queue, the soonest of them; 1 when nothing is known yet."""
    queue = getattr(blocks, "_queue", None)
    times = getattr(queue, "process_time_per_fn", {}) or {}
    now = time.monotonic()
    waits = []
    for event in events:
        measured = times.get(event.fn) if hasattr(times, "get") else None
        average = getattr(measured, "avg_time", None)
        if average:
            waits.append(average - (now - getattr(event, "enqueue_time", now)))
    return max(1, math.ceil(min(waits))) if waits else 1
