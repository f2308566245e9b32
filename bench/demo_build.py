"""Two demo builds side by side through the service: latency of a short segment and chrF on the same strings.

    python -m bench.demo_build --data data/demo --old /tmp/old-build --new .      # bench/results/demo_build.md

Each build is a folder with `models/demo/` and `adapters/`. Both are served by the same TranslationService code
(translation memory off, so the model answers), one segment per request, over held-out UI strings of the four
en→X directions; every run alternates the builds, and the table gives medians over runs and the new/old ratio. The
target: the new build's CPU latency for a short segment stays within 1.5× the old one's.
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

DIRECTIONS = ("en2es", "en2de", "en2fr", "en2zh")


def _service(build: Path, extra: dict[str, Any] | None = None) -> Any:
    """A service on the demo build in `build` (models/demo, adapters/), memory off; `extra` settings on top."""
    from hunyuan_mt.service.translation import TranslationService

    overrides = {"model.path": str(build / "models" / "demo"), "cache.adapters_dir": str(build / "adapters"),
                 "tm.enabled": False, "memory.enabled": False, **(extra or {})}
    service = TranslationService(load_config(None, overrides, env={}))
    service.wait_full_speed()  # the compiled step where it applies, as a warm server runs
    return service


def _pass(service: Any, items: dict[str, list[dict[str, str]]]) -> tuple[list[float], dict[str, list[str]]]:
    times: list[float] = []
    outputs: dict[str, list[str]] = {}
    for direction, rows in items.items():
        tgt = direction.split("2")[1]
        outputs[direction] = []
        for row in rows:
            started = time.perf_counter()
            outputs[direction].append(service.translate(row["src"], "en", tgt).text)
            times.append((time.perf_counter() - started) * 1000)
    return times, outputs


def main(argv: list[str] | None = None) -> int:
    import sacrebleu

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=PROJECT_ROOT / "data" / "demo", help="the extracted corpus")
    parser.add_argument("--old", type=Path, required=True, help="folder of the earlier build")
    parser.add_argument("--new", type=Path, default=PROJECT_ROOT, help="folder of the new build")
    parser.add_argument("--per-direction", type=int, default=40)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)

    items = {}
    for direction in DIRECTIONS:
        rows = [json.loads(line) for line in (args.data / "test" / f"{direction}.jsonl").read_text(
            encoding="utf-8").splitlines() if line.strip()]
        items[direction] = sorted(rows, key=lambda r: len(r["src"]))[:args.per_direction]   # the short ones
    services = {"old": _service(args.old), "new": _service(args.new)}
    medians: dict[str, list[float]] = {"old": [], "new": []}
    outputs: dict[str, dict[str, list[str]]] = {}
    try:
        for _ in range(args.runs):
            for name, service in services.items():
                times, outputs[name] = _pass(service, items)
                medians[name].append(statistics.median(times))
    finally:
        for service in services.values():
            service.close()
    chrf = {name: {d: round(sacrebleu.corpus_chrf(outputs[name][d], [[r["tgt"] for r in items[d]]]).score, 1)
                   for d in DIRECTIONS} for name in services}
    old_ms, new_ms = statistics.median(medians["old"]), statistics.median(medians["new"])
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"# Demo builds side by side ({date}, `python -m bench.demo_build --runs {args.runs}`)", "",
             f"{args.per_direction} shortest held-out UI strings per en→X direction, one segment per request, "
             "translation memory off.", "",
             "| build | median ms per segment (runs) | median of runs | " + " | ".join(f"chrF {d}" for d in DIRECTIONS)
             + " |", "|---|---|---|" + "---|" * len(DIRECTIONS)]
    for name in services:
        lines.append(f"| {name} | {', '.join(f'{m:.1f}' for m in medians[name])} | {statistics.median(medians[name]):.1f} | "
                     + " | ".join(str(chrf[name][d]) for d in DIRECTIONS) + " |")
    lines += ["", f"new / old latency: **{new_ms / old_ms:.2f}×**"]
    write_results("demo_build", {"date": date, "ms": medians, "chrf": chrf, "ratio": new_ms / old_ms}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
