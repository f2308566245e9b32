"""Symbols, prices, keys, paths: protect them as spans, or let the model see them and put back what it drops?

    python -m bench.protected            # the corpus of tests/data/protected_items.tsv, every reachable direction

Three ways, on the embedded demo model, through the real service (masking, memory, engine):
- `before`: the masking without ADDED's patterns (placeholders, tags, URLs, e-mails, numbers, code);
- `restore`: the same masking, then each item the output lacks put back (at the start when it led the source,
  else before the final punctuation), the way masking.restore puts back a dropped sentinel;
- `protect`: the items are spans too (masking.py now).

Reported per way: items kept (each item of each string must come back as often as it went in), strings with every
item kept, and how much the items disturb the rest: chrF of the output with its items removed against the output
for the same string with the items removed from the source (100 = the items changed nothing else).
Results: bench/results/protected.{json,md}.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from hunyuan_mt.text import masking
from hunyuan_mt.config import PROJECT_ROOT, load_config

from .report import write_results

CORPUS = PROJECT_ROOT / "tests" / "data" / "protected_items.tsv"
#: Patterns added to masking._PATTERNS after the first version; `before` masks without them.
ADDED = (masking._KEYS, masking._PRICE, masking._PATH, masking._ISO_DATE, masking._OPAQUE, masking._SYMBOLS)


def read_corpus(path: Path = CORPUS) -> list[tuple[str, str, list[str]]]:
    """(language, text, items) per line of the corpus."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        lang, text, items = line.split("\t")
        rows.append((lang, text, items.split(" ‖ ")))
    return rows


def directions(service: Any, lang: str) -> list[str]:
    return [t for t in service.router.reachable_targets(lang) if t in {"en", "es", "de", "fr", "zh"}]


def kept(text: str, out: str, items: list[str]) -> list[bool]:
    return [out.count(item) == text.count(item) for item in items]


def put_back(text: str, out: str, items: list[str]) -> str:
    for item in items:
        missing = text.count(item) - out.count(item)
        for _ in range(max(0, missing)):
            if text.lstrip().startswith(item):
                out = f"{item} {out}"
            else:
                end = re.search(r"[.!?。！？]+\s*$", out)
                out = f"{out[:end.start()].rstrip()} {item}{out[end.start():]}" if end else f"{out} {item}"
    return out


def strip_items(text: str, items: list[str]) -> str:
    for item in sorted(items, key=len, reverse=True):
        text = text.replace(item, " ")
    return re.sub(r"\s+", " ", text).strip()


def run(service: Any, rows: list[tuple[str, str, list[str]]], way: str) -> dict[str, Any]:
    import sacrebleu

    original = masking._SPAN
    if way in ("before", "restore"):
        masking._SPAN = re.compile("|".join(f"(?:{p})" for p in masking._PATTERNS if p not in ADDED), re.S)
    try:
        total = good = strings = whole = 0
        hyps: list[str] = []
        refs: list[str] = []
        for lang in sorted({r[0] for r in rows}):
            mine = [r for r in rows if r[0] == lang]
            for tgt in directions(service, lang):
                outs = [r.text for r in service.translate_batch([t for _, t, _ in mine], lang, tgt)]
                clean = [r.text for r in service.translate_batch([strip_items(t, i) for _, t, i in mine], lang, tgt)]
                for (_, text, items), out, ref in zip(mine, outs, clean):
                    if way == "restore":
                        out = put_back(text, out, items)
                    flags = kept(text, out, items)
                    total += len(flags)
                    good += sum(flags)
                    strings += 1
                    whole += all(flags)
                    hyps.append(strip_items(out, items))
                    refs.append(ref)
    finally:
        masking._SPAN = original
    chrf = sacrebleu.corpus_chrf(hyps, [refs]).score
    return {"way": way, "items": total, "kept": good, "strings": strings, "whole": whole, "chrf_rest": round(chrf, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.protected", description=__doc__.split("\n")[0])
    parser.parse_args(argv)
    from hunyuan_mt.service.translation import TranslationService

    cfg = load_config(None, {"model.warmup": False, "memory.enabled": False})
    service = TranslationService(cfg)
    rows = read_corpus()
    results = [run(service, rows, way) for way in ("before", "restore", "protect")]
    service.close()
    lines = ["# Protected items (`python -m bench.protected`)", "",
             f"{len(rows)} strings of tests/data/protected_items.tsv, every reachable direction among en, es, de, fr, "
             "zh; embedded demo model.", "",
             "| way | items kept | strings with every item | chrF of the rest vs the item-free source's output |",
             "|---|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['way']} | {r['kept']}/{r['items']} ({100 * r['kept'] / r['items']:.1f} %) | "
                     f"{r['whole']}/{r['strings']} | {r['chrf_rest']} |")
    write_results("protected", {"results": results}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
