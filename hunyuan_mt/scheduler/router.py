"""Route planning: identity, a direct adapter, two hops through the pivot, or the bare backbone.

The router reads the registry's usable pairs at every call (a rescan is visible at once) and never touches the
filesystem or the model: a plan only names adapters, the cache attaches them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Protocol

from ..config import RoutingConfig
from ..errors import AdapterUnusable, UnreachablePair
from ..text.languages import LANGUAGES, normalize_code

if TYPE_CHECKING:
    from ..adapters.request import Pair


class PairSource(Protocol):
    """What the router needs from the registry."""

    def usable_pairs(self) -> Iterable["Pair"]: ...


@dataclass(frozen=True)
class Hop:
    src: str
    tgt: str
    #: The adapter for this hop, or None for the bare backbone ("__base__").
    adapter: "Pair | None"


@dataclass(frozen=True)
class RoutePlan:
    kind: str  # "identity" | "direct" | "pivot" | "base"
    src: str
    tgt: str
    hops: tuple[Hop, ...]

    @property
    def route(self) -> list[str]:
        """["es", "en", "de"] for a pivot, ["en", "es"] for a direct hop, ["en"] for identity."""
        if not self.hops:
            return [self.src]
        return [self.hops[0].src] + [hop.tgt for hop in self.hops]

    @property
    def adapters(self) -> list[str]:
        return [hop.adapter.key for hop in self.hops if hop.adapter is not None]

    @property
    def label(self) -> str:
        return f"{' → '.join(self.route)} ({self.kind})"


def not_available(src: str, tgt: str) -> str:
    """LibreTranslate's sentence for a pair it cannot translate, which its clients and tests compare whole."""
    return (f"{LANGUAGES[tgt].english} ({tgt}) is not available as a target language from "
            f"{LANGUAGES[src].english} ({src})")


class Router:
    def __init__(self, pairs: PairSource, cfg: RoutingConfig) -> None:
        self._pairs = pairs
        self.cfg = cfg
        self.pivot = normalize_code(cfg.pivot)

    def _index(self) -> dict[tuple[str, str], "Pair"]:
        return {(p.src, p.tgt): p for p in self._pairs.usable_pairs()}

    def plan(self, src: str, tgt: str) -> RoutePlan:
        """The route for src → tgt (codes are normalized here too). UnreachablePair lists what src can reach."""
        src, tgt = normalize_code(src), normalize_code(tgt)
        if src == tgt:
            return RoutePlan("identity", src, tgt, ())
        index = self._index()
        direct = index.get((src, tgt))
        if direct is not None:
            return RoutePlan("direct", src, tgt, (Hop(src, tgt, direct),))
        pivot = self.pivot
        first, second = index.get((src, pivot)), index.get((pivot, tgt))
        if pivot not in (src, tgt) and first is not None and second is not None:
            return RoutePlan("pivot", src, tgt, (Hop(src, pivot, first), Hop(pivot, tgt, second)))
        if self.cfg.allow_base:
            return RoutePlan("base", src, tgt, (Hop(src, tgt, None),))
        reachable = self._reachable(src, index)
        sources = [code for code in LANGUAGES if self._reachable(code, index)]
        # With nothing reachable from src, say what this model does translate from (an auto-detected language
        # the model has no adapter for lands here).
        where = ", ".join(reachable) if reachable else \
            f"nothing; this model translates from {', '.join(sources) or 'no language'}"
        broken = self._unusable()
        direct_key = f"{src}2{tgt}"
        if direct_key in broken:
            # The adapter is there but failed validation: its own reason says more than "no route" (and it is the
            # same error a load-time failure gives).
            raise AdapterUnusable(f"Adapter {direct_key} is unusable: {broken[direct_key]}. No other route from "
                                  f"{src} to {tgt}; reachable from {src}: {where}.")
        missing = [direct_key]
        if pivot not in (src, tgt):
            missing += [key for key, have in ((f"{src}2{pivot}", first), (f"{pivot}2{tgt}", second)) if have is None]
        named = [f"{key} (unusable: {broken[key]})" if key in broken else key for key in missing]
        raise UnreachablePair(
            f"No route from {src} to {tgt}: no adapter {named[0]}"
            + (f", and the pivot route through {pivot} lacks {' and '.join(named[1:])}" if len(named) > 1 else "")
            + f"; the bare backbone is not allowed (routing.allow_base). Reachable from {src}: {where}.",
            reachable=reachable,
            short=not_available(src, tgt),
        )

    def _unusable(self) -> dict[str, str]:
        """Pair key → reason for adapters the registry found but refused (an empty dict for other pair sources)."""
        infos = getattr(self._pairs, "infos", None)
        if infos is None:
            return {}
        return {info.key: info.reason or "invalid" for info in infos() if not info.usable}

    def reachable_targets(self, src: str) -> list[str]:
        """Every target src can be translated into (identity excluded), in the language table's order."""
        return self._reachable(normalize_code(src), self._index())

    def _reachable(self, src: str, index: dict[tuple[str, str], "Pair"]) -> list[str]:
        if self.cfg.allow_base:
            return [code for code in LANGUAGES if code != src]
        targets = {t for (s, t) in index if s == src}
        if (src, self.pivot) in index:
            targets |= {t for (s, t) in index if s == self.pivot}
        targets.discard(src)
        return [code for code in LANGUAGES if code in targets]
