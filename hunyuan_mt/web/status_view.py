"""The page's Status tab, drawn from `service.status()`: the overview, the decode step, the adapter table, the
cache line and the latency plots (documents counted in the caption, not plotted among short requests). Pure
functions of the status dict; the page (ui.py) only places what they return."""

from __future__ import annotations

import math
import re
import time
from typing import Any

import gradio as gr
import pandas as pd


def count_of(n: int, noun: str) -> str:
    """"1 segment", "3 segments"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def fmt_bytes(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "–"
    return f"{value / 2**20:.0f} MiB"


def overview_markdown(status: dict[str, Any]) -> str:
    backbone = status.get("backbone") or {}
    memory = status.get("memory") or {}
    latency = status.get("latency") or {}
    engine = status.get("engine") or {}
    lines = [
        f"**Backbone:** {backbone.get('name', '?')} ({backbone.get('arch', '?')}) · "
        f"**device** {backbone.get('device', '?')} · **dtype** {backbone.get('dtype', '?')}"
        + (f" · **quantization** {backbone['quantization']}" if backbone.get("quantization") not in (None, "none")
           else "")
        + (f" ({backbone['int8_kernel']})" if backbone.get("int8_kernel") else ""),
    ]
    if backbone.get("quantization_note"):
        # Why the weights run as they do when the service chose (model.quantization: auto) or warns.
        lines.append(f"**Weights:** {backbone['quantization_note']}")
    step = step_line(status.get("full_speed") or {})
    if step:
        lines.append(step)
    mem_line = f"**Memory:** RSS {fmt_bytes(memory.get('rss_bytes'))}"
    gpu = memory.get("gpu") or {}
    if gpu:
        mem_line += (f" · GPU {fmt_bytes(gpu.get('allocated_bytes'))} allocated, "
                     f"{fmt_bytes(gpu.get('used_bytes'))} used of {fmt_bytes(gpu.get('total_bytes'))}")
    mode = memory.get("mode", "normal")
    mem_line += f" · **mode** {'light (memory pressure)' if mode == 'light' else mode}"
    if isinstance(memory.get("transitions"), int) and memory["transitions"]:
        mem_line += f" ({memory['transitions']} transitions)"
    lines.append(mem_line)
    p50, p95 = latency.get("p50_ms"), latency.get("p95_ms")
    if isinstance(p50, (int, float)) and isinstance(p95, (int, float)):
        lines.append(f"**Latency:** p50 {p50:.0f} ms · p95 {p95:.0f} ms over "
                     f"{count_of(latency.get('count', 0), 'request')} · "
                     f"**batches** {engine.get('batches', 0)}, mean {engine.get('mean_batch_rows') or 0} rows")
    else:
        lines.append("**Latency:** no translations yet")
    return "\n\n".join(lines)


def step_line(full: dict[str, Any]) -> str:
    """What decodes now: the fast step, or the eager one while the fast one is still being built (and how far)."""
    build = full.get("build")
    if build is not None and build.get("state") == "building":
        parts = build.get("parts", [])
        now = next((p["name"] for p in parts if p["state"] == "building"), None)
        left = [p["name"] for p in parts if p["state"] == "waiting"]
        doing = f"; now: {now}" if now else ""
        waiting = f"; then: {', '.join(left)}" if left else ""
        return (f"**Decode step:** eager, while the fast one is built for this CPU in the background ("
                f"{build['done']} of {build['total']} parts done, {build['seconds']:.0f} s so far{doing}{waiting}). "
                "It takes over by itself, between two requests.")
    if full.get("line"):
        return f"**Decode step:** {full['line']}"
    if full.get("compiled_step"):
        return "**Decode step:** compiled for this CPU"
    return ""


def adapters_frame(status: dict[str, Any]) -> pd.DataFrame:
    cache = status.get("cache") or {}
    # The version serving each pair ("v1": as shipped; later ones trained from corrections, docs/CORRECTIONS.md).
    versions = {pair: info.get("version") or "" for pair, info in (status.get("adapter_versions") or {}).items()}
    rows = []
    for entry in cache.get("resident") or []:
        if entry.get("pinned"):
            state = "pinned"
        else:
            # The cache names its slots ("slot0_"); show the number.
            number = re.search(r"\d+", str(entry.get("slot") or ""))
            state = f"slot {number.group()}" if number else "slot"
        rows.append({"adapter": entry.get("key"), "state": state, "leases": entry.get("leases", 0)})
    for key in cache.get("ram_tier") or []:
        rows.append({"adapter": key, "state": "RAM tier", "leases": 0})
    for key, reason in (cache.get("failed") or {}).items():
        rows.append({"adapter": key, "state": f"failed: {reason}", "leases": 0})
    for row in rows:
        row["version"] = versions.get(str(row["adapter"]), "")
    # The version last: clients of the /status endpoint read the first columns by position.
    return pd.DataFrame(rows, columns=["adapter", "state", "leases", "version"])


def cache_markdown(status: dict[str, Any]) -> str:
    cache = status.get("cache") or {}

    def num(key: str) -> int:
        value = cache.get(key)
        return int(value) if isinstance(value, (int, float)) else 0

    def ms(key: str) -> str:
        value = cache.get(key)
        return f"{value:.0f} ms" if isinstance(value, (int, float)) else "–"

    misses = num("ram_hits") + num("disk_loads")
    rate = cache.get("hit_rate")
    rate_text = f"{rate:.0%}" if isinstance(rate, (int, float)) else "–"
    return (f"**Hits** {num('hits') + num('pinned_hits')} (pinned {num('pinned_hits')}) · **misses** {misses} "
            f"(RAM tier {num('ram_hits')}, disk {num('disk_loads')}) · **hit rate** {rate_text} · "
            f"**pinned preloads** {num('pin_loads')} · "
            f"**evictions** {num('evictions')} · **failures** {num('failures')} · **busy** {num('busy')}\n\n"
            f"**Load time** p50 {ms('load_ms_p50')} · p95 {ms('load_ms_p95')} · **attach** p50 {ms('attach_ms_p50')}"
            f" · **slots** {num('slots')} · **LRU (oldest first)** {', '.join(cache.get('lru_order') or []) or '–'}")


#: The status plots show the last this many seconds: a fixed window, so the axes do not rescale as time passes.
PLOT_WINDOW_S = 300


def history_frame(status: dict[str, Any], field: str, now: float | None = None) -> pd.DataFrame:
    """status["history"] holds [unix time, latency ms, hit rate or None, kind] per request: the points of the plot
    window, as clock times. The hit rate holds until the next request, so its line runs on to now. The latency
    plot leaves documents out (`plot_caption` counts them): a document of a minute beside texts of 50 ms would
    press every text's point onto the axis."""
    column = 1 if field == "latency_ms" else 2
    now = time.time() if now is None else now
    rows = []
    for point in status.get("history") or []:
        if field == "latency_ms" and is_document(point):
            continue
        stamp, value = point[0], point[column]
        if isinstance(value, (int, float)) and isinstance(stamp, (int, float)) and 0 <= now - stamp <= PLOT_WINDOW_S:
            rows.append({"time": stamp, field: float(value)})
    if field == "hit_rate" and rows:
        rows.append({"time": now, field: rows[-1][field]})
    frame = pd.DataFrame(rows[-400:], columns=["time", field])
    frame["time"] = pd.to_datetime(frame["time"].astype("float64"), unit="s")
    frame[field] = frame[field].astype("float64")
    return frame


