"""Who may call the server, how often, and with how much text: one policy for every way in.

LibreTranslate-style access control: optional API keys, a per-caller rate limit and character budget that answer
429 with Retry-After, a per-request character limit, an admin key for admin routes, and an optional status key for
the state that reveals internals. A caller is an API key on REST when keys are on, else the client's address; the
web page's calls are always counted per address, under the same limits (`page_caller`). REST, the OpenAI endpoint,
the page's events, its uploads and both kinds of download ask this one object. Everything raises typed errors; the
edges (REST, the page) render them.
"""

from __future__ import annotations

import hmac
import math
import threading
import time
from collections import deque
from typing import Callable

from cachetools import TTLCache

from ..scheduler.callers import KEY_HASH, Caller, key_hash
from ..config import LimitsConfig, ServerConfig, SharesConfig
from ..errors import InvalidInput, RateLimited, Unauthorized
from ..scheduler.shares import RefusalPace, Share

#: Worker threads for blocking service calls from REST routes. Their own pool, apart from the one the Gradio
#: queue uses, so that a flood of slow REST calls cannot starve the UI (and the other way round).
REST_THREADS = 64

#: Seconds of history the sliding windows keep.
WINDOW_S = 60.0
#: Distinct callers tracked at once; an idle caller's history expires after one window anyway.
MAX_TRACKED_CALLERS = 50_000


def _matches(given: str | None, expected: str) -> bool:
    # Constant-time so that response timing does not leak how much of a key was right.
    return given is not None and hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


