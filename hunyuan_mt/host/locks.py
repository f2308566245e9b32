"""File locks the start takes (the CPU kernels' build, a compiled package's build, the background build, the store's
migration), none of which may outlive its owner.

Each is an OS lock on an open file (`filelock.FileLock`, `flock` on Linux): the kernel drops it when the process
that holds it dies, SIGKILL included, so a waiter takes it over at once and nothing is left for anyone to delete by
hand. torch's own extension builder guards its build folder with a plain `lock` file instead (`FileBaton`): a
build killed midway left that file behind, and the next start slept beside it for as long as it was there, saying
nothing (21 minutes before it was deleted by hand, on an AMD EPYC box). The builds that go through torch's builder
take one of these first and clear torch's file under it (`kernels._load`).

Beside the lock, its holder writes who it is (pid, host, what, since when) into `<lock>.owner`, so that a waiter
can say in one log line what it waits for, and it waits at most `timeout_s` before `LockTimeout` says the same.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock, Timeout

log = logging.getLogger(__name__)

#: Seconds between two tries while another process holds the lock (each try is one non-blocking flock).
POLL_S = 0.2


class LockTimeout(RuntimeError):
    """The lock was still held by a live owner after the waiter's bound."""


def owner_of(path: Path) -> dict[str, Any] | None:
    """What the lock's holder wrote about itself, or None (no holder has written yet, or the file is unreadable)."""
    try:
        found = json.loads(Path(f"{path}.owner").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def describe_owner(owner: dict[str, Any] | None) -> str:
    if not owner:
        return "another process"
    since = owner.get("since")
    started = time.strftime("%H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    return f"process {owner.get('pid', '?')} on {owner.get('host', '?')} ({owner.get('what', '?')}, since {started})"


@contextlib.contextmanager
def owned_lock(path: str | os.PathLike[str], what: str, timeout_s: float,
               logger: logging.Logger | None = None) -> Iterator[None]:
    """Hold the lock file `path` for `what` (a few words: "building the CPU kernels"). Waits at most `timeout_s`
    for another holder, logging one line that names it; raises `LockTimeout` after that."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), thread_local=False)
    deadline = time.monotonic() + max(0.0, timeout_s)
    said = False
    while True:
        try:
            lock.acquire(timeout=0)
            break
        except Timeout:
            owner = owner_of(path)
            if not said:
                (logger or log).info("waiting for %s to finish %s (lock %s; at most %.0f s)",
                                     describe_owner(owner), what, path, timeout_s)
                said = True
            if time.monotonic() >= deadline:
                raise LockTimeout(f"gave up after {timeout_s:g} s waiting for {describe_owner(owner)} to release "
                                  f"{path} (wanted for {what})") from None
            time.sleep(POLL_S)
    try:
        record = {"pid": os.getpid(), "host": socket.gethostname(), "what": what, "since": time.time()}
        with contextlib.suppress(OSError):
            Path(f"{path}.owner").write_text(json.dumps(record), encoding="utf-8")
        yield
    finally:
        with contextlib.suppress(OSError):
            Path(f"{path}.owner").unlink()
        lock.release()
