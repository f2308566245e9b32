"""Held-out paragraphs through the service, as a user sends them: chrF against copying the source, and the outputs
that repeat a phrase their source does not.

    python -m bench.paragraphs --old /tmp/shipped-build --new .        # bench/results/paragraphs.md

The paragraphs are `data/demo/para_test` (whole pages of GNOME's help held out by `build-demo`, 40–400 characters,
with their published translations as references). Each build is a folder with `models/demo/` and `adapters/`,
served by the same TranslationService code with the translation memory off, so the model answers; each direction's
paragraphs go in `translate_batch` calls of `limits.max_batch_items` (64), through the service's sentence
splitting, masking and loop guard.
Targets: en→{es,de,fr} chrF at least 15 above copying the source, en→zh 8 above, es→en and zh→en 50,
no repeated phrase.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hunyuan_mt.config import PROJECT_ROOT

from .demo_build import _service
from .report import write_results

DIRECTIONS = ("en2es", "en2de", "en2fr", "en2zh", "es2en", "de2en", "fr2en", "zh2en")


def _load(data: Path) -> dict[str, list[tuple[str, str]]]:
    items: dict[str, list[tuple[str, str]]] = {}
    for direction in DIRECTIONS:
        path = data / "para_test" / f"{direction}.jsonl"
        if not path.exists():
            raise SystemExit(f"{path} is missing: the held-out paragraphs are written by the extraction of "
                             "`python -m hunyuan_mt build-demo` (see docs/DEMO_MODEL.md)")
        items[direction] = [(r["src"], r["tgt"]) for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())]
    return items


def score_build(build: Path, items: dict[str, list[tuple[str, str]]]) -> dict[str, dict]:
    import sacrebleu

    from hunyuan_mt.demo.evaluate import new_repeats

    service = _service(build)
    rows: dict[str, dict] = {}
    try:
        for direction, pairs in items.items():
            src, tgt = direction.split("2")
            started = time.perf_counter()
            texts = [s for s, _ in pairs]
            step = service.cfg.limits.max_batch_items        # the service refuses larger batches
            outputs = [r.text for start in range(0, len(texts), step)
                       for r in service.translate_batch(texts[start:start + step], src, tgt)]
            seconds = time.perf_counter() - started
            refs = [[r for _, r in pairs]]
            chrf = sacrebleu.corpus_chrf(outputs, refs).score
            copy = sacrebleu.corpus_chrf([s for s, _ in pairs], refs).score
            looping = new_repeats(pairs, outputs, direction)
            rows[direction] = {"items": len(pairs), "copy": round(copy, 1), "chrf": round(chrf, 1),
                               "gain": round(chrf - copy, 1), "repeats": len(looping), "seconds": round(seconds, 1),
                               "samples": [{"src": pairs[i][0], "ref": pairs[i][1], "hyp": outputs[i]}
                                           for i in list(range(3)) + looping[:5]]}
            print(f"{build}: {direction} {({k: v for k, v in rows[direction].items() if k != 'samples'})}", flush=True)
    finally:
        service.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=PROJECT_ROOT / "data" / "demo", help="the extracted corpus")
    parser.add_argument("--old", type=Path, default=None, help="folder of an earlier build, scored the same way")
    parser.add_argument("--new", type=Path, default=PROJECT_ROOT, help="folder of the build to score")
    args = parser.parse_args(argv)

    items = _load(args.data)
    builds = {"new": args.new} | ({"old": args.old} if args.old else {})
    scores = {name: score_build(path, items) for name, path in builds.items()}
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = "python -m bench.paragraphs" + (" --old OLD" if args.old else "")
    lines = [f"# Held-out paragraphs through the service ({date}, `{command}`)", "",
             "Whole pages of GNOME's help held out by build-demo; translation memory off; chrF (sacrebleu) against the "
             "published translations; 'copy' scores the source itself; 'repeats' counts outputs saying a 1–4-word "
             "phrase three times in a row where the source does not.", "",
             "| direction | paragraphs | copy | " + " | ".join(f"{n} chrF | {n} gain | {n} repeats" for n in builds)
             + " |", "|---|---|---|" + "---|---|---|" * len(builds)]
    for direction in DIRECTIONS:
        first = scores["new"][direction]
        cells = " | ".join(f"{scores[n][direction]['chrf']} | {scores[n][direction]['gain']:+.1f} | "
                           f"{scores[n][direction]['repeats']}" for n in builds)
        lines.append(f"| {direction} | {first['items']} | {first['copy']} | {cells} |")
    for name in builds:
        total = sum(scores[name][d]["repeats"] for d in DIRECTIONS if d.startswith("en2"))
        count = sum(scores[name][d]["items"] for d in DIRECTIONS if d.startswith("en2"))
        lines.append(f"\n{name}: en→X outputs with a repeated phrase the source lacks: **{total} / {count}**")
    write_results("paragraphs", {"date": date, "builds": {n: str(p) for n, p in builds.items()}, "scores": scores},
                  lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
