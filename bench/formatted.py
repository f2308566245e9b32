"""Formatted sentences against their untagged form: is a sentence with a bold word or a link translated as well as
the same sentence without the markup?

    python -m bench.formatted                 # the shipped demo; bench/results/formatted.{json,md}
    python -m bench.formatted --build-set     # write bench/data/formatted.tsv again from the held-out strings

The set (bench/data/formatted.tsv) is built from each direction's standing held-out UI strings
(`adapters/<pair>/heldout.tsv`, kept out of training): strings of 3 to 20 words with no placeholder, number or
markup of their own, one or two runs of 1-2 words wrapped in inline HTML (`<b>`, `<i>`, `<u>`, `<a href="#">`,
`<b><i>`; in Chinese, runs of two characters), drawn with a fixed seed. Each row goes through the REST API's `format=html` path in process
(`documents.translate_keeping_markup` over the service), once as written and once with its tags taken out. Reported
per direction: corpus chrF (sacrebleu) of both against the references, the formatted one with its tags taken out;
the same for the tagged translation alone (the model shown the markup, as formatted text was translated before);
how many came back with the source's tags in order; how many had their markup placed by alignment (and of those,
weakly: marked for review) and how many went piece by piece.
"""

from __future__ import annotations

import argparse
import html
import random
import re
import time
from pathlib import Path
from typing import Any

from hunyuan_mt.config import PROJECT_ROOT

from .report import write_results

SET = PROJECT_ROOT / "bench" / "data" / "formatted.tsv"
DIRECTIONS = ("en2es", "en2de", "en2fr", "en2zh", "es2en", "de2en", "fr2en", "zh2en")
PER_DIRECTION = 60
SEED = 67
PATTERNS = ("<b>{}</b>", "<i>{}</i>", "<u>{}</u>", '<a href="#">{}</a>', "<b><i>{}</i></b>")
#: chrF points a formatted sentence may lose against its untagged form.
TOLERANCE = 2.0
_TAG = re.compile(r"<[^<>]+>")
_WORDS = re.compile(r"\S+")


_LETTERS = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*")
_HAN = re.compile(r"[\u4e00-\u9fff]+")


def _words(text: str, zh: bool) -> list[tuple[int, int]]:
    """Where a run of markup may go: words (letters, punctuation left out), or in Chinese pairs of characters."""
    if not zh:
        return [(m.start(), m.end()) for m in _LETTERS.finditer(text)]
    return [(pos, pos + 2) for m in _HAN.finditer(text) for pos in range(m.start(), m.end() - 1, 2)]


def _usable(source: str, zh: bool) -> bool:
    from hunyuan_mt.text.masking import protect

    if any(ch in source for ch in "<>&⟦⟧\t") or protect(source).spans:
        return False
    if zh:
        return not re.search(r"[A-Za-z]", source) and 6 <= len(source) <= 40
    return 3 <= len(_words(source, False)) <= 20


