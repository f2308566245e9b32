"""Translation memory on the 300 most frequent UI phrases, through the service, memory off vs on, same run.

    python -m hunyuan_mt build-demo --memory-only --data data   # once: extracts the corpus into data/demo
    python -m bench.tm --data data/demo                         # bench/results/tm.md and tm.json

Exact match (and exact after case-folding and a final full stop, as the demo's evaluation counts it) against the
catalogue's reference, per direction, and the median time per phrase. The frequent phrases may be training pairs
(they are short, common UI strings), so the memory is expected to know most of them: this measures what a user
typing them gets, not the model's generalisation (the held-out chrF does that).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from hunyuan_mt.config import PROJECT_ROOT, load_config

from .report import write_results



def _run(service: Any, items: list[dict[str, str]], tgt: str) -> dict[str, Any]:
    hyps, times, from_memory = [], [], 0
    for item in items:
        started = time.perf_counter()
        result = service.translate(item["src"], "en", tgt)
        times.append((time.perf_counter() - started) * 1000)
        hyps.append(result.text)
        from_memory += result.memory_segments > 0
    refs = [i["tgt"] for i in items]
    exact = sum(h == r for h, r in zip(hyps, refs))
    folded = sum(h.casefold().rstrip(".") == r.casefold().rstrip(".") for h, r in zip(hyps, refs))
    n = max(1, len(items))
    return {"exact": round(100 * exact / n, 1), "exact_casefold": round(100 * folded / n, 1),
            "from_memory": from_memory, "ms_median": round(statistics.median(times), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=PROJECT_ROOT / "data" / "demo",
                        help="the extracted corpus (its frequent/ folder)")
    args = parser.parse_args(argv)
    from hunyuan_mt.service.translation import TranslationService

    frequent = {p.stem: [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
                for p in sorted((args.data / "frequent").glob("*.jsonl"))}
    service = TranslationService(load_config(None, {"model.warmup": False, "memory.enabled": False}, env={}))
    try:
        results: dict[str, dict[str, Any]] = {}
        for direction, items in frequent.items():
            tgt = direction.split("2")[1]
            service.tm.enabled = False
            off = _run(service, items, tgt)
            service.tm.enabled = True
            results[direction] = {"items": len(items), "memory_off": off, "memory_on": _run(service, items, tgt)}
    finally:
        service.close()
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"# Translation memory on the frequent UI phrases ({date}, `python -m bench.tm`)", "",
             "| direction | phrases | exact, model only | exact, memory + model | exact (case-folded), memory + model "
             "| answered from memory | median ms, model only | median ms, memory + model |",
             "|---|---|---|---|---|---|---|---|"]
    for direction, r in results.items():
        off, on = r["memory_off"], r["memory_on"]
        lines.append(f"| {direction} | {r['items']} | {off['exact']}% | {on['exact']}% | {on['exact_casefold']}% | "
                     f"{on['from_memory']} | {off['ms_median']} | {on['ms_median']} |")
    write_results("tm", {"date": date, "results": results}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