def plot_caption(frame: pd.DataFrame, field: str, documents: list[float] | None = None) -> str:
    minutes = PLOT_WINDOW_S // 60
    if field == "hit_rate":
        if frame.empty:
            return f"No requests in the last {minutes} minutes."
        return f"Now {frame[field].iloc[-1]:.0%} of adapter uses found the adapter already loaded."
    docs = ""
    if documents:
        docs = (f" {count_of(len(documents), 'document')} left out of the plot, the longest "
                f"{max(documents) / 1000:,.1f} s.")
    if frame.empty:
        return f"No text requests in the last {minutes} minutes.{docs}"
    count = len(frame)
    return (f"{count_of(count, 'request')} in the last {minutes} minutes; slowest {frame[field].max():,.0f} ms.{docs}")


def is_document(point: list[Any]) -> bool:
    return len(point) > 3 and point[3] == "document"


def document_latencies(status: dict[str, Any], now: float) -> list[float]:
    return [float(p[1]) for p in status.get("history") or [] if is_document(p)
            and isinstance(p[0], (int, float)) and 0 <= now - p[0] <= PLOT_WINDOW_S]


def plots(status: dict[str, Any]) -> tuple[Any, Any]:
    """The two plots as updates: the last PLOT_WINDOW_S seconds up to now (a fixed window: the axis moves with the
    clock and never rescales to the data), and a caption that says what they show, or that there is nothing yet."""
    now = time.time()
    window = [now - PLOT_WINDOW_S, now]  # a temporal axis's limits are epoch seconds (Gradio scales them)
    latency = history_frame(status, "latency_ms", now)
    hit_rate = history_frame(status, "hit_rate", now)
    # The latency axis ends on a round number above the slowest request, so no point sits on the frame's edge.
    top = nice_ceiling(float(latency["latency_ms"].max()) * 1.05) if not latency.empty else 100.0
    documents = document_latencies(status, now)
    return (gr.update(value=latency, x_lim=window, y_lim=[0, top],
                      caption=plot_caption(latency, "latency_ms", documents)),
            gr.update(value=hit_rate, x_lim=window, caption=plot_caption(hit_rate, "hit_rate")))


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10^k at or above `value` (axis ends that read well)."""
    if value <= 0:
        return 1.0
    scale = 10 ** math.floor(math.log10(value))
    return next(m * scale for m in (1, 2, 2.5, 5, 10) if m * scale >= value)
