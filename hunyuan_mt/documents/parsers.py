"""Documents are read and written in helper processes, where a parse can be stopped.

A reader is Python and C (lxml, pypdf, ruamel) that runs as long as its input makes it run. In the server's process
nothing can stop it: a client that left, a deadline that passed or a SIGTERM all waited for it, and lxml held the
GIL meanwhile, so every other request waited too (bench/hostile.py: an XLIFF element with 40,000 attributes held every
client for 18-24 s). The caps in each reader bound the algorithms we know of; this bounds the ones we do not.

`DocumentParsers` keeps up to `limits.parse_workers` helper processes, started with spawn and warm (every reader's
libraries imported). A call sends the upload's bytes to an idle helper and waits for the answer in slices; when
the call's deadline (`limits.parse_timeout_s`) passes, its client leaves, or the server stops, the helper is
killed (SIGKILL: no CPU burns for a request nobody waits for) and a fresh one is started in its place.

What comes back is a `ParsedDocument`: the segments and what the translation needs to know of the format. Its
tree stays behind (an lxml tree cannot cross a process boundary), so rendering reads the upload again in a helper
and writes the translations into it there: a second parse, of a file already known to parse in time, instead of
a helper held for the whole translation. A format whose rendering needs nothing of the file but its layout (a
PDF: paragraphs and page breaks into a new .docx) sends that layout back with the segments and is written from it
(`Document.layout`), without the second read; the others get the time their read took on top of the deadline,
so that a file read in time is not lost at the write.

Each caller (`owner`, a caller's identity) has its share of the helpers: `shares.parses` reads at once and
`shares.parse_s_per_min` seconds of reading a minute, a read stopped at the deadline charged its whole time
(`shares.Share`, `shares.TimeBudget`; 429 beyond). Two loops of uploads that each run to the deadline took both
helpers and made another caller's small file wait a minute for a 503; now they take one helper, then 429. A
call logs at most `MAX_LOG_RECORDS` lines (pypdf warns once per bad
object: one 900 KB PDF wrote 33,180 lines), then one line saying how many more there were.
"""

from __future__ import annotations

import atexit
import functools
import logging
import multiprocessing
import os
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any, Hashable, Sequence

from ..config import LimitsConfig, SharesConfig
from ..errors import Busy, Cancelled, InputTooLarge, InvalidInput, ServerStopping, TranslationError
from ..host.helpers import become_helper, main_not_rerun
from ..scheduler.shares import Share, TimeBudget
from .base import Document, RenderedDocument
from .reader import import_all_formats, read_document, render_layout, upload_name

log = logging.getLogger(__name__)

#: How often a waiting call looks at its client and at the server's state (seconds).
_SLICE_S = 0.05
#: How long a helper may take to start (spawn, then import every reader's library: under a second here).
_START_WAIT_S = 60.0
#: How long a call may wait for a free helper before it is told to come back (503 Busy).
_QUEUE_WAIT_S = 30.0
#: Log records one call in a helper may write; past it they are counted, and one line says how many.
MAX_LOG_RECORDS = 20
#: The helpers' CPU priority (`nice`): below the server's, whose engine threads then keep the cores they need while
#: a document is read. The deadline counts the helper's CPU time, so a read slowed by it is not refused for it.
HELPER_NICE = 10
#: A read is stopped after its deadline in CPU time, or this many times it in wall time (a helper that never gets
#: the CPU).
WALL_FACTOR = 4.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ReadTooLong(InputTooLarge):
    """A read or write stopped at its deadline (413); `spent_s`: the helper's CPU seconds, charged to its caller."""

    def __init__(self, message: str, spent_s: float) -> None:
        super().__init__(message)
        self.spent_s = spent_s

Gone = Callable[[], bool]


class ParsedDocument(Document):
    """A document read in a helper process: its segments are here, its tree is not. Rendering reads the upload
    again in a helper and writes the translations into it there."""

    def __init__(self, parsers: "DocumentParsers", data: bytes, limits: LimitsConfig, shape: "Shape",
                 owner: Hashable | None = None, read_s: float = 0.0) -> None:
        name, self.kind, self.sentinel_markup, segments, self._layout = shape
        super().__init__(name, segments)
        self._parsers = parsers
        self._data = data
        self._limits = limits
        self._owner = owner
        #: How long reading it took: writing, which reads it again, gets that on top of its deadline.
        self._read_s = read_s

    def _render(self, translations: list[str], target: str | None) -> RenderedDocument:
        # Charged to its caller, never refused: the translation is done, and the file is known to read in time.
        if self._layout is not None:
            return self._parsers.call(render_layout, self.kind, self.filename, self._layout, translations, target,
                                      what=self.filename, doing="writing its translation", charge=self._owner)
        # Read again under the name it was read with (`upload_name` of it is itself); the deadline is the write's
        # own, on top of the time the read is known to take.
        return self._parsers.call(_render_in_helper, self._data, self.filename, self._limits, translations,
                                  target, dict(self.origins), self.review_comments, what=self.filename,
                                  doing="writing its translation", charge=self._owner, extra_s=self._read_s)


