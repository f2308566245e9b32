"""Translated documents waiting to be downloaded (`translatedFileUrl`).

Held in memory with a time limit and a size cap, so that no temporary file outlives a request and a forgotten
download cannot fill the disk.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import threading
import time
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import quote

from cachetools import TTLCache

from ..errors import RateLimited
from .auth import Caller

_TOKEN = re.compile(r"^[0-9a-f]{32}$")
_UNSAFE = re.compile(r"[^\w.\- ]+", re.UNICODE)


def safe_filename(name: str, fallback: str = "document") -> str:
    """A download name without directories or characters that break a Content-Disposition header."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = _UNSAFE.sub("_", base).strip(" .")
    return base[:120] or fallback


#: Letters that Unicode's compatibility decomposition (NFKD) does not take apart into an ASCII letter and marks:
#: their usual ASCII spelling ("Größe" is "Grosse", not "Groe").
_ASCII_LETTERS = str.maketrans({
    "ß": "ss", "ẞ": "SS", "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "ø": "o", "Ø": "O", "đ": "d", "Đ": "D",
    "ð": "d", "Ð": "D", "þ": "th", "Þ": "Th", "ł": "l", "Ł": "L", "ı": "i", "ħ": "h", "Ħ": "H", "ŋ": "ng",
    "Ŋ": "NG", "ŧ": "t", "Ŧ": "T", "ſ": "s", "ĸ": "k"})
#: What RFC 5987 lets stand unencoded in an ext-value besides letters and digits (attr-char).
_ATTR_CHARS = "!#$&+-.^_`|~"


def ascii_name(part: str) -> str:
    """`part` spelt in ASCII for a plain `filename=`: accents taken off, ß as ss, quotes and controls out; "" when
    most of its letters have no ASCII spelling (a name in another script)."""
    spelt = unicodedata.normalize("NFKD", part.translate(_ASCII_LETTERS))
    kept = spelt.encode("ascii", "ignore").decode("ascii")
    letters = sum(ch.isalpha() for ch in part)
    if letters and sum(ch.isalpha() for ch in kept) * 2 < letters:
        return ""
    return " ".join(re.sub(r'["\\\x00-\x1f\x7f]', "_", kept).split()).strip(" .")


def attachment(filename: str) -> str:
    """A Content-Disposition for a download (RFC 6266): `filename*` carries the real name, UTF-8 and
    percent-encoded as RFC 5987 says, and a plain `filename` its ASCII spelling for clients that read only that
    one (`curl -OJ` saved the file as "result" without it, and "Größe" as "Groe" when ß was dropped)."""
    first, *rest = filename.split(".")
    # A name in another script keeps its language and extension: "文档.es.docx" is offered as "document.es.docx".
    plain = ".".join([ascii_name(first) or "document", *filter(None, map(ascii_name, rest))])
    return f"attachment; filename=\"{plain}\"; filename*=UTF-8''{quote(filename, safe=_ATTR_CHARS)}"


@dataclass(frozen=True)
class StoredFile:
    data: bytes
    filename: str
    media_type: str
    #: Who uploaded it, when downloads are owned (keys or the page login on); None: whoever has the link.
    owner: Caller | None = None
    #: Whose quota it counts against (DownloadStore.per_caller), owned or not, and when it was stored.
    caller: Any = None
    stored_at: float = 0.0


class DownloadStore:
    """token → translated file, for `ttl_s` seconds; at most `max_files` files and `max_bytes` in all."""

    def __init__(self, ttl_s: float = 900.0, max_files: int = 64, max_bytes: int = 256 * 1024 * 1024,
                 clock: Callable[[], float] = time.monotonic, per_caller: int = 16) -> None:
        self._files: TTLCache[str, StoredFile] = TTLCache(max_files, ttl_s, timer=clock)
        self.max_bytes = max_bytes
        #: Links one caller may hold at once, not yet downloaded: 64 small uploads from one key pushed another
        #: key's link out before its 15 minutes were up; now the flooder is refused, before any work. A link
        #: downloaded once stays downloadable until it expires but no longer counts: a client translating its
        #: files one after the other (upload, download, next) was refused at its 17th for up to 15 minutes.
        self.per_caller = per_caller
        #: Tokens downloaded at least once (GET): they take no share, and they make room first (`_make_room`).
        self._downloaded: set[str] = set()
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()

    def check_quota(self, caller: Any) -> None:
        """RateLimited (429, Retry-After) when `caller` already holds `per_caller` links not yet downloaded."""
        with self._lock:
            self._expire()
            mine = [f.stored_at for token, f in self._files.items()
                    if f.caller == caller and token not in self._downloaded]
            if len(mine) < self.per_caller:
                return
            wait = max(1, math.ceil(min(mine) + self._ttl_s - self._clock()))
        raise RateLimited(f"You hold {len(mine)} translated files waiting to be downloaded, the most one caller "
                          f"may; try again in {wait} s, when the first of them has expired, or once you have "
                          "downloaded one.", wait)

    def put(self, data: bytes, filename: str, media_type: str, owner: Caller | None = None,
            caller: Any = None) -> str:
        token = secrets.token_hex(16)
        with self._lock:
            self._expire()
            self._make_room(len(data))
            self._files[token] = StoredFile(data, safe_filename(filename), media_type, owner, caller, self._clock())
        return token

    def taken(self, token: str) -> None:
        """`token`'s file was downloaded: it no longer counts against its caller's share."""
        with self._lock:
            if token in self._files:
                self._downloaded.add(token)

    def _make_room(self, size: int) -> None:
        """Free a place, and `size` bytes under the byte budget, for one more file: files already downloaded go
        first (their callers have them), then the oldest. A caller that downloads every link at once takes no
        share, so without that order its uploads could push out another caller's link before it was fetched."""
        while self._files and (len(self._files) >= self._files.maxsize
                               or sum(len(f.data) for f in self._files.values()) + size > self.max_bytes):
            done = next((token for token in self._files if token in self._downloaded), None)
            if done is None:
                self._files.popitem()
            else:
                del self._files[done]
        self._downloaded.intersection_update(self._files.keys())

    def _expire(self) -> None:
        self._files.expire()
        self._downloaded.intersection_update(self._files.keys())

    def get(self, token: str) -> StoredFile | None:
        if not _TOKEN.match(token):
            return None
        with self._lock:
            return self._files.get(token)

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._files)


def _where(path: str) -> str:
    """The file a path names, as the file route will open it: symlinks and ".." resolved, so another spelling of an
    owned file (`/proc/self/root/tmp/…`, `/tmp/../tmp/…`) is still that file (tests/test_access.py)."""
    return os.path.realpath(path)


class OwnedPaths:
    """Files the web page handed out (Gradio serves them at /ui/gradio_api/file=PATH) → the addresses that may
    fetch them. Kept as long as Gradio keeps its cached copy (the page's delete_cache), at most `max_files`."""

    def __init__(self, ttl_s: float = 1800.0, max_files: int = 4096, clock: Callable[[], float] = time.monotonic):
        self._owners: TTLCache[str, frozenset[str]] = TTLCache(max_files, ttl_s, timer=clock)
        self._lock = threading.Lock()

    def add(self, path: str, address: str) -> None:
        key = _where(path)
        with self._lock:
            # The same document translated twice lands on the same cached path (Gradio names it by content).
            self._owners[key] = self._owners.get(key, frozenset()) | {address}

    def allowed(self, path: str, address: str) -> bool:
        """False only for a file handed to other addresses; other paths are Gradio's own business."""
        with self._lock:
            owners = self._owners.get(_where(path))
        return owners is None or address in owners
