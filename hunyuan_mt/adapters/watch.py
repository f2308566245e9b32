"""Promotions made elsewhere (the CLI's train-adapter --from-corrections, another replica's admin call) reach this
server: the store's record of which version serves each pair is read every `interval` seconds, and a change
rescans the adapters, which swaps the new version in while serving (AdapterCache.rescan)."""

from __future__ import annotations

import logging
import threading
from typing import Callable

from .registry import AdapterRegistry

log = logging.getLogger(__name__)
#: Seconds between two reads of the store's current versions.
WATCH_INTERVAL_S = 2.0


class VersionWatch:
    def __init__(self, current: Callable[[], dict[str, str]], registry: AdapterRegistry,
                 rescan: Callable[[], None], interval: float = WATCH_INTERVAL_S) -> None:
        self._current, self._registry, self._rescan, self._interval = current, registry, rescan, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hmt-adapter-versions", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def serving(self) -> dict[str, str]:
        """pair → the version the registry serves, for the pairs past "v1" (the store's record has only those)."""
        return {i.key: i.version for i in self._registry.infos() if i.version != "v1"}

    def check(self) -> bool:
        """Rescan when the store says other versions serve than the registry does; whether it did."""
        wanted = {pair: version for pair, version in self._current().items() if version != "v1"}
        if wanted == self.serving():
            return False
        log.info("adapter versions changed in the store (%s); swapping them in", wanted)
        self._rescan()
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - a database hiccup must not end the watch; the next read retries
                log.exception("reading the adapter versions failed")
