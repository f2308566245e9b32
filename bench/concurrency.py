"""Concurrency inside the process, by route mix: what the engine's batching gives without HTTP in front.

    python -m bench.concurrency                   # 3 runs per mix, 96 requests, 16 threads

`bench.httpload` measures the same ratio through the real server; on the 2-core box it came out lower than the
engine alone gives (BENCHMARKS.md, 2026-12-04), and this bench separates the two. For each route mix the same 96
short requests (fixed seed) go through `TranslationService.translate` one at a time, then from `--threads` threads
at once. Mixes: the 4 en→X adapters; the 8 shipped adapters; those 8 and the 12 pivot routes between es, de, fr and
zh (two passes through the engine each). Sources in each language are the server's own translations of short
English sentences (the same way `bench.httpload` makes them). Reported per mix, medians over the runs: the speed-up,
the engine's rows per decode step and prefills in the concurrent pass, and whether every concurrent answer equals
the sequential one. Translation memory off. Results: bench/results/concurrency.{json,md}.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .peer import _service, sentences, workload
from .report import write_results

LANGS = ("es", "de", "fr", "zh")
MIXES: dict[str, list[tuple[str, str]]] = {
    "4 en→X adapters": [("en", t) for t in LANGS],
    "8 adapters": [("en", t) for t in LANGS] + [(s, "en") for s in LANGS],
    "8 adapters + 12 pivots": [("en", t) for t in LANGS] + [(s, "en") for s in LANGS]
                              + [(s, t) for s in LANGS for t in LANGS if s != t],
}


def _engine_counts(service: Any) -> tuple[int, int, int]:
    s = service.engine.stats
    return s.decode_steps, s.decode_rows, s.prefills


def run_mix(service: Any, sources: dict[str, list[str]], routes: list[tuple[str, str]], requests: int,
            threads: int, seed: int = 1) -> dict[str, Any]:
    rnd = random.Random(seed)
    reqs = []
    for _ in range(requests):
        src, tgt = rnd.choice(routes)
        reqs.append((rnd.choice(sources[src]), src, tgt))

    def call(req: tuple[str, str, str]) -> str:
        return service.translate(*req).text

    for req in reqs[:8]:  # the routes' adapters and shapes once, outside the timing
        call(req)
    t0 = time.perf_counter()
    sequential = [call(r) for r in reqs]
    seq_s = time.perf_counter() - t0
    before = _engine_counts(service)
    with ThreadPoolExecutor(threads) as pool:
        t0 = time.perf_counter()
        concurrent = list(pool.map(call, reqs))
        con_s = time.perf_counter() - t0
    steps, rows, prefills = (a - b for a, b in zip(_engine_counts(service), before))
    return {"sequential_s": round(seq_s, 3), "concurrent_s": round(con_s, 3), "speedup": round(seq_s / con_s, 2),
            "identical": sum(a == b for a, b in zip(sequential, concurrent)), "requests": requests,
            "rows_per_step": round(rows / steps, 2) if steps else None, "prefills": prefills}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.concurrency", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--slots", type=int, default=None, help="cache.slots (default: the shipped profile's 3)")
    args = p.parse_args(argv)
    service = _service(None, None if args.slots is None else {"cache.slots": args.slots})
    try:
        service.wait_ready(120)
        texts, _ = workload(sentences())
        english = [t for t in texts if len(t) < 60][:40]
        sources = {"en": english, **{lang: [r.text for r in service.translate_batch(english, "en", lang)]
                                     for lang in LANGS}}
        runs = {name: [run_mix(service, sources, routes, args.requests, args.threads) for _ in range(args.runs)]
                for name, routes in MIXES.items()}
        info = service.status()["backbone"]
        slots = service.cfg.cache.slots
    finally:
        service.close()
    median = {name: {key: statistics.median(r[key] for r in rs)
                     for key in ("sequential_s", "concurrent_s", "speedup", "rows_per_step", "prefills")}
              for name, rs in runs.items()}
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "threads": args.threads,
               "requests": args.requests, "quantization": info.get("quantization"), "slots": slots, "runs": runs, "median": median,
               "all_identical": all(r["identical"] == r["requests"] for rs in runs.values() for r in rs)}
    lines = [f"# In-process concurrency by route mix ({results['date']}, `python -m bench.concurrency`)", "",
             f"{args.requests} short requests, sequential and from {args.threads} threads, translation memory off, "
             f"{results['quantization']}, {slots} adapter slots; medians of {args.runs} runs.", "",
             "| mix | sequential s | concurrent s | speed-up (runs) | rows per decode step | prefills | identical |",
             "|---|---|---|---|---|---|---|"]
    for name, rs in runs.items():
        m = median[name]
        lines.append(f"| {name} | {m['sequential_s']:.2f} | {m['concurrent_s']:.2f} | **{m['speedup']:.2f}×** "
                     f"({', '.join(str(r['speedup']) for r in rs)}) | {m['rows_per_step']} | {m['prefills']:.0f} | "
                     f"{min(r['identical'] for r in rs)}/{args.requests} |")
    lines += ["", f"Every concurrent answer equal to the sequential one: {results['all_identical']}."]
    write_results("concurrency" if args.slots is None else f"concurrency-slots{args.slots}", results, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
