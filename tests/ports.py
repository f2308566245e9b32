"""A free local port for a server a test starts and binds seconds later (Ray Serve's proxy, the CLI's server), and
the wait for such a server to say it is healthy."""

from __future__ import annotations

import random
import socket
import subprocess
import time
from typing import Callable

import httpx


def free_port() -> int:
    """A free port below the kernel's ephemeral range (32768+) and above Ray's worker ports (10002-19999). A port the
    kernel hands out (bind to 0) is released at once and bound by the server seconds later, after Ray has started
    its processes: meanwhile any outgoing connection may take it ("Failed to bind to address '127.0.0.1:38051'",
    once in five suites on 2026-12-06)."""
    for port in random.sample(range(20000, 30000), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-29999")


def wait_healthy(port: int, proc: subprocess.Popen, output: Callable[[], str], what: str, timeout: float,
                 every: float = 0.2) -> None:
    """Poll http://127.0.0.1:`port`/health until it answers {"status": "ok"}, failing with `output()` (the server's
    log) if `proc` ends or `timeout` passes first. One client for the whole wait: each httpx.get makes a client and
    its TLS context (certifi's bundle read again), which at 5 polls a second was most of a test process's CPU while
    its server started."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=10) as client:
        while time.monotonic() < deadline:
            assert proc.poll() is None, output()
            try:
                if client.get(f"http://127.0.0.1:{port}/health").json() == {"status": "ok"}:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(every)
    raise AssertionError(f"{what} never became healthy:\n{output()}")
