"""Prometheus metrics for `/metrics`.

Two sources, both only read here:
- `ServiceCollector` turns `service.status()` (counted in the cache, engine and memory monitor, where the events
  happen) into gauges and counters at scrape time;
- `WebMetrics` holds the HTTP edge's own counters (requests per route and status, translations per pair and their
  latency), which are events that happen in the web layer.

Each app gets its own `CollectorRegistry`, so several apps in one process (tests) do not collide.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _HasStatus(Protocol):
    def status(self) -> dict[str, Any]: ...


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class ServiceCollector(Collector):
    """Reads `service.status()` on every scrape; holds no counters of its own."""

    def __init__(self, service: _HasStatus) -> None:
        self.service = service

    def describe(self) -> Iterable[Metric]:
        # Without it the registry would collect once when it is registered, i.e. read the service's status while
        # the app is being built: behind Ray Serve that waits for replicas that may not be up yet.
        return []

    def collect(self) -> Iterable[Metric]:
        status = self.service.status()
        backbone = status.get("backbone") or {}
        labels = ["name", "arch", "device", "dtype", "quantization", "int8_kernel", "kv_cache"]
        info = GaugeMetricFamily("hmt_backbone_info", "The loaded backbone (value is always 1).", labels=labels)
        info.add_metric([str(backbone.get(k, "")) for k in labels], 1.0)
        yield info

        cache = status.get("cache") or {}
        events = CounterMetricFamily("hmt_adapter_cache_events", "Adapter cache events since start.",
                                     labels=["event"])
        for event in ("hits", "pinned_hits", "ram_hits", "disk_loads", "pin_loads", "attaches", "grows",
                      "evictions", "failures", "busy", "slot_waits"):
            value = _num(cache.get(event))
            if value is not None:
                events.add_metric([event], value)
        yield events
        yield from _gauge("hmt_adapter_cache_hit_rate", "Share of adapter lookups served by an attached adapter.",
                          cache.get("hit_rate"))
        yield from _gauge("hmt_adapter_slots", "Non-pinned adapter slots.", cache.get("slots"))
        timing = GaugeMetricFamily("hmt_adapter_load_ms", "Adapter load and attach time percentiles (ms).",
                                   labels=["stage", "quantile"])
        for key, labels in (("load_ms_p50", ["load", "0.5"]), ("load_ms_p95", ["load", "0.95"]),
                            ("attach_ms_p50", ["attach", "0.5"])):
            value = _num(cache.get(key))
            if value is not None:
                timing.add_metric(labels, value)
        yield timing

        resident = cache.get("resident") or []
        adapters = GaugeMetricFamily("hmt_resident_adapters", "Adapters attached (slot, pinned) or in the RAM tier.",
                                     labels=["adapter", "state"])
        for entry in resident:
            adapters.add_metric([str(entry.get("key")), "pinned" if entry.get("pinned") else "slot"], 1.0)
        for key in cache.get("ram_tier") or []:
            adapters.add_metric([str(key), "ram"], 1.0)
        yield adapters
        leases = GaugeMetricFamily("hmt_adapter_leases", "Live leases (in-flight rows) per attached adapter.",
                                   labels=["adapter"])
        for entry in resident:
            leases.add_metric([str(entry.get("key"))], float(entry.get("leases") or 0))
        yield leases
        registered = GaugeMetricFamily("hmt_adapters_registered", "Adapter folders found by the last scan.",
                                       labels=["usable"])
        infos = cache.get("registered") or []
        registered.add_metric(["true"], float(sum(1 for i in infos if i.get("usable"))))
        registered.add_metric(["false"], float(sum(1 for i in infos if not i.get("usable"))))
        yield registered

        memory = status.get("memory") or {}
        mem = GaugeMetricFamily("hmt_memory_bytes", "Process and accelerator memory.", labels=["kind"])
        if _num(memory.get("rss_bytes")) is not None:
            mem.add_metric(["rss"], float(memory["rss_bytes"]))
        for key, value in (memory.get("gpu") or {}).items():
            if _num(value) is not None:
                mem.add_metric([f"gpu_{key.removesuffix('_bytes')}"], float(value))
        yield mem
        yield from _gauge("hmt_memory_used_fraction", "Fraction of the watched memory in use (GPU, else host).",
                          memory.get("used_fraction"))
        if "mode" in memory:
            yield GaugeMetricFamily("hmt_light_mode", "1 while the memory-pressure light mode is on.",
                                    value=1.0 if memory.get("mode") == "light" else 0.0)
        if _num(memory.get("transitions")) is not None:
            yield CounterMetricFamily("hmt_light_mode_transitions", "Entries into and exits from light mode.",
                                      value=float(memory["transitions"]))

        engine = status.get("engine") or {}
        for key, help_text in (("batches", "Forward passes (prefills, decode steps and whole batches)."),
                               ("prefills", "Prefill forwards (rows joining the running batch)."),
                               ("decode_steps", "Decode steps over the running batch."),
                               ("rows", "Rows answered."),
                               ("preempted", "Rows sent back to the queue to make room (out of memory)."),
                               ("oom_splits", "Forwards split after an out-of-memory error."),
                               ("oom_failures", "Single rows that still did not fit."),
                               ("loops_cut", "Rows stopped in a repetition loop and cut to one copy of it."),
                               ("length_capped", "Rows that reached the cap relative to their source without "
                                                 "ending."),
                               ("cancelled", "Rows cancelled (their client went away, their job was cancelled)."),
                               ("cancelled_running", "Cancelled rows that left the running batch mid-decode."),
                               ("yielded", "Document rows sent back to the queue to make room for interactive "
                                           "rows.")):
            if _num(engine.get(key)) is not None:
                yield CounterMetricFamily(f"hmt_engine_{key}", help_text, value=float(engine[key]))
        yield from _gauge("hmt_engine_queued_rows", "Rows waiting to join the running batch.", engine.get("queued"))
        yield from _gauge("hmt_engine_running_rows", "Rows in the running batch.", engine.get("running"))
        yield from _gauge("hmt_engine_prefilling_rows", "Rows of a prefill under way (a long prompt is read a piece "
                          "a decode step).", engine.get("prefilling"))
        yield from _gauge("hmt_engine_mean_batch_rows", "Mean rows per decode step since start.",
                          engine.get("mean_batch_rows"))
        gen = GaugeMetricFamily("hmt_engine_ms", "Engine time percentiles (ms).", labels=["stage", "quantile"])
        for stage in ("generate", "queue"):
            for q, quantile in (("p50", "0.5"), ("p95", "0.95")):
                value = _num(engine.get(f"{stage}_ms_{q}"))
                if value is not None:
                    gen.add_metric([stage, quantile], value)
        yield gen

        latency = status.get("latency") or {}
        lat = GaugeMetricFamily("hmt_request_latency_ms", "Recent translation request latency percentiles (ms).",
                                labels=["quantile"])
        for q, quantile in (("p50_ms", "0.5"), ("p95_ms", "0.95")):
            value = _num(latency.get(q))
            if value is not None:
                lat.add_metric([quantile], value)
        yield lat
        counts = status.get("counts") or {}
        for key in ("requests", "segments", "characters"):
            if _num(counts.get(key)) is not None:
                yield CounterMetricFamily(f"hmt_service_{key}", f"{key.capitalize()} translated by the service.",
                                          value=float(counts[key]))


def _gauge(name: str, help_text: str, value: Any) -> Iterable[Metric]:
    number = _num(value)
    if number is not None:
        yield GaugeMetricFamily(name, help_text, value=number)


class WebMetrics:
    """Counters owned by the web edge, registered in a per-app registry together with the service collector."""

    def __init__(self, service: _HasStatus) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(ServiceCollector(service))
        self.http_requests = Counter("hmt_http_requests", "HTTP requests by route, method and status.",
                                     ["route", "method", "status"], registry=self.registry)
        self.translations = Counter("hmt_translations", "Translations served, by pair, route kind and front.",
                                    ["pair", "route_kind", "front"], registry=self.registry)
        self.translation_seconds = Histogram("hmt_translation_seconds", "End-to-end translation latency by pair.",
                                             ["pair"], buckets=_LATENCY_BUCKETS, registry=self.registry)

        self.cancelled_requests = Counter("hmt_cancelled_requests",
                                          "Requests whose client went away before the answer, by front.",
                                          ["front"], registry=self.registry)

    def count_cancelled(self, front: str) -> None:
        self.cancelled_requests.labels(front).inc()

    def observe_translation(self, source: str, target: str, route_kind: str, seconds: float, front: str) -> None:
        pair = f"{source}2{target}"
        self.translations.labels(pair, route_kind, front).inc()
        self.translation_seconds.labels(pair).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestCounter:
    """Counts each HTTP response by route, method and status (`hmt_http_requests`), as plain ASGI.

    Starlette's `@app.middleware("http")` (BaseHTTPMiddleware) runs every request through a task group and memory
    streams of its own; under 16 clients that event-loop work competes for the GIL with the decode loop, whose
    every eager tensor call gives the GIL up (measured: 6 small tensor calls took 34 µs alone and 27 ms beside one
    busy Python thread). This reads the status from the response's first message instead. The route is the
    router's match (FastAPI leaves it in the scope); the UI's own polling is left out so it does not drown the
    API's numbers."""

    def __init__(self, app: ASGIApp, counter: Counter) -> None:
        self.app = app
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: int | None = None

        async def counted_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counted_send)
        finally:
            path = getattr(scope.get("route"), "path", None)
            if path is None:
                path = "/ui" if scope.get("path", "").startswith("/ui") else "unmatched"
            if status is not None and path != "/ui":
                self.counter.labels(path, scope.get("method", ""), str(status)).inc()