class SlidingWindow:
    """At most `capacity` units per identity in any 60 s window: calls (one unit each) or characters."""

    def __init__(self, capacity: int, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self.what = what  # "requests" or "characters", for the message
        self._clock = clock
        self._lock = threading.Lock()
        # identity → (time, units) spent in the window, oldest first
        self._spent: TTLCache[str, deque[tuple[float, int]]] = TTLCache(MAX_TRACKED_CALLERS, WINDOW_S, timer=clock)

    def hit(self, identity: str, units: int = 1) -> None:
        """Record `units`, or raise RateLimited with the seconds until enough of the window has passed."""
        if self.capacity <= 0 or units <= 0:
            return
        if units > self.capacity:
            # Waiting would not help: say so instead of a Retry-After that can never succeed.
            raise InvalidInput(f"Invalid request: {units} {self.what} at once exceeds the limit of {self.capacity} "
                               f"{self.what} per minute")
        now = self._clock()
        with self._lock:
            spent = self._spent.get(identity)
            if spent is None:
                spent = deque()
            while spent and spent[0][0] <= now - WINDOW_S:
                spent.popleft()
            used = sum(n for _, n in spent)
            if used + units > self.capacity:
                # The earliest moment enough has left the window for this call to fit.
                freed, until = 0, now
                for stamp, n in spent:
                    freed += n
                    until = stamp
                    if used - freed + units <= self.capacity:
                        break
                retry_after = max(1, math.ceil(until + WINDOW_S - now))
                self._spent[identity] = spent
                raise RateLimited(f"Too many {self.what}: {self.capacity} per minute allowed; retry in "
                                  f"{retry_after} s.", retry_after)
            spent.append((now, units))
            # Re-inserting refreshes the entry's TTL, so an active caller's history is not dropped mid-window.
            self._spent[identity] = spent


class AccessPolicy:
    """API keys, rate and character limits, download ownership, the admin and status keys, from settings.

    One instance serves the REST API and the web page together (`web.server.build_app` makes it), so that a caller
    has one budget whichever door it uses.
    """

    def __init__(self, server: ServerConfig, limits: LimitsConfig, shares: SharesConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api_keys = list(server.api_keys)
        self.admin_key = server.admin_key
        self.status_key = server.status_key
        self.page_login = server.auth is not None
        self.server = server
        self.shares = shares or SharesConfig()
        #: What one caller may hold at once: REST calls at work (on the REST threads), open long polls.
        self.requests = Share(self.shares.requests, "requests at work", pool=REST_THREADS)
        self.long_polls = Share(self.shares.long_polls, "long polls open")
        #: A caller refused again before its wait is over is answered after the rest of it (the edges await it).
        self.pace = RefusalPace()
        self.max_chars = min(limits.max_chars, server.char_limit) if server.char_limit > 0 else limits.max_chars
        self.max_batch_items = limits.max_batch_items
        self.calls = SlidingWindow(server.rate_limit_per_min, "requests", clock)
        self.characters = SlidingWindow(server.chars_per_min, "characters", clock)

    @property
    def keys_required(self) -> bool:
        return bool(self.api_keys)

    @property
    def downloads_owned(self) -> bool:
        """Whether a translated file is fetched only by its uploader: when keys or the page login are on."""
        return self.keys_required or self.page_login

    def authorize(self, api_key: str | None, client: str) -> Caller:
        """A REST call: check the key and count the call against its rate limit. Returns who was charged."""
        if self.api_keys:
            if not api_key:
                raise Unauthorized("Missing API key: pass api_key (or an 'Authorization: Bearer' header).")
            if not any(_matches(api_key, key) for key in self.api_keys):
                raise Unauthorized("Invalid API key.")
            caller = Caller(f"key:{api_key}", client)
        else:
            caller = Caller(f"addr:{client}", client)
        self.calls.hit(caller.identity)
        return caller

    def identify(self, api_key: str | None, client: str) -> Caller:
        """Who a call is charged to when the route itself needs no key (document jobs answer 404, not 403, to a
        missing or wrong one): the key when it is one of the keys, else the address."""
        if self.api_keys and api_key and any(_matches(api_key, key) for key in self.api_keys):
            return Caller(f"key:{api_key}", client)
        return Caller(f"addr:{client}", client)

    @property
    def page_corrections(self) -> bool:
        """Whether the page saves corrections: with suggestions on, unless API keys are on and the page is open
        to anyone (no `--auth`): a correction changes what every key's /translate answers, and the page's visitor
        has shown no key. `server.page_corrections` opens it anyway."""
        if not self.server.suggestions:
            return False
        return not self.keys_required or self.page_login or self.server.page_corrections

    def page_caller(self, client: str) -> Caller:
        """A call from the web page (its events, its uploads): counted per address, under the REST limits. The
        page has no key to show; `--auth` puts it behind a login, and then the address still meters it."""
        caller = Caller(f"addr:{client}", client)
        self.calls.hit(caller.identity)
        return caller

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

    def spend_chars(self, caller: Caller, count: int, context: str | None = None) -> None:
        """Charge `count` characters to the caller's per-minute budget (texts, and documents once read), and a
        request's `context` once: the model reads it like the text."""
        self.characters.hit(caller.identity, count + len(context or ""))

    def may_fetch(self, owner: Caller | None, api_key: str | None, client: str,
                  keyed_by_address: bool = True) -> bool:
        """Whether what `owner` uploaded may be fetched: with the uploader's key, or from its address.

        `keyed_by_address`: whether an upload made with a key may also be fetched from its address. Yes for the
        files `/translate_file` hands out (LibreTranslate's clients fetch `translatedFileUrl` without sending their
        key again); no for document jobs (`/v1/documents` and the page), whose clients send their key on every
        call: there the address fallback let any client behind the same proxy, NAT or share link list, download
        and cancel another key's job (tests/test_access.py). A request that sends a key other than the uploader's
        is refused from any address: the fallback is for clients that send no key at all."""
        if owner is None:
            return True
        if api_key and (_matches(f"key:{api_key}", owner.identity) or _matches(key_hash(api_key), owner.identity)):
            return True  # the key itself, or (a job kept in the store across a restart) its hash
        if owner.identity.startswith(("key:", KEY_HASH)) and (api_key or not keyed_by_address):
            # A keyed upload: another key, or a wrong one, gets nothing from the uploader's address either; only a
            # bare fetch of a `/translate_file` link (LibreTranslate's clients) falls back to the address.
            return False
        return client == owner.address

    def check_admin(self, given: str | None) -> None:
        if self.admin_key is None:
            raise Unauthorized("Admin routes are disabled: the server has no admin key (server.admin_key).")
        if not given:
            raise Unauthorized("Missing admin key: send it in the X-Admin-Key header.")
        if not _matches(given, self.admin_key):
            raise Unauthorized("Invalid admin key.")

    @property
    def status_private(self) -> bool:
        return self.status_key is not None

    def check_status(self, given: str | None) -> None:
        """/metrics, /adapters and the Status tab: open unless `server.status_key` is set; then that key or the
        admin key."""
        if self.status_key is None:
            return
        if not given:
            raise Unauthorized("The status is private on this server: send the status key "
                               "('Authorization: Bearer KEY').")
        if not (_matches(given, self.status_key) or (self.admin_key is not None and _matches(given, self.admin_key))):
            raise Unauthorized("Invalid status key.")


def who(caller: Caller) -> str:
    """A caller as the store records who did something: a key by the first 12 hex digits of its SHA-256 (the key
    itself never goes into the database), an address as it is."""
    if caller.identity.startswith("key:"):
        return "key:" + key_hash(caller.identity[len("key:"):])[len(KEY_HASH):][:12]
    return caller.identity

