"""Markup and degenerate output on the embedded model, with the baselines in the same run.

    python -m bench.markup                  # 3 runs of each; bench/results/markup.md and markup.json

1. 50 tagged strings (10 UI sentences × 5 inline-markup patterns), en→es and en→fr, `format: html`:
   how many come back with the source's tags, in order and validly nested. Baseline: the segments' translations
   rendered as the model gave them (no second pass). Ours: `documents.translate_keeping_markup`.
2. The project's README (first 20 kB, cut at a paragraph) uploaded as .md, en→es: outputs with a repetition loop
   (a unit of up to 8 words repeated 3+ times over 6+ words), the longest segment output, the markdown markers
   kept (`**`, inline code, links), and the time. Baseline: the guards off (limits.loop_repeats 0,
   limits.max_output_ratio 0). Ours: the defaults.
"""

from __future__ import annotations

import argparse
import statistics
import time
from html.parser import HTMLParser
from typing import Any

from hunyuan_mt.config import PROJECT_ROOT, load_config
from hunyuan_mt.decode.guard import LoopGuard
from hunyuan_mt.documents import read_document, translate_document, translate_keeping_markup

from .report import write_results


SENTENCES = [
    ("Click", "Save", "to keep your changes."), ("Press", "Cancel", "to close the dialog."),
    ("Open", "the file", "before you print it."), ("Choose", "a folder", "for the backup."),
    ("Type", "your password", "and press Enter."), ("Select", "all rows", "in the table."),
    ("Delete", "the old files", "from the disk."), ("Check", "the settings", "of the printer."),
    ("Save", "the document", "as a new file."), ("Close", "the window", "when you are done."),
]
PATTERNS = [
    "<p>{a} <b>{b}</b> {c}</p>",
    "<p><i>{a}</i> {b} {c}</p>",
    "<p>{a} <a href=\"#x\">{b}</a> {c}</p>",
    "<p>{a} <b><i>{b}</i></b> {c}</p>",
    "<p>{a} <em>{b}</em> <strong>{c}</strong></p>",
]
LOOPS = LoopGuard(repeats=3, max_period=8, min_span=6)


def tag_sequence(fragment: str) -> list[str] | None:
    """The fragment's tags in order, or None when they do not nest."""
    found: list[str] = []
    stack: list[str] = []
    broken = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag: str, attrs: Any) -> None:
            found.append(f"<{tag}>")
            stack.append(tag)

        def handle_endtag(self, tag: str) -> None:
            found.append(f"</{tag}>")
            if not stack or stack.pop() != tag:
                broken.append(tag)

    Tags().feed(fragment)
    return None if broken or stack else found


def tagged_strings() -> list[str]:
    return [p.format(a=a, b=b, c=c) for a, b, c in SENTENCES for p in PATTERNS]


def markup_run(service: Any, limits: Any, target: str) -> dict[str, int]:
    kept = {"baseline": 0, "ours": 0}
    for html in tagged_strings():
        document = read_document(html.encode(), "q.html", limits)
        translate = lambda segments, _p=None: service.translate_segments(segments, "en", target)  # noqa: E731
        baseline = document.render(translate(document.segments)).data.decode("utf-8")
        ours_t = translate_keeping_markup(document, translate).translations
        ours = document.render(ours_t).data.decode("utf-8")
        expected = tag_sequence(html)
        kept["baseline"] += tag_sequence(baseline) == expected
        kept["ours"] += tag_sequence(ours) == expected
    return kept


def readme_sample() -> bytes:
    data = (PROJECT_ROOT / "README.md").read_bytes()[:20000]
    return data[:data.rfind(b"\n\n")]


def markers(text: str) -> dict[str, int]:
    return {"**": text.count("**"), "`": text.count("`"), "](": text.count("](")}


def readme_run(guarded: bool) -> dict[str, Any]:
    from hunyuan_mt.service.translation import TranslationService

    overrides: dict[str, Any] = {"model.warmup": False, "memory.enabled": False}
    if not guarded:
        overrides.update({"limits.loop_repeats": 0, "limits.max_output_ratio": 0})
    service = TranslationService(load_config(None, overrides, env={}))
    try:
        outputs: list[str] = []

        def run(segments: list[str], report: Any) -> list[str]:
            result = service.translate_segments(segments, "en", "es", progress=report)
            outputs.extend(result)
            return result

        source = readme_sample()
        started = time.perf_counter()
        rendered = translate_document(source, "README.md", service.cfg.limits, run, target="es")
        elapsed = time.perf_counter() - started
        engine = service.status()["engine"]
        src_markers, out_markers = markers(source.decode("utf-8")), markers(rendered.data.decode("utf-8"))
        return {"segments": len(outputs), "seconds": elapsed,
                "loops": sum(LOOPS.has_loop(o.split()) for o in outputs),
                "longest_chars": max(len(o) for o in outputs),
                "loops_cut": engine.get("loops_cut"), "length_capped": engine.get("length_capped"),
                "markers_source": src_markers, "markers_output": out_markers}
    finally:
        service.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    from hunyuan_mt.service.translation import TranslationService

    cfg = load_config(None, {"model.warmup": False, "memory.enabled": False}, env={})
    service = TranslationService(cfg)
    try:
        markup = {t: markup_run(service, cfg.limits, t) for t in ("es", "fr")}
    finally:
        service.close()
    readme = {label: [readme_run(label == "ours") for _ in range(args.runs)] for label in ("baseline", "ours")}
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "tagged_strings": len(tagged_strings()),
              "markup": markup, "readme": readme}
    lines = [f"# Markup and degenerate output ({result['date']}, `python -m bench.markup --runs {args.runs}`)", "",
             f"Tagged strings (`format: html`, {len(tagged_strings())} per target): tags back in order and validly "
             "nested", "", "| target | baseline (as the model gave them) | ours (translate_keeping_markup) |",
             "|---|---|---|"]
    for target, kept in markup.items():
        n = len(tagged_strings())
        lines.append(f"| en→{target} | {kept['baseline']}/{n} | {kept['ours']}/{n} |")
    lines += ["", "README.md (first 20 kB) as .md, en→es, median of the runs", "",
              "| | outputs with a loop | longest output (chars) | seconds | loops cut | length-capped | "
              "`**` / `` ` `` / `](` in output (source) |", "|---|---|---|---|---|---|---|"]
    for label, runs in readme.items():
        first = runs[0]
        src, out = first["markers_source"], first["markers_output"]
        lines.append(
            f"| {label} | {statistics.median(r['loops'] for r in runs):g} | "
            f"{statistics.median(r['longest_chars'] for r in runs):g} | "
            f"{statistics.median(r['seconds'] for r in runs):.1f} | {first['loops_cut']} | {first['length_capped']} | "
            f"{out['**']} / {out['`']} / {out['](']} ({src['**']} / {src['`']} / {src['](']}) |")
    write_results("markup", result, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
