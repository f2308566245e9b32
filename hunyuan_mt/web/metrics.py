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

    def collect(self) -> Iterable[Metric]:
        status = self.service.status()
        backbone = status.get("backbone", {}) or {}
        info = GaugeMetricFamily("hmt_backbone_info", "The loaded backbone (value is always 1).",
                                 labels=["name", "arch", "device", "dtype"])
        info.add_metric([str(backbone.get("name", "")), str(backbone.get("arch", "")),
                         str(backbone.get("device", "")), str(backbone.get("dtype", ""))], 1.0)
        yield info

        cache = status.get("cache", {}) or {}
        events = CounterMetricFamily("hmt_adapter_cache_events", "Adapter cache events since start.",
                                     labels=["event"])
        for event in ("hits", "pinned_hits", "ram_hits", "disk_loads", "misses", "evictions", "failures"):
            value = _num(cache.get(event))
            if value is not None:
                events.add_metric([event], value)
        yield events
        load = GaugeMetricFamily("hmt_adapter_load_ms", "Adapter load time percentiles (ms).", labels=["quantile"])
        for key, quantile in (("load_ms_p50", "0.5"), ("load_ms_p95", "0.95")):
            value = _num(cache.get(key))
            if value is not None:
                load.add_metric([quantile], value)
        yield load

        resident = cache.get("resident", []) or []
        adapters = GaugeMetricFamily("hmt_resident_adapters", "Adapters attached to the backbone.",
                                     labels=["adapter", "state"])
        for entry in resident:
            state = "pinned" if entry.get("pinned") else "slot"
            adapters.add_metric([str(entry.get("key")), state], 1.0)
        for key in cache.get("ram_tier", []) or []:
            adapters.add_metric([str(key), "ram"], 1.0)
        yield adapters
        leases = GaugeMetricFamily("hmt_adapter_leases", "Live leases (in-flight rows) per adapter.",
                                   labels=["adapter"])
        for entry in resident:
            leases.add_metric([str(entry.get("key"))], float(entry.get("leases", 0) or 0))
        yield leases

        memory = status.get("memory", {}) or {}
        mem = GaugeMetricFamily("hmt_memory_bytes", "Process and accelerator memory.", labels=["kind"])
        for key in ("rss_bytes", "gpu_allocated_bytes", "gpu_reserved_bytes", "gpu_total_bytes"):
            value = _num(memory.get(key))
            if value is not None:
                mem.add_metric([key.removesuffix("_bytes")], value)
        yield mem
        light = _num(memory.get("light_mode"))
        if light is None and isinstance(memory.get("light_mode"), bool):
            light = 1.0 if memory["light_mode"] else 0.0
        if light is not None:
            yield GaugeMetricFamily("hmt_light_mode", "1 while the memory-pressure light mode is on.", value=light)

        latency = status.get("latency_ms", {}) or {}
        lat = GaugeMetricFamily("hmt_translation_latency_ms", "Recent translation latency percentiles (ms).",
                                labels=["quantile"])
        for key, quantile in (("p50", "0.5"), ("p95", "0.95")):
            value = _num(latency.get(key))
            if value is not None:
                lat.add_metric([quantile], value)
        yield lat


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

    def observe_translation(self, source: str, target: str, route_kind: str, seconds: float, front: str) -> None:
        pair = f"{source}2{target}"
        self.translations.labels(pair, route_kind, front).inc()
        self.translation_seconds.labels(pair).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
