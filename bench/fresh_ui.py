"""UI strings that no demo build ever trained on: the held-out score that two builds can be compared on when they
were trained on different extractions.

Why it exists. The demo's held-out UI strings are a seeded draw from the machine's gettext catalogues, so a machine
with other packages installed (Chromium and its dependencies, installed by `./start.sh test`, bring ten catalogues)
draws other strings. A build trained on an earlier extraction has seen many of today's held-out strings as training
pairs, and comparing it with a build trained on today's extraction favours it. This bench scores builds on strings
from Debian packages outside every extraction's sources (`packages.FRESH`), with every string that occurs anywhere in
the extraction under `--data` (any direction, training or held out) taken out.

    python -m bench.fresh_ui --build stage7=/tmp/stage7            # the shipped build against another one
    python -m bench.fresh_ui --size 1200 --build stage7=/tmp/stage7  # tighter intervals (3× the time)

The extraction's own held-out UI strings are scored beside them, to show what a build's training on them does. For
each direction: chrF of the build's own adapter and its outputs equal to the reference (the es→de row pivots through
en, as served), the copy floor, and for every build after the first its difference from the first with a 95 %
paired-bootstrap interval (the same resampled strings for both builds). The packages are downloaded with `apt-get
download` into DATA/fresh, never installed.

Results: bench/results/fresh_ui.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from hunyuan_mt.demo import packages
from hunyuan_mt.demo.corpus import ADAPTER_DIRECTIONS, LANGS, Corpus, build_corpus, load_corpus
from hunyuan_mt.demo.evaluate import _subset
from hunyuan_mt.demo.sources import gettext_catalogues

from .report import write_results

ROOT = Path(__file__).resolve().parent.parent
#: The extraction's held-out UI strings are scored on the subset build-demo's reports use (--eval-limit 300).
EXTRACTION_LIMIT = 300
DIRECTIONS = [*ADAPTER_DIRECTIONS, "es2de"]


def _norm(text: str) -> str:
    return " ".join(text.split())


def seen_strings(corpus: Corpus) -> set[str]:
    """Every source and target text of an extraction: training pairs and all held-out sets."""
    seen: set[str] = set()
    for part in (corpus.train, corpus.test, corpus.frequent, corpus.help_test, corpus.para_test, corpus.tag_test):
        for rows in part.values():
            for row in rows:
                seen.add(_norm(row[0]))
                seen.add(_norm(row[1]))
    return seen


def fresh_set(locale_root: Path, seen: set[str], size: int, seed: int = 13,
              counts: dict[str, int] | None = None) -> dict[str, list[tuple[str, str]]]:
    """Per direction, (source, reference) for up to `size` English strings translated into every demo language in
    the catalogues under `locale_root`, none of whose texts is in `seen`. The strings are chosen by the same rules
    as the build's held-out UI strings (`build_corpus`: cleaned, 2–100 characters, no protected items)."""
    every = build_corpus(gettext_catalogues(locale_root), test_size=10**9, frequent_size=0)
    best = {lang: dict(every.test[f"en2{lang}"]) for lang in LANGS}
    english = [en for en in best[LANGS[0]]
               if _norm(en) not in seen and not any(_norm(best[lang][en]) in seen for lang in LANGS)]
    if counts is not None:
        counts.update(translated=len(best[LANGS[0]]), fresh=len(english))
    chosen = sorted(random.Random(seed).sample(english, min(size, len(english))))
    test: dict[str, list[tuple[str, str]]] = {}
    for lang in LANGS:
        test[f"en2{lang}"] = [(en, best[lang][en]) for en in chosen]
        test[f"{lang}2en"] = [(best[lang][en], en) for en in chosen]
    test["es2de"] = [(best["es"][en], best["de"][en]) for en in chosen]
    return {d: test[d] for d in DIRECTIONS}


def _stats(hypotheses: list[str], references: list[str]):
    from sacrebleu.metrics import CHRF

    metric = CHRF()
    return metric, metric._extract_corpus_statistics(hypotheses, [references])


def _score(metric, stats: list[list[int]], picks: list[int] | None = None) -> float:
    rows = stats if picks is None else [stats[i] for i in picks]
    return metric._compute_score_from_stats([sum(column) for column in zip(*rows)]).score


def paired_interval(base: list[list[int]], other: list[list[int]], metric, rounds: int = 1000,
                    seed: int = 0) -> tuple[float, float]:
    """95 % interval of chrF(other) − chrF(base) over bootstrap resamples of the strings (paired: one resample, both
    builds)."""
    rng = random.Random(seed)
    n = len(base)
    deltas = []
    for _ in range(rounds):
        picks = [rng.randrange(n) for _ in range(n)]
        deltas.append(_score(metric, other, picks) - _score(metric, base, picks))
    deltas.sort()
    return deltas[int(0.025 * rounds)], deltas[int(0.975 * rounds) - 1]


def translate_build(build: Path, sets: dict[str, dict[str, list[tuple[str, str]]]],
                    threads: int) -> dict[str, dict[str, list[str]]]:
    """Per set and direction, the build's outputs through each direction's route as served (one model load)."""
    import torch

    from hunyuan_mt.demo.build import load_build
    from hunyuan_mt.demo.evaluate import translate_route

    torch.set_num_threads(threads)
    model, tokenizer = load_build(build)
    outputs: dict[str, dict[str, list[str]]] = {}
    for kind, test in sets.items():
        outputs[kind] = {d: translate_route(model, tokenizer, [s for s, _ in items], d) for d, items in test.items()}
        print(f"  {build.name or build}: {kind} done", flush=True)
    return outputs


