"""Calibrate `quality.review_below`: the lowest confidence at which at most 1 in 10 bad translations passes as
confident, on held-out strings, each half checked against a threshold chosen on the other.

    python -m bench.review_threshold                  # the shipped demo; bench/results/review_threshold.{json,md}
    python -m bench.review_threshold --config hy-mt1.5-1.8b --build /path/with/adapters

The data are each direction's standing held-out UI strings (`adapters/<pair>/heldout.tsv`, 400 rows, kept out of
training), translated by the service with the translation memory off, so that the model answers every row, in
`translate_batch` calls of 64 as the REST API does. A row's confidence is `/translate`'s `confidence` (its least
sure sentence's; at most `review.UNCHANGED_CONFIDENCE` when it came back as its source); a row is bad when its
sentence chrF against the reference is below `BAD_CHRF`. One setting serves every pair, so the directions are
pooled. The rows are split in two halves (even and odd rows); on each half, the calibrated threshold is the
smallest multiple of 0.01 at which at most `PASS_RATE` of its bad rows have a confidence at or above it, and the
other half says how that threshold does on rows it was not chosen on. The setting is the larger of the two: at
most `PASS_RATE` of the bad rows of either half pass at it. Reported per direction: bad rows that pass as
confident, and good rows sent to review (what the setting costs), at the setting and at the old 0.5.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

from hunyuan_mt.config import PROJECT_ROOT

from .confidence import DIRECTIONS, heldout_ui
from .report import write_results

#: Sentence chrF below which a translation is bad: a quarter of the reference's character n-grams or fewer.
BAD_CHRF = 25.0
#: The share of bad translations that may pass as confident.
PASS_RATE = 0.10
#: The threshold shipped before this calibration, for comparison.
BEFORE = 0.5


def score_rows(service: Any, direction: str, pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Each row's confidence, sentence chrF and whether it came back as its source."""
    import sacrebleu

    from hunyuan_mt.text.review import words

    src, tgt = direction.split("2")
    step = service.cfg.limits.max_batch_items
    results = [r for start in range(0, len(pairs), step)
               for r in service.translate_batch([s for s, _ in pairs[start:start + step]], src, tgt)]
    return [{"confidence": r.confidence, "chrf": round(sacrebleu.sentence_chrf(r.text, [ref]).score, 2),
             "copied": bool(words(source)) and words(r.text) == words(source)}
            for r, (source, ref) in zip(results, pairs)]


def calibrate(rows: list[dict[str, Any]], rate: float = PASS_RATE) -> float:
    """The smallest multiple of 0.01 at which at most `rate` of the bad rows have a confidence at or above it."""
    bad = [r["confidence"] for r in rows if r["chrf"] < BAD_CHRF and r["confidence"] is not None]
    for step in range(0, 101):
        threshold = step / 100
        if sum(c >= threshold for c in bad) <= math.floor(rate * len(bad)):
            return threshold
    return 1.0


def rates(rows: list[dict[str, Any]], threshold: float) -> dict[str, Any]:
    """Bad rows passing as confident and good rows sent to review at `threshold`."""
    scored = [r for r in rows if r["confidence"] is not None]
    bad = [r for r in scored if r["chrf"] < BAD_CHRF]
    good = [r for r in scored if r["chrf"] >= BAD_CHRF]
    passing = sum(r["confidence"] >= threshold for r in bad)
    flagged = sum(r["confidence"] < threshold for r in good)
    return {"bad": len(bad), "bad_passing": passing, "bad_pass_rate": round(passing / len(bad), 3) if bad else None,
            "good": len(good), "good_to_review": flagged,
            "good_review_rate": round(flagged / len(good), 3) if good else None,
            "copies": sum(r["copied"] for r in scored),
            "copies_passing": sum(r["copied"] and r["confidence"] >= threshold for r in scored)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", type=Path, default=PROJECT_ROOT, help="a folder with models/demo and adapters/")
    parser.add_argument("--config", default=None, help="a profile to load instead of the demo build")
    args = parser.parse_args(argv)
    from .demo_build import _service
    from .hunyuan_cpu import cpu_line

    if args.config:
        from hunyuan_mt.config import load_config
        from hunyuan_mt.service.translation import TranslationService

        service = TranslationService(load_config(args.config, {"model.warmup": False, "memory.enabled": False,
                                                               "tm.enabled": False}, env={}))
    else:
        service = _service(args.build)
    started = time.perf_counter()
    halves: dict[str, dict[str, list[dict[str, Any]]]] = {}
    try:
        for direction in DIRECTIONS:
            rows = score_rows(service, direction, heldout_ui(args.build, direction))
            halves[direction] = {"calibrate": rows[0::2], "check": rows[1::2]}
            print(direction, len(rows), flush=True)
    finally:
        service.close()
    even = [r for h in halves.values() for r in h["calibrate"]]
    odd = [r for h in halves.values() for r in h["check"]]
    folds = {"even": calibrate(even), "odd": calibrate(odd)}
    crossed = {"even → odd": rates(odd, folds["even"]), "odd → even": rates(even, folds["odd"])}
    threshold = max(folds.values())
    every = {d: h["calibrate"] + h["check"] for d, h in halves.items()}
    table = {d: {"calibrated": rates(rows, threshold), "before": rates(rows, BEFORE)} for d, rows in every.items()}
    pooled = {"calibrated": rates(even + odd, threshold), "before": rates(even + odd, BEFORE)}
    seconds = round(time.perf_counter() - started, 1)
    lines = [f"`python -m bench.review_threshold`; CPU: {cpu_line()}; the shipped demo, memory off; {seconds} s.", "",
             f"A row is bad below sentence chrF {BAD_CHRF:g}. Calibrated on the even rows: {folds['even']:.2f}, "
             f"at which {crossed['even → odd']['bad_pass_rate']:.1%} of the odd rows' bad ones pass; on the odd "
             f"rows: {folds['odd']:.2f}, at which {crossed['odd → even']['bad_pass_rate']:.1%} of the even rows' "
             f"pass. **review_below = {threshold:.2f}**, the larger; all {sum(len(r) for r in every.values())} rows "
             "at it:", "",
             f"| direction | bad rows | bad passing at {threshold:.2f} | good to review at {threshold:.2f} | "
             f"bad passing at {BEFORE} | good to review at {BEFORE} | copies of the source (passing) |",
             "|---|---|---|---|---|---|---|"]
    for name, row in [*table.items(), ("all", pooled)]:
        new, old = row["calibrated"], row["before"]
        lines.append(f"| {name} | {new['bad']} | {new['bad_passing']} ({new['bad_pass_rate']:.1%}) | "
                     f"{new['good_to_review']} of {new['good']} ({new['good_review_rate']:.1%}) | "
                     f"{old['bad_passing']} ({old['bad_pass_rate']:.1%}) | {old['good_to_review']} of {old['good']} "
                     f"({old['good_review_rate']:.1%}) | {new['copies']} ({new['copies_passing']}) |")
    write_results("review_threshold", {"cpu": cpu_line(), "bad_chrf": BAD_CHRF, "pass_rate": PASS_RATE,
                                       "folds": folds, "crossed": crossed, "review_below": threshold,
                                       "directions": table, "pooled": pooled, "seconds": seconds}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
