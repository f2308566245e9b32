"""The first request of every kind, run once before the service says it is ready.

A server whose /health says ok must answer its next request at steady speed. Profiled on the demo (2 cores): the
first auto-detected request after ready took 269 ms against 20 ms steady, 250 ms of it in the detector's helper
reading wordfreq's word lists on first use (the helper now reads them while it loads, see detect.WARM_TEXTS). What
else a first request touches is run here, through the service's own paths, so nothing is left to chance: the
translation memory of every pair, each pinned pair's sentence splitter, masking, tokenizer, the engine's batch path with
the pinned adapter, the auto-detection route (both the narrow and the wide detection), and a pivot route whose
hops are all pinned when the configuration has one. Nothing here loads an adapter that is not pinned: warming
must not fill the LRU slots with pairs nobody asked for.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ..adapters.request import Pair
from ..errors import TranslationError

log = logging.getLogger(__name__)

#: What each warm translation sends: two sentences, so the splitter and the batch path see more than one segment.
WARM_TEXT = "The file was saved. Open the settings to change it."
#: Texts detected once each: a short one (the word-frequency model) and a sentence (lingua alone).
DETECT_TEXTS = ("Hola amigo", "The file was saved to your home folder.")


@dataclass
class WarmupReport:
    """What the warm-up ran, for the start log and /status."""

    seconds: float = 0.0
    #: Kinds of request that ran, in order: "detection", "en2es", "pivot es2en+en2de", ...
    ran: list[str] = field(default_factory=list)
    #: Kinds that did not run, each with why.
    skipped: list[str] = field(default_factory=list)

    def line(self) -> str:
        done = ", ".join(self.ran) or "nothing"
        left = f"; not warmed: {'; '.join(self.skipped)}" if self.skipped else ""
        return f"first request of every kind served in {self.seconds:.1f} s ({done}){left}"


def warm_service(service: Any, detector_timeout_s: float = 300.0) -> WarmupReport:
    """Run the first request of every kind on `service` (a TranslationService). Failures are logged and reported
    as skipped: a pinned adapter that does not load must not keep the server from ever becoming ready."""
    from ..text import detect

    report = WarmupReport()
    t0 = time.perf_counter()
    pinned = [Pair.parse(key) for key in service.cfg.cache.pinned]
    # Every registered pair's memory, not only the pinned ones': reading the demo's shipped memory of one pair
    # (37k entries) took 220 ms of the first en→de request, 180-270 ms against 15-20 ms steady.
    pairs = list(dict.fromkeys([p.key for p in pinned] + sorted(p.key for p in service.registry.usable_pairs())))
    if service.tm.enabled and pairs:
        service.tm.preload(pairs, fuzzy=service.cfg.tm.fuzzy_threshold > 0)
        report.ran.append(f"memories of {len(pairs)} pairs")
    if service.cfg.routing.detect:
        try:
            detect.warm(detector_timeout_s)
            for text in DETECT_TEXTS:
                service.resolve_source(text, "auto")
            report.ran.append("detection")
        except TranslationError as exc:
            report.skipped.append(f"detection ({exc.message})")
    for pair in pinned:
        _translate(service, report, pair.key, pair.src, pair.tgt)
    if pinned:
        _stream(service, report, pinned[0])
    pivot = _pinned_pivot(service, pinned)
    if pivot is None:
        report.skipped.append("pivot (no pivot route runs on pinned adapters only; a pivot route's first request "
                              "loads its unpinned adapter)")
    else:
        _translate(service, report, pivot[0], pivot[1], pivot[2])
    report.seconds = time.perf_counter() - t0
    return report


def _translate(service: Any, report: WarmupReport, kind: str, src: str, tgt: str) -> None:
    try:
        service.translate_batch([WARM_TEXT], src, tgt, _warmup=True)
        report.ran.append(kind)
    except TranslationError as exc:
        report.skipped.append(f"{kind} ({exc.message})")


def _stream(service: Any, report: WarmupReport, pair: Pair) -> None:
    """A streamed text (the page's Text tab, the OpenAI stream): the engine tells a listener after every step and
    the text is rebuilt as it grows, a path translate_batch does not take, so it is run once too. Measured after
    the other kinds of request (bench/first_request.py, compiled step, 3 starts each), the first chat stream sent
    its first piece at 0.18 of the whole with this and without it, later streams at 0.15."""
    try:
        for _ in service.translate_stream(WARM_TEXT, pair.src, pair.tgt, _warmup=True):
            pass
        report.ran.append(f"stream {pair.key}")
    except TranslationError as exc:
        report.skipped.append(f"stream {pair.key} ({exc.message})")


def _pinned_pivot(service: Any, pinned: list[Pair]) -> tuple[str, str, str] | None:
    """(label, src, tgt) of the first pivot route whose every hop is a pinned adapter, or None."""
    keys = {p.key for p in pinned}
    languages = sorted({code for p in pinned for code in (p.src, p.tgt)})
    for src in languages:
        for tgt in languages:
            if src == tgt:
                continue
            try:
                plan = service.plan(src, tgt)
            except TranslationError:
                continue
            adapters = [hop.adapter for hop in plan.hops]
            if plan.kind == "pivot" and all(a is not None and a.key in keys for a in adapters):
                return "pivot " + "+".join(a.key for a in adapters), src, tgt
    return None
