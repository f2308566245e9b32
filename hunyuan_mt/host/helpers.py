"""What the server's helper processes (the language detector, the document parsers) share: how they are started
without re-running the server's main module, and how they stay out of the server's way when it stops."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from typing import Iterator

#: One helper starts at a time: `main_not_rerun` edits the `__main__` module, which is process-wide.
_STARTING = threading.Lock()


@contextlib.contextmanager
def main_not_rerun() -> Iterator[None]:
    """spawn re-runs the parent's main module in the child (by name, or by path). A helper needs nothing from it,
    and re-running it would be harmful: a user's script without a `__main__` guard would build a second service in
    the child, and `python -m hunyuan_mt` would run the CLI again. Hide both while a helper starts."""
    with _STARTING:
        main = sys.modules.get("__main__")
        if main is None:
            yield
            return
        missing = object()
        saved = {name: getattr(main, name, missing) for name in ("__file__", "__spec__")}
        if saved["__file__"] is not missing:
            del main.__file__
        main.__spec__ = None
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is not missing:
                    setattr(main, name, value)


def become_helper(parent: int, name: str, die_with_spawner: bool = False) -> None:
    """In a helper process, first thing: the server decides when it stops. A Ctrl-C or a SIGTERM sent to the whole
    process group must not kill it mid-call, nor print a KeyboardInterrupt traceback of its own; and a server
    killed outright (SIGKILL, out of memory) cannot stop it, so it leaves by itself when the server is gone.

    `die_with_spawner` (Linux) also has the kernel kill the helper when the server's *thread* that started it ends:
    only for a helper started from a thread that lives as long as the helper is wanted."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if die_with_spawner:
        _die_with_spawner()
    threading.Thread(target=_exit_with_parent, args=(parent,), name=f"{name}-watch", daemon=True).start()


_PR_SET_PDEATHSIG = 1


def _die_with_spawner() -> None:
    """Linux: the kernel sends us SIGKILL when the server's thread that started us ends (PR_SET_PDEATHSIG is per
    thread), even while we are busy in C code that holds the GIL, where `_exit_with_parent`'s thread cannot run."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)
