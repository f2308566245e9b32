"""One Serve replica: one TranslationService (backbone loaded once per replica process), multiplexed by pair.

Ray's `serve.multiplexed` keeps an LRU of "models" per replica and tells the router which model ids a replica
holds, so requests for a pair go where its adapter already is. Its weak spot: it evicts a model with no regard to
requests still using it. So the multiplexed model here is only a `PairHandle`, a light token that says "this
replica has warmed this pair". When Ray evicts one, the handle is marked released and nothing is detached: the
adapter's lifetime stays with our AdapterCache, which never detaches an adapter under a lease (invariant 3) and
evicts by its own LRU when it needs the slot. Ray's capacity defaults to slots + pinned so its routing view
mirrors the cache.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from dataclasses import asdict
from typing import Any, Callable

from ..adapters.request import Pair
from ..errors import TranslationError
from .settings import GroupSpec, ServeSettings, settings_from_args
from .transport import error_payload

log = logging.getLogger(__name__)

#: How long a replica's constructor waits for its service's warm-up (the detector's helper and the first requests
#: take seconds; this bounds a helper that never comes up).
READY_TIMEOUT_S = 600.0


class PairHandle:
    """What Ray's multiplexer holds for one pair on one replica."""

    def __init__(self, key: str, on_release: Callable[[str], None]) -> None:
        self.key = key
        self.released = False
        self._on_release = on_release

    def __del__(self) -> None:
        # Ray's multiplexer calls __del__ explicitly on LRU eviction (then the GC may call it again): idempotent.
        if not self.released:
            self.released = True
            try:
                self._on_release(self.key)
            except Exception:  # never raise out of a finaliser
                log.exception("release hook for %s failed", self.key)


