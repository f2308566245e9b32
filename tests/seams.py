"""Holding the live server's engine where a test needs it, through its `before_generate` seam (called with the
rows of every forward, on the engine thread), and waiting for what follows. Shared by the tests of tickets,
streams, jobs and the page."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable


def hold(engine: Any, marker: str, nth: int = 1) -> tuple[threading.Event, threading.Event, list[list[Any]]]:
    """Hold the `nth` forward whose rows include `marker` (1: its prefill) until the second event is set; the
    list records the rows of every forward after it. The first event is set once the engine waits there."""
    reached, go = threading.Event(), threading.Event()
    after: list[list[Any]] = []
    seen = {"n": 0}

    def seam(rows: list[Any]) -> None:
        if reached.is_set():
            after.append(list(rows))
        elif any(marker in r.text for r in rows):
            seen["n"] += 1
            if seen["n"] == nth:
                reached.set()
                assert go.wait(60), "the test never released the engine"

    engine.before_generate = seam
    return reached, go, after


def eventually(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Wait until `check()` holds, at most `timeout` seconds; fail saying `what` did not happen."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.01)


def leases(service: Any) -> int:
    """Adapter leases held now (each running row holds one)."""
    return sum(r.leases for r in service.cache.stats().resident)


def memory_in(folder: Path, shipped: Path | None = None) -> Any:
    """A translation memory over an SQLite store of its own in `folder` (what a server, or the CLI, opens there):
    two memories made on one folder are two processes sharing a database."""
    from hunyuan_mt.store import MemoryRows, open_engine
    from hunyuan_mt.store.db import sqlite_url
    from hunyuan_mt.store.tm import TranslationMemory

    return TranslationMemory(MemoryRows(open_engine(sqlite_url(folder / "hunyuan.db"))), shipped)

