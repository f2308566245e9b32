"""Turn the raw worker outputs into medians, target checks, a markdown report and a plot."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

VARIANT_ORDER = ("B0", "B1", "B2", "ours")


def _median(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 3) if vals else None


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for out in results["load"]:
        for cell in out["cells"]:
            groups[(cell["variant"], cell["workload"], cell["concurrency"])].append(cell)
    cells = []
    for (variant, workload, level), runs in sorted(groups.items(), key=lambda kv: (
            kv[0][1], kv[0][2], VARIANT_ORDER.index(kv[0][0]) if kv[0][0] in VARIANT_ORDER else 9)):
        cells.append({
            "variant": variant, "workload": workload, "concurrency": level, "runs": len(runs),
            "qps": _median([c["qps"] for c in runs]), "qps_runs": [c["qps"] for c in runs],
            "p50_ms": _median([c["p50_ms"] for c in runs]), "p95_ms": _median([c["p95_ms"] for c in runs]),
            "p99_ms": _median([c["p99_ms"] for c in runs]),
            "hit_rate": _median([c["hit_rate"] for c in runs]),
            # Share of lookups that did not touch the disk (attached already, or re-attached from host RAM).
            "no_disk_rate": _median([(c["counters"].get("hits", 0) + c["counters"].get("ram_hits", 0)) /
                                     c["counters"]["lookups"] if c["counters"].get("lookups") else None
                                     for c in runs]),
            "disk_loads": _median([c["counters"].get("disk_loads") for c in runs]),
            "ram_hits": _median([c["counters"].get("ram_hits") for c in runs]),
            "completed": _median([c["completed"] for c in runs]),
            "errors": sum(c["errors"] for c in runs),
            "error_samples": sorted({e for c in runs for e in c.get("error_samples", [])})[:3],
            "capped_by": sorted({c["capped_by"] for c in runs}),
        })
    memory_by_variant: dict[str, dict[str, Any]] = {}
    for variant in VARIANT_ORDER:
        outs = [o for o in results["load"] if o["variant"] == variant]
        if outs:
            memory_by_variant[variant] = {
                "peak_rss_mb": _median([o.get("peak_rss_mb") for o in outs]),
                "rss_mb_started": _median([o.get("rss_mb_started") for o in outs]),
                "gpu_peak_mb": _median([o.get("gpu_peak_mb") for o in outs]),
                "start_s": _median([o.get("start_s") for o in outs]),
            }
    pinned = [o["pinned_first"] for o in results["load"] if o.get("pinned_first")]
    pinned_first = None
    if pinned:
        pinned_first = {"pair": pinned[0]["pair"], "first_ms": _median([p["first_ms"] for p in pinned]),
                        "steady_median_ms": _median([p["steady_median_ms"] for p in pinned]),
                        "ratio": _median([p["ratio"] for p in pinned]), "ratio_runs": [p["ratio"] for p in pinned]}
    cold = None
    raw = [c for c in results["cold"] if c["kind"] == "cold_raw"]
    ours = [c for c in results["cold"] if c["kind"] == "cold_ours"]
    if raw and ours:
        r, o = _median([c["first_s"] for c in raw]), _median([c["first_s"] for c in ours])
        cold = {"raw_first_s": r, "ours_first_s": o, "ratio": round(o / r, 3) if r else None,
                "raw_imports_s": _median([c["imports_s"] for c in raw]),
                "ours_imports_s": _median([c["imports_s"] for c in ours]),
                "raw_process_s": _median([c["since_process_start_s"] for c in raw]),
                "ours_process_s": _median([c["since_process_start_s"] for c in ours]),
                "safetensors_read_s": _median([c.get("safetensors_read_s") for c in raw]),
                "runs": len(ours)}
    attach = next((dict(m["attach"]) for m in results["memory"] if m.get("attach")), None)
    peft_loads = [o["extra"].get("load_adapter_ms_median") for o in results["load"] + results["memory"]
                  if o.get("variant") in ("B1", "B2") and o.get("extra")]
    if attach is not None:
        attach["peft_load_adapter_ms_median"] = _median(peft_loads)
    scaling = _scaling(results["memory"])
    pooled = {}
    for wl in sorted({c["workload"] for c in cells}):
        per_run = []
        for out in (o for o in results["load"] if o["variant"] == "ours"):
            cs = [c["counters"] for c in out["cells"] if c["workload"] == wl]
            lookups = sum(c.get("lookups", 0) for c in cs)
            if lookups:
                per_run.append({"hit_rate": sum(c.get("hits", 0) for c in cs) / lookups,
                                "no_disk_rate": sum(c.get("hits", 0) + c.get("ram_hits", 0) for c in cs) / lookups,
                                "lookups": lookups})
        if per_run:
            pooled[wl] = {k: _median([r[k] for r in per_run]) for k in ("hit_rate", "no_disk_rate", "lookups")}
    summary = {"cells": cells, "pooled_ours": pooled, "memory_by_variant": memory_by_variant, "pinned_first": pinned_first, "cold": cold,
               "attach": attach, "scaling": scaling}
    summary["targets"] = _targets(summary)
    return summary


def _scaling(memory: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    ours = sorted((m for m in memory if m["variant"] == "ours"), key=lambda m: m["registered"])
    base = None
    if ours:
        # "Backbone" = ours right after start at the smallest size, less the adapters pinned there.
        m0 = ours[0]
        base = m0["rss_mb_started"] - m0["pinned"] * m0["adapter_bytes"] / 2**20
    for m in sorted(memory, key=lambda m: (m["registered"], m["variant"])):
        row = {"variant": m["variant"], "registered": m["registered"], "rss_mb_started": m["rss_mb_started"],
               "rss_mb_after_traffic": m["rss_mb_after_traffic"], "peak_rss_mb": m["peak_rss_mb"],
               "served": m["served"], "errors": m["errors"], "adapter_mb": round(m["adapter_bytes"] / 2**20, 3),
               "gpu_peak_mb": m.get("gpu_peak_mb"),
               "attached": (m.get("extra") or {}).get("adapters_attached") if m["variant"] == "B2" else
               len((m.get("extra") or {}).get("resident") or []),
               "preload_s": (m.get("extra") or {}).get("preload_s")}
        if base is not None:
            budget = (base + (m["slots"] + m["pinned"]) * m["adapter_bytes"] / 2**20) * 1.10
            row["budget_mb"] = round(budget, 1)
            row["within_budget"] = m["rss_mb_after_traffic"] <= budget
        rows.append(row)
    return rows


def _cell(summary: dict[str, Any], variant: str, workload: str, level: int) -> dict[str, Any] | None:
    return next((c for c in summary["cells"] if (c["variant"], c["workload"], c["concurrency"]) ==
                 (variant, workload, level)), None)


def _targets(s: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(name: str, target: str, measured: float | None, met: bool | None, note: str = "") -> None:
        out.append({"name": name, "target": target, "measured": measured, "met": met, "note": note})

    ours, b1, b0 = (_cell(s, v, "W1", 16) for v in ("ours", "B1", "B0"))
    ours64, b1_64 = (_cell(s, v, "W1", 64) for v in ("ours", "B1"))
    ours1, b1_1 = (_cell(s, v, "W1", 1) for v in ("ours", "B1"))
    if ours and b1 and ours["qps"] and b1["qps"]:
        r = round(ours["qps"] / b1["qps"], 2)
        add("W1 c=16 QPS ours / B1", ">= 4", r, r >= 4)
        add("W1 c=16 QPS ours / B1, stretch", ">= 6", r, r >= 6)
    if ours64 and b1_64 and ours64["qps"] and b1_64["qps"]:
        r = round(ours64["qps"] / b1_64["qps"], 2)
        add("W1 c=64 QPS ours / B1", ">= 6", r, r >= 6)
    if ours and b1 and ours["p95_ms"] and b1["p95_ms"]:
        r = round(ours["p95_ms"] / b1["p95_ms"], 3)
        add("W1 c=16 p95 ours / B1", "<= 0.167", r, r <= 1 / 6)
    if ours1 and b1_1 and ours1["p50_ms"] and b1_1["p50_ms"]:
        r = round(ours1["p50_ms"] / b1_1["p50_ms"], 3)
        add("W1 one client, p50 latency ours / B1", "<= 1.0", r, r <= 1.0)
    if ours and b0 and ours["qps"] and b0["qps"]:
        r = round(ours["qps"] / b0["qps"], 2)
        add("W1 c=16 QPS ours / B0", ">= 20", r, r >= 20)
    w1_ours = [c for c in s["cells"] if c["variant"] == "ours" and c["workload"] == "W1"]
    pooled = s["pooled_ours"].get("W1")
    if pooled and pooled["hit_rate"] is not None:
        add("W1 hit rate (ours, all levels pooled)", ">= 0.97", pooled["hit_rate"], pooled["hit_rate"] >= 0.97,
            f"without touching the disk: {pooled['no_disk_rate']}; per level: "
            + ", ".join(f"c={c['concurrency']}: {c['hit_rate']}" for c in w1_ours))
    scaling = [r for r in s["scaling"] if r["variant"] == "ours" and "within_budget" in r]
    if scaling:
        worst = max(scaling, key=lambda r: r["rss_mb_after_traffic"] / r["budget_mb"])
        add("ours resident memory at " + "/".join(str(r["registered"]) for r in scaling) + " pairs",
            "<= backbone + (slots+pinned) adapters + 10%",
            round(worst["rss_mb_after_traffic"] / worst["budget_mb"], 3),
            all(r["within_budget"] for r in scaling), "measured = worst RSS / budget")
    if s["pinned_first"]:
        r = s["pinned_first"]["ratio"]
        add("pinned pair first request / steady state", "<= 1.1", r, r <= 1.1)
    if s["attach"] and s["attach"].get("ram_ms_median") is not None:
        ms = round(s["attach"]["ram_ms_median"], 2)
        add("re-attach from the RAM tier, ms", "<= 2", ms, ms <= 2)
    if s["attach"] and s["attach"].get("ratio") is not None:
        r = s["attach"]["ratio"]
        add("RAM-tier re-attach / disk attach", "<= 0.2", r, r <= 0.2)
    if s["cold"] and s["cold"]["ratio"] is not None:
        r = s["cold"]["ratio"]
        add("cold start to first translation / (load + one forward), first bound", "<= 1.5", r, r <= 1.5)
        add("cold start to first translation / (load + one forward)", "<= 1.3", r, r <= 1.3)
    return out


def _f(x: Any, nd: int = 1) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def markdown(results: dict[str, Any]) -> str:
    s = results["summary"]
    m = results["machine"]
    runs = max((c["runs"] for c in s["cells"]), default=0)
    lines = [
        "# Benchmark results",
        "",
        f"Machine: {m.get('cpu')} ({m.get('cpu_count')} cores), {m.get('ram_gb')} GiB RAM, "
        f"{'GPU ' + m['gpu'] if m.get('gpu') else 'no GPU'}; torch {m.get('torch')}, transformers "
        f"{m.get('transformers')}, peft {m.get('peft')}; load average at start {m.get('load_avg_at_start')}; "
        f"{m.get('date_utc')} UTC. Whole bench: {results.get('wall_s')} s.",
        f"Model: `{results['config']['model']['path']}`; pinned {', '.join(results['pinned'])}; slots "
        f"{results['config']['cache']['slots']}; max_new_tokens {results['config']['limits']['max_new_tokens']}.",
        f"Medians over {runs} run(s) of each cell.",
        "",
        "## Targets",
        "",
        "| target | goal | measured | met |",
        "|---|---|---|---|",
    ]
    for t in s["targets"]:
        met = "yes" if t["met"] else "**no**"
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"| {t['name']}{note} | {t['target']} | {_f(t['measured'], 3)} | {met} |")
    lines += ["", "## Throughput and latency", "",
              "| workload | clients | variant | QPS | p50 ms | p95 ms | p99 ms | hit rate | no-disk rate "
              "| disk loads | RAM-tier hits | done/run | errors |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in s["cells"]:
        lines.append(
            f"| {c['workload']} | {c['concurrency']} | {c['variant']} | {_f(c['qps'], 2)} | {_f(c['p50_ms'], 0)} | "
            f"{_f(c['p95_ms'], 0)} | {_f(c['p99_ms'], 0)} | {_f(c['hit_rate'], 3)} | {_f(c['no_disk_rate'], 3)} | "
            f"{_f(c['disk_loads'], 0)} | "
            f"{_f(c['ram_hits'], 0)} | {_f(c['completed'], 0)} | {c['errors']} |")
    errs = [c for c in s["cells"] if c["errors"]]
    for c in errs:
        lines.append(f"\nErrors in {c['variant']} {c['workload']} c={c['concurrency']}: {c['error_samples']}")
    lines += ["", "## Memory per variant (load runs)", "",
              "| variant | RSS after start MB | peak RSS MB | GPU peak MB | start s |", "|---|---|---|---|---|"]
    for v, mv in s["memory_by_variant"].items():
        lines.append(f"| {v} | {_f(mv['rss_mb_started'])} | {_f(mv['peak_rss_mb'])} | {_f(mv['gpu_peak_mb'])} | "
                     f"{_f(mv['start_s'], 2)} |")
    if s["scaling"]:
        lines += ["", "## Memory scaling (resident RSS after traffic over every registered pair, after gc + "
                  "malloc_trim)", "",
                  "| registered pairs | variant | adapters attached at the end | RSS after start MB | "
                  "RSS after traffic MB | budget MB | requests served | errors |", "|---|---|---|---|---|---|---|---|"]
        for r in s["scaling"]:
            attached = f"{r['attached']}" + (f" (in {r['preload_s']} s)" if r.get("preload_s") else "")
            lines.append(f"| {r['registered']} | {r['variant']} | {attached} | {_f(r['rss_mb_started'])} | "
                         f"{_f(r['rss_mb_after_traffic'])} | {_f(r.get('budget_mb'))} | {r['served']} | "
                         f"{r['errors']} |")
    if s["cold"]:
        c = s["cold"]
        lines += ["", "## Cold start to first translation", "",
                  "| | after imports s | imports s | from process start s |", "|---|---|---|---|",
                  f"| reference: tokenizer + safetensors model load + one forward | {_f(c['raw_first_s'], 3)} | "
                  f"{_f(c['raw_imports_s'], 2)} | {_f(c['raw_process_s'], 2)} |",
                  f"| ours: TranslationService(cfg) + translate() | {_f(c['ours_first_s'], 3)} | "
                  f"{_f(c['ours_imports_s'], 2)} | {_f(c['ours_process_s'], 2)} |",
                  "", f"Reading the safetensors file alone: {_f(c['safetensors_read_s'], 4)} s."]
    if s["pinned_first"]:
        p = s["pinned_first"]
        lines += ["", f"Pinned pair {p['pair']}: first request {_f(p['first_ms'])} ms, steady state "
                  f"{_f(p['steady_median_ms'])} ms (ratio per run {p['ratio_runs']})."]
    if s["attach"]:
        a = s["attach"]
        lines += ["", f"Attach through `cache.lease`: from disk {_f(a['disk_ms_median'], 2)} ms, re-attach from the "
                  f"RAM tier {_f(a['ram_ms_median'], 2)} ms (median of {len(a['samples'])} pairs). The "
                  f"conventional PEFT `load_adapter` from disk (B1/B2, injecting LoRA layers): "
                  f"{_f(a.get('peft_load_adapter_ms_median'), 2)} ms."]
    if results.get("failures"):
        lines += ["", f"Failed measurements: {results['failures']}"]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = results["summary"]
    workloads = sorted({c["workload"] for c in s["cells"]})
    ncols = len(workloads) + (1 if s["scaling"] else 0)
    fig, axes = plt.subplots(2, max(ncols, 1), figsize=(5 * max(ncols, 1), 8), squeeze=False)
    for col, wl in enumerate(workloads):
        for variant in VARIANT_ORDER:
            cells = sorted((c for c in s["cells"] if c["workload"] == wl and c["variant"] == variant),
                           key=lambda c: c["concurrency"])
            if not cells:
                continue
            xs = [c["concurrency"] for c in cells]
            axes[0][col].plot(xs, [c["qps"] or 0 for c in cells], marker="o", label=variant)
            axes[1][col].plot(xs, [c["p95_ms"] or 0 for c in cells], marker="o", label=variant)
        for row, label in ((0, "QPS"), (1, "p95 latency (ms)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("closed-loop clients")
            ax.set_ylabel(label)
            ax.set_title(f"{wl}: {label}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
    if s["scaling"]:
        ax = axes[0][ncols - 1]
        for variant in ("ours", "B2"):
            rows = [r for r in s["scaling"] if r["variant"] == variant]
            if rows:
                ax.plot([r["registered"] for r in rows], [r["rss_mb_after_traffic"] for r in rows], marker="o",
                        label=variant)
        ax.set_xlabel("registered pairs")
        ax.set_ylabel("resident RSS (MB)")
        ax.set_title("memory scaling")
        ax.grid(True, alpha=0.3)
        ax.legend()
        axes[1][ncols - 1].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_results(name: str, data: dict[str, Any], lines: list[str]) -> None:
    """bench/results/<name>.json and <name>.md, and the table on stdout (the quality benches' common ending)."""
    from hunyuan_mt.config import PROJECT_ROOT

    folder = PROJECT_ROOT / "bench" / "results"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(data, indent=2, ensure_ascii=False))
    (folder / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