def build_set(root: Path = PROJECT_ROOT) -> list[tuple[str, str, str]]:
    """(direction, formatted source, reference) rows, the same every time for the same held-out files."""
    from hunyuan_mt.store.tm import read_rows

    rng = random.Random(SEED)
    rows: list[tuple[str, str, str]] = []
    for direction in DIRECTIONS:
        src, tgt = direction.split("2")
        path = root / "adapters" / direction / "heldout.tsv"
        pairs = [p for p in read_rows(path.read_bytes(), path.name, src, tgt) if _usable(p[0], src == "zh")]
        for source, reference in rng.sample(pairs, min(PER_DIRECTION, len(pairs))):
            words = _words(source, src == "zh")
            runs = 2 if len(words) >= 6 and rng.random() < 0.25 else 1
            chosen: list[tuple[int, int]] = []
            for k in range(runs):
                part = words[k * len(words) // runs:(k + 1) * len(words) // runs]
                first = rng.randrange(len(part))
                last = min(len(part) - 1, first + rng.randrange(2))
                chosen.append((part[first][0], part[last][1]))
            out, pos = [], 0
            for start, end in chosen:
                out += [html.escape(source[pos:start], quote=False),
                        rng.choice(PATTERNS).format(html.escape(source[start:end], quote=False))]
                pos = end
            out.append(html.escape(source[pos:], quote=False))
            rows.append((direction, "".join(out), reference))
    return rows


def read_set(path: Path = SET) -> list[tuple[str, str, str]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        direction, source, reference = line.split("\t")
        rows.append((direction, source, reference))
    return rows


def write_set(rows: list[tuple[str, str, str]], path: Path = SET) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = ("# Formatted held-out UI strings for `python -m bench.formatted` (built by `--build-set` from "
              "adapters/<pair>/heldout.tsv, seed 67):\n# direction<TAB>source with inline HTML<TAB>reference\n")
    path.write_text(header + "".join(f"{d}\t{s}\t{r}\n" for d, s, r in rows), encoding="utf-8")


def plain(fragment: str) -> str:
    """A fragment's text: tags out, entities read, whitespace as HTML shows it."""
    return " ".join(html.unescape(_TAG.sub("", fragment)).split())


def tags(fragment: str) -> list[str]:
    return [t.split()[0].strip("<>/") + ("/" if t.startswith("</") else "") for t in _TAG.findall(fragment)]


def translate_html(service: Any, fragment: str, src: str, tgt: str) -> tuple[str, Any]:
    """A fragment through the REST API's format=html path, in process: (html, KeptMarkup)."""
    from hunyuan_mt.documents import read_document, translate_keeping_markup

    document = read_document(fragment.encode("utf-8"), "fragment.html", service.cfg.limits)
    origins: dict[str, str] = {}
    kept = translate_keeping_markup(
        document, lambda segments, _progress: service.translate_segments(segments, src, tgt, origins=origins),
        origins=origins)
    return document.render(kept.translations, tgt).data.decode("utf-8"), kept


def tagged_pass(service: Any, fragment: str, src: str, tgt: str) -> str:
    """The fragment as the model translates it shown the markup, rendered as it came (how formatted text read
    before its sentence was translated whole)."""
    from hunyuan_mt.documents import read_document

    document = read_document(fragment.encode("utf-8"), "fragment.html", service.cfg.limits)
    return document.render(service.translate_segments(document.segments, src, tgt), tgt).data.decode("utf-8")


def measure(service: Any, rows: list[tuple[str, str, str]]) -> dict[str, dict[str, Any]]:
    import sacrebleu

    table: dict[str, dict[str, Any]] = {}
    for direction in DIRECTIONS:
        mine = [(s, r) for d, s, r in rows if d == direction]
        if not mine:
            continue
        src, tgt = direction.split("2")
        started = time.perf_counter()
        formatted, untagged, tagged, refs = [], [], [], []
        in_order = aligned = unsure = pieces = 0
        for source, reference in mine:
            out, kept = translate_html(service, source, src, tgt)
            formatted.append(plain(out))
            in_order += tags(out) == tags(source)
            aligned += kept.aligned
            unsure += kept.unsure
            pieces += kept.redone
            untagged.append(plain(translate_html(service, html.escape(plain(source), quote=False), src, tgt)[0]))
            tagged.append(plain(tagged_pass(service, source, src, tgt)))
            refs.append(reference)
        chrf_formatted = sacrebleu.corpus_chrf(formatted, [refs]).score
        chrf_untagged = sacrebleu.corpus_chrf(untagged, [refs]).score
        chrf_tagged = sacrebleu.corpus_chrf(tagged, [refs]).score
        table[direction] = {
            "rows": len(mine), "chrf_formatted": round(chrf_formatted, 2), "chrf_untagged": round(chrf_untagged, 2),
            "delta": round(chrf_formatted - chrf_untagged, 2), "chrf_tagged_pass": round(chrf_tagged, 2),
            "tags_in_order": in_order, "aligned": aligned, "unsure": unsure,
            "pieces": pieces, "same_text": sum(f == u for f, u in zip(formatted, untagged)),
            "seconds": round(time.perf_counter() - started, 1)}
        print(direction, table[direction], flush=True)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.formatted", description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-set", action="store_true", help="write bench/data/formatted.tsv and stop")
    parser.add_argument("--config", default=None, help="profile (default: the demo)")
    args = parser.parse_args(argv)
    if args.build_set:
        rows = build_set()
        write_set(rows)
        print(f"{len(rows)} rows → {SET}")
        return 0
    from hunyuan_mt.config import load_config
    from hunyuan_mt.service.translation import TranslationService

    from .hunyuan_cpu import cpu_line

    # The memory off: the shipped memory holds some held-out strings, which would answer the untagged form alone.
    service = TranslationService(load_config(args.config, {"model.warmup": False, "memory.enabled": False,
                                                           "tm.enabled": False}, env={}))
    try:
        table = measure(service, read_set())
    finally:
        service.close()
    loss = max(0.0, *(-row["delta"] for row in table.values()))
    lines = [f"`python -m bench.formatted`; CPU: {cpu_line()}; the shipped demo, translation memory off.", "",
             "| direction | rows | chrF untagged | chrF formatted (tags out) | Δ | within "
             f"{TOLERANCE:g} | chrF of the tagged pass alone | tags in order | aligned (weak) | piece by piece | "
             "same text | seconds |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in table.items():
        mark = "✓" if row["delta"] >= -TOLERANCE else "✗"
        lines.append(f"| {name} | {row['rows']} | {row['chrf_untagged']} | {row['chrf_formatted']} | {row['delta']} | "
                     f"{mark} | {row['chrf_tagged_pass']} | {row['tags_in_order']} | {row['aligned']} ({row['unsure']}) | {row['pieces']} | {row['same_text']} | "
                     f"{row['seconds']} |")
    lines += ["", f"Largest loss against the untagged form: {loss:.2f} chrF points."]
    write_results("formatted", {"cpu": cpu_line(), "directions": table, "tolerance": TOLERANCE}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
