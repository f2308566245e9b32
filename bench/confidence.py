"""How well the confidence ranks translations: Spearman's correlation between each segment's
confidence and its sentence-level chrF against the reference, per direction.

    python -m bench.confidence                    # the shipped demo, bench/results/confidence.{json,md}
    python -m bench.confidence --build /tmp/other-build

The sets are each direction's standing held-out UI strings (`adapters/<pair>/heldout.tsv`, 400 rows each, drawn
from the system's gettext catalogues and kept out of training; `python -m hunyuan_mt.demo.heldout`). The help
sentences and paragraphs held out by `build-demo` (data/demo/help_test: LibreOffice's help, para_test: GNOME's help)
are used too when the extraction is there. The service
translates them with the translation memory off (the model answers every row) in `translate_batch` calls of 64,
as the REST API does. A row's confidence is `TranslationResult.confidence` (its least confident sentence's
geometric-mean token probability); its quality is sacrebleu's sentence chrF. Spearman's ρ is Pearson's on pandas' ranks
(ties averaged). The target: ρ ≥ 0.35 in each of the 8 directions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from hunyuan_mt.config import PROJECT_ROOT

from .demo_build import _service
from .report import write_results

DIRECTIONS = ("en2es", "en2de", "en2fr", "en2zh", "es2en", "de2en", "fr2en", "zh2en")
TARGET = 0.35


def heldout_ui(build: Path, direction: str) -> list[tuple[str, str]]:
    from hunyuan_mt.store.tm import read_rows

    src, tgt = direction.split("2")
    path = build / "adapters" / direction / "heldout.tsv"
    return read_rows(path.read_bytes(), path.name, src, tgt)


def heldout_help(build: Path, direction: str, part: str) -> list[tuple[str, str]] | None:
    path = build / "data" / "demo" / part / f"{direction}.jsonl"
    if not path.exists():
        return None
    return [(r["src"], r["tgt"]) for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())]


def spearman(xs: list[float], ys: list[float]) -> float:
    """Pearson's correlation of the ranks (ties averaged): pandas' own "spearman" would import scipy."""
    import pandas as pd

    return float(pd.Series(xs).rank().corr(pd.Series(ys).rank()))


def score(service: Any, direction: str, pairs: list[tuple[str, str]]) -> dict[str, Any]:
    import sacrebleu

    src, tgt = direction.split("2")
    texts = [s for s, _ in pairs]
    step = service.cfg.limits.max_batch_items
    started = time.perf_counter()
    results = [r for start in range(0, len(texts), step)
               for r in service.translate_batch(texts[start:start + step], src, tgt)]
    seconds = time.perf_counter() - started
    rows = [(r.confidence, sacrebleu.sentence_chrf(r.text, [ref]).score)
            for r, (_, ref) in zip(results, pairs) if r.confidence is not None]
    confidences, chrfs = [c for c, _ in rows], [q for _, q in rows]
    return {"rows": len(pairs), "scored": len(rows), "spearman": round(spearman(confidences, chrfs), 3),
            "median_confidence": round(statistics.median(confidences), 3),
            "median_chrf": round(statistics.median(chrfs), 1), "seconds": round(seconds, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", type=Path, default=PROJECT_ROOT, help="a folder with models/demo and adapters/")
    args = parser.parse_args(argv)
    from .hunyuan_cpu import cpu_line

    service = _service(args.build)
    table: dict[str, dict[str, Any]] = {}
    try:
        for direction in DIRECTIONS:
            table[f"{direction} UI"] = score(service, direction, heldout_ui(args.build, direction))
            for part, name in (("help_test", "help sentences"), ("para_test", "help paragraphs")):
                help_rows = heldout_help(args.build, direction, part)
                if help_rows:
                    table[f"{direction} {name}"] = score(service, direction, help_rows)
            print(direction, {k: v for k, v in table.items() if k.startswith(direction)}, flush=True)
    finally:
        service.close()
    lines = [f"`python -m bench.confidence`; CPU: {cpu_line()}; the shipped demo, memory off.", "",
             "| set | rows | scored | Spearman ρ (confidence, sentence chrF) | target | median confidence | "
             "median chrF | seconds |", "|---|---|---|---|---|---|---|---|"]
    for name, row in table.items():
        mark = "✓" if row["spearman"] >= TARGET else "✗"
        lines.append(f"| {name} | {row['rows']} | {row['scored']} | {row['spearman']} | ≥ {TARGET} {mark} | "
                     f"{row['median_confidence']} | {row['median_chrf']} | {row['seconds']} |")
    write_results("confidence", {"cpu": cpu_line(), "sets": table}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
