"""The variant under test: the real TranslationService (router, batching engine, adapter cache with slots, pins
and the RAM tier), called exactly as the REST API calls it."""

from __future__ import annotations

import time
from typing import Any

from .baselines import Variant
from .workload import Request


class Ours(Variant):
    name = "ours"

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.service: Any = None

    def start(self) -> None:
        from hunyuan_mt.service.translation import TranslationService

        self.service = TranslationService(self.cfg)
        self.service.wait_full_speed()

    def translate(self, req: Request) -> str:
        return self.service.translate(req.text, req.src, req.tgt).text

    @property
    def cache(self) -> Any:
        return self.service.cache

    def counters(self) -> dict[str, float]:
        """Per adapter acquisition: hits (pinned or already in a slot), RAM-tier re-attaches, disk loads."""
        s = self.cache.stats()
        hits = s.hits + s.pinned_hits
        lookups = hits + s.ram_hits + s.disk_loads
        return {"lookups": lookups, "hits": hits, "pinned_hits": s.pinned_hits, "ram_hits": s.ram_hits,
                "disk_loads": s.disk_loads, "attaches": s.attaches, "grows": s.grows,
                "evictions": s.evictions, "failures": s.failures, "busy": s.busy}

    def extra(self) -> dict[str, Any]:
        s = self.cache.stats()
        return {"resident": [r.key for r in s.resident], "leases_held": sum(r.leases for r in s.resident),
                "ram_tier": list(s.ram_tier), "load_ms_p50": s.load_ms_p50, "attach_ms_p50": s.attach_ms_p50,
                "engine": self.service.status().get("engine")}

    def close(self) -> None:
        self.service.close()

    def attach_probe(self, probe: dict[str, list[str]]) -> dict[str, Any]:
        """Time `cache.lease([pair])` for a pair read from disk, then again after three other pairs pushed it out
        of the slots into the RAM tier. The cache's own counters confirm which path each lease took."""
        from hunyuan_mt.adapters.request import Pair

        def timed(key: str) -> tuple[float, dict[str, float]]:
            before = self.counters()
            t0 = time.perf_counter()
            with self.cache.lease([Pair.parse(key)]):
                dt = (time.perf_counter() - t0) * 1000
            after = self.counters()
            return dt, {k: after[k] - before[k] for k in ("disk_loads", "ram_hits", "hits")}

        disk, ram, checks = [], [], []
        fillers = probe["fillers"]
        for key in probe["targets"]:
            d_ms, d_how = timed(key)
            for f in fillers:  # as many as there are slots: the LRU pushes `key` out to the RAM tier
                timed(f)
            r_ms, r_how = timed(key)
            if d_how["disk_loads"] == 1:
                disk.append(d_ms)
            if r_how["ram_hits"] == 1:
                ram.append(r_ms)
            checks.append({"pair": key, "first": d_how, "again": r_how, "first_ms": round(d_ms, 2),
                           "again_ms": round(r_ms, 2)})
        disk.sort()
        ram.sort()
        med = (lambda xs: xs[len(xs) // 2] if xs else None)
        return {"disk_ms_median": med(disk), "ram_ms_median": med(ram),
                "ratio": round(med(ram) / med(disk), 3) if disk and ram else None, "samples": checks}
