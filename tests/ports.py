"""A free local port for a server a test starts and binds seconds later (Ray Serve's proxy, the CLI's server)."""

from __future__ import annotations

import random
import socket


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
