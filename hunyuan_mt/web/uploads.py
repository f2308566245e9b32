"""The page's uploads (Gradio's /ui/gradio_api/upload): which files it stores, how many bytes one address keeps on
disk, and the sweep that deletes them.

Gradio stores whatever it is sent, under any name, for as long as its cache lives (`delete_cache`: 30 minutes). 100
uploads of ~10 MiB from one keyless address took its folder from 10 MB to 1 GB in 12.5 s, an `.exe` among them.
Here an upload must be a file one of the page's file fields accepts (`PageUploads.extensions`, checked on each
part's headers as the body streams in, before Gradio writes the part), an address may keep at most
`shares.upload_bytes` on disk (429 until its oldest upload is swept), and every upload is deleted
`shares.upload_ttl_s` after it came, sooner when all uploads together pass `shares.upload_total_bytes` (the oldest
first).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from python_multipart.multipart import MultipartParser, parse_options_header

from ..errors import RateLimited, UnsupportedDocument

#: How often a sweep may run at most (each upload, and page requests, ask for one).
SWEEP_EVERY_S = 15.0


class PartNames:
    """Reads a multipart body's part headers as it streams through (python-multipart, the parser Gradio uses) and
    raises UnsupportedDocument at the first file whose name has an extension not in `extensions`: before the chunk
    that carries that part reaches Gradio."""

    def __init__(self, content_type: str, extensions: Sequence[str]) -> None:
        _, params = parse_options_header(content_type)
        boundary = params.get(b"boundary")
        self.extensions = tuple(e.lower() for e in extensions)
        self._field = b""
        self._value = b""
        self._names: list[str] = []
        self._parser = MultipartParser(boundary, {
            "on_header_field": self._on_field, "on_header_value": self._on_value, "on_header_end": self._on_end,
        }) if boundary else None

    def feed(self, chunk: bytes) -> None:
        if self._parser is None or not chunk:
            return  # no boundary: Gradio refuses the body itself
        self._parser.write(chunk)
        for name in self._names:
            if not name.lower().endswith(self.extensions):
                shown = Path(name.replace("\\", "/")).name[:80]
                raise UnsupportedDocument(f"{shown}: the page takes {', '.join(self.extensions)} files only.")
        self._names.clear()

    def _on_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def _on_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def _on_end(self) -> None:
        if self._field.lower() == b"content-disposition":
            _, params = parse_options_header(self._value)
            filename = params.get(b"filename")
            if filename is not None:
                self._names.append(filename.decode("utf-8", "replace"))
        self._field, self._value = b"", b""


@dataclass
class _Upload:
    path: str
    address: str
    size: int
    at: float


class PageUploads:
    """The page's stored uploads by address, their budgets and their sweep. Thread-safe."""

    def __init__(self, extensions: Sequence[str], per_address: int, total: int, ttl_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.extensions = tuple(sorted({e.lower() for e in extensions}))
        self.per_address = per_address
        self.total = total
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._uploads: list[_Upload] = []  # oldest first
        #: Bytes of uploads under way per address (checked, not yet stored): eight at once must not each find
        #: the budget free.
        self._arriving: dict[str, int] = {}
        self._last_sweep = 0.0

    def check(self, address: str, incoming: int) -> None:
        """Reserve `incoming` bytes for an upload from `address` (`done` gives them back once it is stored or
        failed), or raise RateLimited when they would take it over its budget: the wait is until enough of its
        oldest uploads are swept."""
        self.sweep(force=True)  # what has had its time goes first: the wait said below is then the real one
        with self._lock:
            mine = [u for u in self._uploads if u.address == address]
            held = sum(u.size for u in mine) + self._arriving.get(address, 0)
            if held + incoming <= self.per_address:
                self._arriving[address] = self._arriving.get(address, 0) + incoming
                return
            if incoming > self.per_address:
                until = self._clock()  # never fits: said by the size cap (413), not here
            else:
                freed, until = 0, self._clock()
                for upload in mine:
                    freed += upload.size
                    until = upload.at + self.ttl_s
                    if held - freed + incoming <= self.per_address:
                        break
            wait = max(1, math.ceil(until - self._clock()))
        raise RateLimited(f"Too many uploads kept for your address: {held} bytes of {self.per_address} allowed on "
                          f"the server at once; retry in {wait} s, when the oldest are deleted.", wait)

    def done(self, address: str, incoming: int) -> None:
        """The upload `check` reserved for has ended (stored: `record` counts it now; or refused)."""
        with self._lock:
            left = self._arriving.get(address, 0) - incoming
            if left > 0:
                self._arriving[address] = left
            else:
                self._arriving.pop(address, None)

    def record(self, address: str, paths: Sequence[str], size: int) -> None:
        """Gradio stored `paths` (one upload's files, `size` bytes of body in all) for `address`."""
        now = self._clock()
        share = size // max(1, len(paths))
        with self._lock:
            # The same content uploaded again lands on the same path (Gradio names its folder by the hash): the
            # newer upload's time counts, or the older one's sweep would delete the file the newer one names.
            fresh = set(paths)
            self._uploads = [u for u in self._uploads if u.path not in fresh]
            self._uploads.extend(_Upload(p, address, share, now) for p in paths)
        self.sweep(force=True)

    def held(self, address: str) -> int:
        with self._lock:
            return sum(u.size for u in self._uploads if u.address == address)

    def stored(self) -> int:
        with self._lock:
            return sum(u.size for u in self._uploads)

    def sweep(self, force: bool = False) -> int:
        """Delete the uploads past `ttl_s`, then the oldest while all of them are over `total`. At most every
        SWEEP_EVERY_S unless `force`. Returns how many files were deleted."""
        now = self._clock()
        with self._lock:
            if not force and now - self._last_sweep < SWEEP_EVERY_S:
                return 0
            self._last_sweep = now
            expired = [u for u in self._uploads if now - u.at >= self.ttl_s]
            kept = [u for u in self._uploads if now - u.at < self.ttl_s]
            total = sum(u.size for u in kept)
            while kept and total > self.total:
                total -= kept[0].size
                expired.append(kept.pop(0))
            self._uploads = kept
        for upload in expired:
            _remove(upload.path)
        return len(expired)


def _remove(path: str) -> None:
    """An upload's file, and its folder (Gradio makes one per file, named by its hash) once empty."""
    try:
        os.unlink(path)
    except OSError:
        pass
    try:
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass  # not empty (the same file uploaded again) or already gone