class TranslatorReplica:
    """The replica class; `app.build_application` turns it into one Serve deployment per group."""

    def __init__(self, settings: dict[str, Any], group: str) -> None:
        from ray import serve

        self.settings: ServeSettings = settings_from_args(settings)
        self.group: GroupSpec = self.settings.group(group)
        cfg = self.settings.replica_config(self.group)
        self.service = self._build_service(cfg)
        # Serve routes to a replica once its constructor returns: return only when the first request of every
        # kind runs at steady speed here (service.warmup), so a replica that is RUNNING is a warm one.
        if not self.service.wait_ready(READY_TIMEOUT_S):
            log.warning("replica of %s not warm after %.0f s; serving anyway", group, READY_TIMEOUT_S)
        ctx = serve.get_replica_context()
        self.replica_id = f"{self.group.name}#{_replica_unique_id(ctx)}"
        self.capacity = self.group.max_models_per_replica or (cfg.cache.slots + len(cfg.cache.pinned))
        #: The last evictions by Ray, with what our cache held for that pair at that moment (shown by info()).
        self.ray_evictions: deque[dict[str, Any]] = deque(maxlen=100)
        self._evict_lock = threading.Lock()

        # A plain function (not a bound method), so Ray keeps its multiplex state on this closure and the
        # capacity can come from the group's settings at run time.
        async def load_pair(pair_key: str) -> PairHandle:
            await asyncio.to_thread(self._warm, pair_key)
            return PairHandle(pair_key, self._on_ray_evict)

        self._load_fn = load_pair
        self._load_pair = serve.multiplexed(max_num_models_per_replica=self.capacity)(load_pair)
        log.info("replica %s ready: pinned %s, %d slots, Ray capacity %d", self.replica_id, cfg.cache.pinned,
                 cfg.cache.slots, self.capacity)

    def _build_service(self, cfg: Any) -> Any:
        """One service per replica process (a subclass may wrap it, e.g. tests that hold a generate open)."""
        from ..service.translation import get_service

        return get_service(cfg)

    # ------------------------------------------------------------------ multiplexing

    def _warm(self, pair_key: str) -> None:
        """Attach the adapters of the pair's route through the cache (a lease taken and released), so the
        requests Ray routes here for this pair find them attached; the cache decides what makes room.

        A pair that cannot be served is not an error here: the request itself raises the typed error next.
        """
        try:
            pair = Pair.parse(pair_key)
            plan = self.service.plan(pair.src, pair.tgt)
            with self.service.cache.lease([hop.adapter for hop in plan.hops]):
                pass
        except TranslationError as exc:
            log.info("warming %s on %s: %s", pair_key, self.replica_id, exc.message)

    def _on_ray_evict(self, pair_key: str) -> None:
        """Ray dropped the handle: record it, detach nothing (the cache owns adapter lifetime)."""
        resident = {r.key: {"slot": r.slot, "pinned": r.pinned, "leases": r.leases}
                    for r in self.service.cache.stats().resident}
        with self._evict_lock:
            self.ray_evictions.append({"pair": pair_key, "at": time.time(), "cache": resident.get(pair_key)})
        log.info("Ray evicted %s on %s; cache keeps it until its own LRU needs the slot (leases respected)",
                 pair_key, self.replica_id)

    def _ray_models(self) -> list[str]:
        wrapper = getattr(self._load_fn, "__serve_multiplex_wrapper", None)
        return list(wrapper.models.keys()) if wrapper is not None else []

    async def _pair_for_request(self) -> None:
        from ray import serve

        key = serve.get_multiplexed_model_id()
        if key:
            await self._load_pair(key)

    # ------------------------------------------------------------------ calls (through deployment handles)

    async def translate(self, texts: list[str], src: str, tgt: str, alternatives: int = 0,
                        glossary: Any = None, context: str | None = None) -> dict[str, Any]:
        try:
            await self._pair_for_request()
            results = await asyncio.to_thread(self.service.translate_batch, texts, src, tgt,
                                              alternatives=alternatives, glossary=glossary, context=context)
        except TranslationError as exc:
            return self._reply(error=error_payload(exc))
        return self._reply(results=[_result_dict(r) for r in results])

    async def translate_segments(self, segments: list[str], src: str, tgt: str,
                                 glossary: Any = None, context: str | None = None) -> dict[str, Any]:
        origins: dict[str, str] = {}  # where each segment came from, and how sure the model was: sent back
        try:
            await self._pair_for_request()
            texts = await asyncio.to_thread(self.service.translate_segments, segments, src, tgt, None, glossary,
                                            None, context, origins)
        except TranslationError as exc:
            return self._reply(error=error_payload(exc))
        return self._reply(texts=texts, origins=origins)

    async def correct(self, text: str, src: str, tgt: str, translation: str, context: str | None = None,
                      machine: str | None = None, who: str | None = None) -> dict[str, Any]:
        """A correction into the store this replica shares with the others: each answers it from its next
        look-up of the pair."""
        try:
            result = await asyncio.to_thread(self.service.correct, text, src, tgt, translation, context, machine,
                                             who)
        except TranslationError as exc:
            return self._reply(error=error_payload(exc))
        return self._reply(result=result)

    async def detect(self, texts: list[str], top: int = 3) -> dict[str, Any]:
        try:
            found = [await asyncio.to_thread(self.service.detect, t, top) for t in texts]
        except TranslationError as exc:
            return self._reply(error=error_payload(exc))
        return self._reply(detections=[[asdict(d) for d in ds] for ds in found])

    async def languages(self) -> dict[str, Any]:
        infos = await asyncio.to_thread(self.service.languages)
        return self._reply(languages=[asdict(i) for i in infos])

    async def status(self) -> dict[str, Any]:
        return self._reply(status=await asyncio.to_thread(self.service.status))

    async def admin(self, action: str, pair: str | None = None, data: bytes = b"",
                    filename: str = "") -> dict[str, Any]:
        """rescan / pin / unpin / unload / import_memory / export_memory on this replica (Serve handles reach one replica per
        call)."""
        try:
            if action == "import_memory":
                result = await asyncio.to_thread(self.service.import_memory, data, filename, pair)
                return self._reply(result=result)
            if action == "export_memory":
                return self._reply(result=await asyncio.to_thread(self.service.export_memory, pair))
            if action == "rescan":
                await asyncio.to_thread(self.service.rescan)
                return self._reply(changed=True)
            if action in ("pin", "unpin", "unload"):
                changed = await asyncio.to_thread(getattr(self.service, action), pair)
                return self._reply(changed=bool(changed))
        except TranslationError as exc:
            return self._reply(error=error_payload(exc))
        raise ValueError(f"unknown admin action {action!r}")

    async def info(self) -> dict[str, Any]:
        """Where this replica runs and what it holds: Ray's multiplexed ids and our cache's residents."""
        import ray

        from ..text import detect

        stats = self.service.cache.stats()
        with self._evict_lock:
            evictions = list(self.ray_evictions)
        return self._reply(
            pid=os.getpid(), node_id=ray.get_runtime_context().get_node_id(),
            actor_name=ray.get_runtime_context().get_actor_name(), capacity=self.capacity,
            ray_models=self._ray_models(), ray_evictions=evictions,
            cache={"resident": [asdict(r) for r in stats.resident], "lru_order": self.service.cache.lru_order(),
                   "pinned": self.service.cache.pinned(), "slots": self.service.cfg.cache.slots,
                   "disk_loads": stats.disk_loads, "evictions": stats.evictions},
            backbone_loads=_backbone_loads(),
            # "off" where the ingress never asks this group to detect (routing.detect), else whether it is loaded
            # (it loads at start with model.warmup, else on the first detection).
            detector="off" if not self.service.cfg.routing.detect else "ready" if detect.ready() else "not loaded")

    def _reply(self, **payload: Any) -> dict[str, Any]:
        payload["replica"] = self.replica_id
        payload["group"] = self.group.name
        return payload


def _result_dict(result: Any) -> dict[str, Any]:
    out = asdict(result)
    out.pop("route_label", None)
    return out


def _replica_unique_id(ctx: Any) -> str:
    rid = getattr(ctx, "replica_id", None)
    unique = getattr(rid, "unique_id", None)
    return str(unique or getattr(ctx, "replica_tag", "") or os.getpid())


def _backbone_loads() -> int:
    from ..runtime import backbone

    return backbone.LOAD_COUNT