class DocumentParsers:
    """Helper processes that read and write documents under a deadline (see the module docstring). Thread-safe."""

    def __init__(self, limits: LimitsConfig, shares: SharesConfig | None = None) -> None:
        self.limits = limits
        shares = shares or SharesConfig()
        #: Each caller's share: reads at once, and seconds of reading a minute (refused reads included).
        self.reading = Share(shares.parses, "documents being read")
        self.reading_time = TimeBudget(shares.parse_s_per_min, "document reading")
        self._context = multiprocessing.get_context("spawn")  # not fork: the server holds threads and torch
        self._lock = threading.Condition()
        self._idle: list[_Helper] = []
        self._count = 0  # helpers started or starting, idle or busy
        self._busy: set[_Helper] = set()
        self._stopping = False
        # Helpers are started from one long-lived thread: each is told to die with the thread that started it
        # (Linux), so that a server killed outright cannot leave one parsing for nobody.
        self._to_start = 0
        self._starter = threading.Thread(target=self._start_helpers, name="hmt-parsers", daemon=True)
        self._starter.start()
        # A process that ends without `close` (a script, a benchmark's worker) must not wait for its helpers
        # forever: multiprocessing's own exit handler stops them with SIGTERM, which they ignore (`become_helper`),
        # then joins them, while each waits for this process to end. Ours runs first (handlers run last in, first
        # out) and kills them.
        self._at_exit = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)

    @property
    def isolated(self) -> bool:
        return self.limits.parse_workers > 0

    # ------------------------------------------------------------------ the two calls the server makes

    def read(self, data: bytes, filename: str, limits: LimitsConfig | None = None, gone: Gone | None = None,
             owner: Hashable | None = None) -> Document:
        """`documents.read_document` in a helper: the same checks and the same errors, under the deadline.
        `gone()` says whether the caller has left (its client disconnected): the parse is then stopped. `owner`
        (the caller) reads within its share (RateLimited beyond it) and is charged the time."""
        limits = limits or self.limits
        if not self.isolated:
            return read_document(data, filename, limits)
        started = time.monotonic()
        shape = self.call(_read_in_helper, data, filename, limits, what=upload_name(filename), doing="reading it",
                          gone=gone, owner=owner)
        return ParsedDocument(self, data, limits, shape, owner, time.monotonic() - started)

    def reader(self, gone: Gone | None = None,
               owner: Hashable | None = None) -> Callable[[bytes, str, LimitsConfig], Document]:
        """`read` as `documents.translate_document` takes it, for a caller that may leave."""
        return lambda data, filename, limits: self.read(data, filename, limits, gone, owner)

    def call(self, fn: Callable[..., Any], *args: Any, what: str, doing: str, gone: Gone | None = None,
             owner: Hashable | None = None, charge: Hashable | None = None, extra_s: float = 0.0) -> Any:
        """`fn(*args)` in a helper, stopped past `limits.parse_timeout_s` (+ `extra_s`), when `gone()` turns true,
        or when the server stops. `fn` must be a module-level function (it is pickled by name); its domain errors
        come back as they were raised. `owner` runs it within that caller's share (RateLimited beyond it: reads at
        once, seconds a minute) and is charged its time, refused or not; `charge` only charges."""
        limit_s = self.limits.parse_timeout_s + extra_s
        if owner is None:
            return self._call(fn, args, what, doing, gone, charge, limit_s)
        self.reading_time.check(owner)
        # No known end: a read's wall time depends on the CPU it gets (the deadline counts CPU time), so the wait
        # a refusal gives is the typical length of the owner's last reads less the age of its oldest.
        hold = self.reading.acquire(owner)
        try:
            return self._call(fn, args, what, doing, gone, owner, limit_s)
        finally:
            self.reading.release(owner, hold)

    def check(self, owner: Hashable) -> None:
        """RateLimited now when `owner` could not read a document (its reads at once, or its seconds a minute, are
        spent): asked before an upload's body is even read, so a caller looping on refusals costs little."""
        self.reading_time.check(owner)
        if self.reading.held(owner) >= self.reading.per_owner:
            self.reading.acquire(owner)  # raises, with the wait; never holds (the share is full)

    def _call(self, fn: Callable[..., Any], args: Sequence[Any], what: str, doing: str, gone: Gone | None,
              owner: Hashable | None, limit_s: float) -> Any:
        helper = self._take()
        started = time.monotonic()
        try:
            reply, spent = helper.run(fn, args, limit_s, lambda: self._stopping, gone, what, doing)
        except BaseException as exc:
            self._discard(helper)
            if owner is not None:  # a read stopped at its deadline is charged its whole time
                self.reading_time.charge(owner, exc.spent_s if isinstance(exc, ReadTooLong)
                                         else time.monotonic() - started)
            raise
        if owner is not None:
            self.reading_time.charge(owner, spent)
        self._give_back(helper)
        status, value = reply
        if status == "ok":
            return value
        if status == "error":
            raise value
        log.error("document helper failed on %s:\n%s", what, value)
        raise RuntimeError(f"{what}: the reader failed ({value.strip().splitlines()[-1]})")

    def close(self) -> None:
        """Stop every helper at once (the server is stopping): calls in progress end with ServerStopping."""
        atexit.unregister(self._at_exit)
        with self._lock:
            self._stopping = True
            idle, busy = list(self._idle), list(self._busy)
            self._count -= len(idle)
            self._idle.clear()
            self._lock.notify_all()
        for helper in busy + idle:
            helper.kill()  # a busy one's caller sees it end, answers ServerStopping and reaps it
        for helper in idle:
            helper.reap()

    def pids(self) -> list[int]:
        """The helper processes now running (idle or busy)."""
        with self._lock:
            return [helper.process.pid for helper in self._idle + list(self._busy)]

    def warm(self) -> None:
        """Start one helper now, without waiting for it (the first upload then finds it ready)."""
        if self.isolated:
            with self._lock:
                if self._count == 0 and not self._stopping:
                    self._count += 1
                    self._request_start()

    # ------------------------------------------------------------------ helpers: taken, given back, replaced

    def _take(self) -> "_Helper":
        deadline = time.monotonic() + _QUEUE_WAIT_S
        with self._lock:
            while True:
                if self._stopping:
                    raise ServerStopping("The server is stopping; send the document again once it is back.")
                if self._idle:
                    helper = self._idle.pop()
                    self._busy.add(helper)
                    return helper
                if self._count < self.limits.parse_workers:
                    self._count += 1
                    self._request_start()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Busy(f"Every document reader ({self.limits.parse_workers}) is busy; try again shortly.")
                self._lock.wait(min(left, 1.0))

    def _give_back(self, helper: "_Helper") -> None:
        with self._lock:
            self._busy.discard(helper)
            if not self._stopping:
                self._idle.append(helper)
                self._lock.notify_all()  # not notify(): the starter thread waits on the same condition
                return
            self._count -= 1
        helper.kill()
        helper.reap()

    def _discard(self, helper: "_Helper") -> None:
        """A helper that was stopped mid-call (or died): killed, and another started in its place, so that the next
        upload finds one warm."""
        helper.kill()
        helper.reap()
        with self._lock:
            self._busy.discard(helper)
            if self._stopping:
                self._count -= 1
                return
            self._request_start()  # the count stays: the replacement takes the dead one's place

    def _request_start(self) -> None:
        """(holding the lock) Ask the starter thread for one more helper."""
        self._to_start += 1
        self._lock.notify_all()

    def _start_helpers(self) -> None:
        while True:
            with self._lock:
                while not self._to_start and not self._stopping:
                    self._lock.wait()
                if self._stopping:
                    return
                self._to_start -= 1
            try:
                helper = _Helper.start(self._context)
            except Exception:  # noqa: BLE001 - reported to the caller that waits for it, as Busy, not lost
                log.exception("could not start a document helper process")
                with self._lock:
                    self._count -= 1
                    self._lock.notify_all()
                continue
            with self._lock:
                stopped = self._stopping
                if not stopped:
                    self._idle.append(helper)
                    self._lock.notify_all()
            if stopped:
                helper.kill()
                helper.reap()
                return


