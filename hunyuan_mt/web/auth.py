"""Who may call the REST API, how often, and with how much text.

LibreTranslate-style access control: optional API keys, a per-key (or per-address when keys are off) rate limit
that answers 429 with Retry-After, a per-request character limit, and a separate admin key for admin routes.
Everything raises typed errors; the API edge turns them into HTTP responses.
"""

from __future__ import annotations

import hmac
import math
import threading
import time
from collections import deque
from typing import Callable

from cachetools import TTLCache

from ..config import LimitsConfig, ServerConfig
from ..errors import InvalidInput, RateLimited, Unauthorized

#: Seconds of history the sliding window keeps.
WINDOW_S = 60.0
#: Distinct callers tracked at once; an idle caller's history expires after one window anyway.
MAX_TRACKED_CALLERS = 50_000


def _matches(given: str | None, expected: str) -> bool:
    # Constant-time so that response timing does not leak how much of a key was right.
    return given is not None and hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


class RateLimiter:
    """Sliding-window limit: at most `per_min` calls per identity in any 60 s window."""

    def __init__(self, per_min: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_min = per_min
        self._clock = clock
        self._lock = threading.Lock()
        self._calls: TTLCache[str, deque[float]] = TTLCache(MAX_TRACKED_CALLERS, WINDOW_S, timer=clock)

    def hit(self, identity: str) -> None:
        """Record one call, or raise RateLimited with the seconds until the oldest call leaves the window."""
        if self.per_min <= 0:
            return
        now = self._clock()
        with self._lock:
            calls = self._calls.get(identity)
            if calls is None:
                calls = deque()
            while calls and calls[0] <= now - WINDOW_S:
                calls.popleft()
            if len(calls) >= self.per_min:
                retry_after = max(1, math.ceil(calls[0] + WINDOW_S - now))
                self._calls[identity] = calls
                raise RateLimited(
                    f"Too many requests: {self.per_min} per minute allowed; retry in {retry_after} s.", retry_after
                )
            calls.append(now)
            # Re-inserting refreshes the entry's TTL, so an active caller's history is not dropped mid-window.
            self._calls[identity] = calls


class AccessPolicy:
    """API keys, rate limits, character limits and the admin key, from `server` and `limits` settings."""

    def __init__(self, server: ServerConfig, limits: LimitsConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api_keys = list(server.api_keys)
        self.admin_key = server.admin_key
        self.max_chars = min(limits.max_chars, server.char_limit) if server.char_limit > 0 else limits.max_chars
        self.max_batch_items = limits.max_batch_items
        self.limiter = RateLimiter(server.rate_limit_per_min, clock)

    @property
    def keys_required(self) -> bool:
        return bool(self.api_keys)

    def authorize(self, api_key: str | None, client: str) -> str:
        """Check the key and count the call against its rate limit. Returns the identity that was charged."""
        if self.api_keys:
            if not api_key:
                raise Unauthorized("Missing API key: pass api_key (or an 'Authorization: Bearer' header).")
            if not any(_matches(api_key, key) for key in self.api_keys):
                raise Unauthorized("Invalid API key.")
            identity = f"key:{api_key}"
        else:
            identity = f"addr:{client}"
        self.limiter.hit(identity)
        return identity

    def check_chars(self, texts: list[str]) -> None:
        """The LibreTranslate character limit: the whole request, all items of a batch together. A 400 in
        LibreTranslate's words, as its clients expect (they split the text and retry)."""
        if len(texts) > self.max_batch_items:
            raise InvalidInput(f"Invalid request: request ({len(texts)} texts) exceeds text limit "
                               f"({self.max_batch_items} texts)")
        total = sum(len(t) for t in texts)
        if total > self.max_chars:
            raise InvalidInput(f"Invalid request: request ({total} characters) exceeds text limit "
                               f"({self.max_chars} characters)")

    def check_admin(self, given: str | None) -> None:
        if self.admin_key is None:
            raise Unauthorized("Admin routes are disabled: the server has no admin key (server.admin_key).")
        if not given:
            raise Unauthorized("Missing admin key: send it in the X-Admin-Key header.")
        if not _matches(given, self.admin_key):
            raise Unauthorized("Invalid admin key.")