def score_rows(test: dict[str, list[tuple[str, str]]], hypotheses: dict[str, dict[str, list[str]]]) -> list[dict]:
    """Per direction: the copy floor, each build's chrF and exact outputs, and each later build's difference from
    the first with its paired-bootstrap interval."""
    names = list(hypotheses)
    rows = []
    for direction, items in test.items():
        refs = [r for _, r in items]
        metric, copy = _stats([s for s, _ in items], refs)
        row = {"direction": direction, "items": len(items), "copy": round(_score(metric, copy), 1)}
        first = None
        for name in names:
            _, stats = _stats(hypotheses[name][direction], refs)
            row[name] = round(_score(metric, stats), 1)
            # Outputs equal to the reference: on strings a build has trained on, memorised ones show up here.
            row[f"{name} exact"] = sum(h == r for h, r in zip(hypotheses[name][direction], refs))
            if first is None:
                first = stats
                continue
            low, high = paired_interval(first, stats, metric)
            row[f"{name} - {names[0]}"] = round(row[name] - row[names[0]], 1)
            row[f"{name} - {names[0]} 95%"] = [round(low, 1), round(high, 1)]
        rows.append(row)
    return rows


def _table(rows: list[dict], names: list[str]) -> list[str]:
    lines = ["| direction | strings | copy | " + " | ".join(f"{n} (exact)" for n in names)
             + "".join(f" | {n} − {names[0]} (95 %)" for n in names[1:]) + " |",
             "|---" * (3 + 2 * len(names) - 1) + "|"]
    for row in rows:
        diffs = [(row[f"{n} - {names[0]}"], row[f"{n} - {names[0]} 95%"]) for n in names[1:]]
        lines.append(f"| {row['direction']} | {row['items']} | {row['copy']} | "
                     + " | ".join(f"{row[n]} ({row[n + ' exact']})" for n in names)
                     + "".join(f" | {d:+.1f} [{low:+.1f}, {high:+.1f}]" for d, (low, high) in diffs) + " |")
    return lines


def markdown(result: dict) -> list[str]:
    names = list(result["builds"])
    return [f"# UI strings no build trained on (`{result['command']}`)", "",
            f"{result['strings']} English strings drawn from {result['available']} that the catalogues of "
            f"{len(result['packages'])} Debian packages translate into es, de, fr and zh and that occur nowhere in "
            "the extraction (training pairs or held-out sets); chrF of each build's own adapter (es→de through en), "
            "in brackets its outputs equal to the reference; differences with a 95 % paired-bootstrap interval.",
            "", *_table(result["rows"], names), "",
            f"The extraction's own held-out UI strings ({EXTRACTION_LIMIT} per direction, as build-demo's "
            "--eval-limit draws them), for comparison: a build trained on an earlier extraction may have trained on "
            "them.", "", *_table(result["extraction_rows"], names)]


def _build_arg(value: str) -> tuple[str, Path]:
    name, _, path = value.partition("=")
    if not path:
        raise argparse.ArgumentTypeError("give a build as NAME=FOLDER (a folder with models/demo and adapters/)")
    return name, Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT / "data",
                        help="the data folder of the extraction whose strings are left out (DATA/demo)")
    parser.add_argument("--build", action="append", type=_build_arg, default=[], metavar="NAME=FOLDER",
                        help="a build to score after the shipped one (repeatable)")
    parser.add_argument("--size", type=int, default=400, help="fresh English strings drawn (default 400)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    started = time.monotonic()
    extraction = args.data / "demo"
    if not (extraction / "stats.json").exists():
        parser.error(f"no extraction in {extraction}: run build-demo --checkpoint-only --max-steps 0 first")
    root = packages.unpack_group("fresh", args.data, packages.FRESH)
    counts: dict[str, int] = {}
    corpus = load_corpus(extraction)
    test = fresh_set(root / "usr" / "share" / "locale", seen_strings(corpus), args.size, counts=counts)
    available = counts.get("fresh", 0)
    print(f"{counts.get('translated', 0)} English strings translated into every demo language; {available} of them "
          "nowhere in the extraction", flush=True)
    count = len(test["en2es"])
    if count == 0:
        raise SystemExit(f"no fresh strings under {root}: were the packages downloaded? (apt-get download)")
    print(f"{count} fresh English strings from {len(packages.FRESH)} packages", flush=True)

    sets = {"fresh": test, "extraction": {d: _subset(corpus.test[d], EXTRACTION_LIMIT) for d in DIRECTIONS}}
    builds = [("shipped", ROOT), *args.build]
    hypotheses = {name: translate_build(path, sets, args.threads) for name, path in builds}
    result = {"bench": "fresh_ui", "command": "python -m bench.fresh_ui " + " ".join(sys.argv[1:]),
              "available": available, "strings": count, "packages": list(packages.FRESH),
              "builds": {name: str(path) for name, path in builds},
              "rows": score_rows(test, {name: h["fresh"] for name, h in hypotheses.items()}),
              "extraction_rows": score_rows(sets["extraction"],
                                            {name: h["extraction"] for name, h in hypotheses.items()}),
              "seconds": round(time.monotonic() - started, 1),
              "samples": {d: [{"src": s, "ref": r, **{name: hypotheses[name]["fresh"][d][i] for name, _ in builds}}
                              for i, (s, r) in enumerate(items[:30])] for d, items in test.items()}}
    write_results("fresh_ui", result, markdown(result))
    print(f"done in {(time.monotonic() - started) / 60:.1f} min")


if __name__ == "__main__":
    main()