def _close_at_exit(parsers: "weakref.ref[DocumentParsers]") -> None:
    found = parsers()
    if found is not None:
        found.close()


class _Helper:
    """One helper process and the pipe to it."""

    def __init__(self, process: Any, conn: Connection) -> None:
        self.process = process
        self.conn = conn

    @classmethod
    def start(cls, context: Any) -> "_Helper":
        ours, theirs = context.Pipe()
        process = context.Process(target=_serve, args=(theirs, os.getpid()), name="hmt-document-helper",
                                  daemon=True)
        with main_not_rerun():
            process.start()
        theirs.close()
        # Idle only once its libraries are imported: a call's deadline must not pay for them.
        if not ours.poll(_START_WAIT_S) or ours.recv() != "ready":
            process.kill()
            process.join(5)
            ours.close()
            raise RuntimeError(f"a document helper did not start within {_START_WAIT_S:g} s")
        return cls(process, ours)

    def run(self, fn: Callable[..., Any], args: Sequence[Any], limit_s: float, stopping: Gone, gone: Gone | None,
            what: str, doing: str) -> tuple[tuple[str, Any], float]:
        """(the helper's reply, the CPU seconds the call took). The deadline is `limit_s` of the helper's CPU time:
        a helper slowed by the server's own work (it runs at a lower priority, `HELPER_NICE`) or by another program
        is not stopped for it; `limit_s` × WALL_FACTOR of wall time stops one that never gets the CPU."""
        self.conn.send((fn, tuple(args)))
        # The deadline counts from here: a helper still importing its libraries is not the upload's fault.
        started, before = time.monotonic(), self.cpu_s()

        def used() -> float:
            now = self.cpu_s()
            return now - before if before >= 0 and now >= 0 else time.monotonic() - started

        while True:
            ready = wait([self.conn, self.process.sentinel], timeout=_SLICE_S)
            if self.conn in ready:
                try:
                    return self.conn.recv(), used()
                except (EOFError, OSError):
                    pass  # the process ended without answering: said below
            if stopping():
                raise ServerStopping("The server is stopping; send the document again once it is back.")
            if ready:  # the process ended without answering
                self.process.join(1)
                raise InvalidInput(f"{what}: the reader stopped while {doing} (its process ended with "
                                   f"{_ending(self.process.exitcode)}); the file was not translated")
            if gone is not None and gone():
                raise Cancelled("Cancelled: the client disconnected while its document was being read.")
            spent = used()
            if spent > limit_s or time.monotonic() - started > WALL_FACTOR * limit_s:
                raise ReadTooLong(f"{what}: {doing} took longer than {limit_s:g} s (limits.parse_timeout_s) and "
                                  "was stopped; split the document or simplify its structure", spent)

    def cpu_s(self) -> float:
        """The helper's CPU seconds so far (user and system, from /proc), or -1 where they cannot be read."""
        try:
            with open(f"/proc/{self.process.pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
        except (OSError, IndexError, ValueError):
            return -1.0

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()

    def reap(self) -> None:
        self.process.join(5)
        self.conn.close()


def _ending(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {-code}{', perhaps out of memory' if -code == 9 else ''}"
    return f"code {code}"


# ------------------------------------------------------------------ in the helper process

def _serve(conn: Connection, parent: int) -> None:
    become_helper(parent, "hmt-document-helper", die_with_spawner=True)
    try:
        os.nice(HELPER_NICE)
    except OSError:
        pass  # not allowed here: the helper runs at the server's priority
    bounded = _BoundedLog(MAX_LOG_RECORDS)
    _import_readers()
    conn.send("ready")
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):
            return  # the server closed its end
        bounded.start()
        try:
            reply: tuple[str, Any] = ("ok", fn(*args))
        except TranslationError as exc:
            reply = ("error", exc)
        except Exception:  # noqa: BLE001 - a reader's bug: the server logs it and answers 500
            reply = ("crash", traceback.format_exc())
        bounded.end(args[1] if len(args) > 1 and isinstance(args[1], str) else "a document")
        try:
            conn.send(reply)
        except (OSError, ValueError):
            return


class _BoundedLog(logging.Filter):
    """In a helper: at most `limit` log records a call reach stderr (the helper's only log), then one line with how
    many more there were. A reader's libraries log per malformed object, and one upload must not write a log of
    its own size."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.seen = 0
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler.addFilter(self)
        # In place of logging.lastResort (WARNING and up to stderr, as before), which nothing would bound.
        logging.getLogger().addHandler(handler)
        self._handler = handler

    def start(self) -> None:
        self.seen = 0

    def filter(self, record: logging.LogRecord) -> bool:
        self.seen += 1
        return self.seen <= self.limit

    def end(self, what: str) -> None:
        if self.seen > self.limit:
            self._handler.emit(logging.LogRecord("hunyuan_mt.documents", logging.WARNING, __file__, 0,
                                                 "%s: %d more log lines while reading it were left out", (
                                                     what, self.seen - self.limit), None))


def _import_readers() -> None:
    """What a first upload would import (every format's module and library: `reader` imports them on first use),
    so that no call pays for it within its deadline."""
    from ruamel.yaml import YAML  # noqa: F401 - imported by the YAML reader on first use

    import_all_formats()


#: What a read sends back: the name, kind, markup flag and segments, and the layout a format can be written from
#: without reading the file again (`Document.layout`; None for the others).
Shape = tuple[str, str, bool, list[str], Any]


def _read_in_helper(data: bytes, filename: str, limits: LimitsConfig) -> Shape:
    document = read_document(data, filename, limits)
    return document.filename, document.kind, document.sentinel_markup, document.segments, document.layout()




def _render_in_helper(data: bytes, filename: str, limits: LimitsConfig, translations: list[str], target: str | None,
                      origins: dict[str, str], review_comments: bool = False) -> RenderedDocument:
    document = read_document(data, filename, limits)
    document.origins = origins
    document.review_comments = review_comments
    return document.render(translations, target)
