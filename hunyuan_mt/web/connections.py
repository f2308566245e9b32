"""Connections before they are requests: how many one address and all addresses may hold open, and how long a
client has to send a request's headers.

uvicorn bounds neither. Its keep-alive timer starts only after a response and stops at the first byte of the next
request, so a client that trickles header bytes is never timed out; `limit_concurrency` answers 503 only once a
request's headers are in, which a slow client never reaches. 3,000 such connections stayed open for 90 s, and at
~20,000 the process ran out of file descriptors (`Too many open files` reading /proc/meminfo) and real clients got
errors. The protocol class here (uvicorn's own, through its `http=` setting) adds both:

- a cap per address (trusted proxies excepted: every client behind them shares their address) and a total cap kept
  below the open-file limit (`connection_cap`); a connection over either is answered at once (429 or 503, with
  Retry-After) and closed before anything is read from it, so its descriptor is free again within the same turn of
  the event loop;
- a deadline for a request's headers (`server.header_timeout_s`), counted from the connection's start or from the
  end of the previous answer on it: past it, 408 and the connection is closed. A body has its own pace
  (`requests.BodyLimitMiddleware`).
"""

from __future__ import annotations

import asyncio
import math
import resource
import threading
from typing import Any, Sequence

#: Descriptors left for everything but client connections: the database, the document helpers' pipes, uploads
#: being written, the model's files, /proc reads of the memory monitor.
FD_RESERVE = 1024


def raise_open_files_limit() -> int:
    """The soft limit on open files raised to the hard one (what the process may open without privileges); the
    soft limit in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # a container that forbids it: the cap below follows the soft limit as it is
    return soft


def connection_cap(configured: int) -> int:
    """Connections the server may hold at once: `configured`, but never so many that the process runs out of
    descriptors for its own files (FD_RESERVE below the soft limit; half of it when the limit is small)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = soft - FD_RESERVE if soft > 2 * FD_RESERVE else soft // 2
    return max(1, min(configured, room))


class ConnectionGuard:
    """Open connections per address and in all, against their caps. Thread-safe (one event loop uses it, tests
    read it from theirs)."""

    def __init__(self, per_address: int, total: int, exempt: Sequence[str] = (), header_timeout_s: float = 10.0):
        self.per_address = per_address
        self.total = total
        self.exempt = frozenset(exempt)
        self.header_timeout_s = header_timeout_s
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}
        self._count = 0
        #: Connections refused at once, and closed for sending their headers too slowly (for tests and metrics).
        self.refused = 0
        self.timed_out = 0

    def admit(self, address: str) -> tuple[int, str] | None:
        """Count a new connection in, or say why not: (status, reason) for a refusal."""
        with self._lock:
            if self._count >= self.total:
                self.refused += 1
                return 503, f"The server holds {self._count} connections, the most it may; try again shortly."
            held = self._open.get(address, 0)
            if held >= self.per_address and address not in self.exempt:
                self.refused += 1
                return 429, (f"Too many connections from your address: {self.per_address} open at once allowed; "
                             "close some, or try again shortly.")
            self._open[address] = held + 1
            self._count += 1
            return None

    def leave(self, address: str) -> None:
        with self._lock:
            held = self._open.get(address, 0)
            if held <= 1:
                self._open.pop(address, None)
            else:
                self._open[address] = held - 1
            self._count = max(0, self._count - 1)

    @property
    def open(self) -> int:
        with self._lock:
            return self._count

    def open_from(self, address: str) -> int:
        with self._lock:
            return self._open.get(address, 0)


def _answer(status: int, reason: str, message: str, retry_after: int | None) -> bytes:
    body = message.encode("utf-8")
    head = [f"HTTP/1.1 {status} {reason}", "content-type: text/plain; charset=utf-8", f"content-length: {len(body)}",
            "connection: close"]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body


def guarded_protocol(guard: ConnectionGuard, base: type | None = None) -> type:
    """uvicorn's HTTP protocol class (httptools where it is installed, else h11) under `guard`: pass it as
    `uvicorn.Config(http=...)`."""
    if base is None:
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
        except ImportError:  # httptools is optional in uvicorn
            from uvicorn.protocols.http.h11_impl import H11Protocol as base

    class GuardedProtocol(base):  # type: ignore[misc, valid-type]
        _guard = guard

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            peer = transport.get_extra_info("peername")
            self._address = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else "unknown"
            self._counted = False
            self._deadline: asyncio.TimerHandle | None = None
            self._seen_cycle: Any = None
            refusal = self._guard.admit(self._address)
            super().connection_made(transport)
            if refusal is not None:
                status, message = refusal
                wait = max(1, math.ceil(self._guard.header_timeout_s))
                transport.write(_answer(status, "Too Many Requests" if status == 429 else "Service Unavailable",
                                        message, wait))
                transport.close()
                return
            self._counted = True
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._counted:
                self._counted = False
                self._guard.leave(self._address)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            cycle = getattr(self, "cycle", None)
            if cycle is not None and cycle is not self._seen_cycle:
                self._seen_cycle = cycle  # a request's headers are in: it is the app's now, not the deadline's
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's headers have the same time from here

        def handle_websocket_upgrade(self, *args: Any) -> None:
            # The connection leaves this protocol (and never reports its end here): it is not counted any more.
            self._disarm()
            if self._counted:
                self._counted = False
                self._guard.leave(self._address)
            super().handle_websocket_upgrade(*args)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(self._guard.header_timeout_s, self._headers_late)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _headers_late(self) -> None:
            self._deadline = None
            cycle = getattr(self, "cycle", None)
            if self.transport.is_closing() or (cycle is not None and not cycle.response_complete):
                return  # a request is being answered (a pipelined one): not a slow client
            self._guard.timed_out += 1
            timeout = self._guard.header_timeout_s
            self.transport.write(_answer(408, "Request Timeout", f"Request headers not received within {timeout:g} s.",
                                         None))
            self.transport.close()

    GuardedProtocol.__name__ = f"Guarded{base.__name__}"
    return GuardedProtocol
