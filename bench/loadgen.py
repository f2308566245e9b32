"""Closed-loop load: `concurrency` client threads, each sends its next request as soon as the previous answered.

Bounded twice: at most `max_requests` are issued, and no new request is issued after `time_cap_s` (requests in
flight finish and count). Client threads take tickets from one shared counter, so the request stream is consumed
in order whatever the concurrency.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from .workload import Request


@dataclass
class CellResult:
    """One (variant, workload, concurrency) measurement."""
    variant: str
    workload: str
    concurrency: int
    issued: int
    completed: int
    errors: int
    wall_s: float
    qps: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    mean_ms: float | None
    capped_by: str                      # "requests" or "time"
    error_samples: list[str] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)   # hits, disk_loads, ... (deltas over the cell)
    hit_rate: float | None = None
    rss_mb_after: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def closed_loop(call: Callable[[Request], object], stream: list[Request], concurrency: int, max_requests: int,
                time_cap_s: float) -> tuple[list[float], list[str], float, int, str]:
    """Run the clients; returns (latencies_ms of successes, error messages, wall seconds, issued, capped_by)."""
    lock = threading.Lock()
    next_ticket = 0
    latencies: list[float] = []
    errors: list[str] = []
    capped = {"by": "requests"}
    start = time.perf_counter()
    deadline = start + time_cap_s

    def client() -> None:
        nonlocal next_ticket
        while True:
            with lock:
                if next_ticket >= max_requests:
                    return
                if time.perf_counter() >= deadline:
                    capped["by"] = "time"
                    return
                ticket = next_ticket
                next_ticket += 1
            req = stream[ticket % len(stream)]
            t0 = time.perf_counter()
            try:
                call(req)
            except Exception as exc:  # noqa: BLE001 - a benchmark records failures, it does not stop on them
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            dt = (time.perf_counter() - t0) * 1000
            with lock:
                latencies.append(dt)

    threads = [threading.Thread(target=client, name=f"client-{i}", daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, errors, time.perf_counter() - start, next_ticket, capped["by"]


def summarize(variant: str, workload: str, concurrency: int, latencies: list[float], errors: list[str],
              wall_s: float, issued: int, capped_by: str) -> CellResult:
    return CellResult(
        variant=variant, workload=workload, concurrency=concurrency, issued=issued, completed=len(latencies),
        errors=len(errors), wall_s=round(wall_s, 3), qps=round(len(latencies) / wall_s, 3) if wall_s > 0 else 0.0,
        p50_ms=_r(percentile(latencies, 50)), p95_ms=_r(percentile(latencies, 95)),
        p99_ms=_r(percentile(latencies, 99)), mean_ms=_r(statistics.fmean(latencies) if latencies else None),
        capped_by=capped_by, error_samples=sorted(set(errors))[:5],
    )


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)
