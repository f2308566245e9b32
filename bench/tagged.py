"""Formatted words in documents: held-out tagged segments of the demo's extraction
(`data/demo/tag_test`, blocks of the manuals' held-out pages with their inline markup) written as real HTML and
.docx files, translated through the service's document path, and read back.

    python -m bench.tagged                                   # the shipped demo, markup as sentinels and spaced
    python -m bench.tagged --build new=/tmp/stage9 --limit 80

A segment's pieces between its markup sentinels become alternately plain and formatted: `<b>` in HTML, a bold run
in .docx and .pptx, a bold `text:span` in .odt, a `<g>` code pair in XLIFF 1.2. Per formatted piece whose reference differs from its source (the translator changed the words), it counts
whether the output's formatted text differs from the source's too (the word was translated, not copied), and per
document whether every formatted element came back. chrF of the whole segment (markup taken out) against the
reference says whether the rest of the sentence held up. A segment is used when its sentinels pair up (an even count,
words between each pair); inline code read as a single sentinel can still pass for half a pair, a little noise.

Results: bench/results/tagged.{json,md}.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import time
from pathlib import Path
from typing import Any

from hunyuan_mt.text.masking import WORD

from .demo_build import _service
from .report import write_results

SENTINEL = re.compile(r"⟦\d+⟧")


def usable(segment: str) -> list[str] | None:
    """The segment's pieces between sentinels when they pair up (odd pieces are the formatted ones), else None."""
    pieces = SENTINEL.split(segment)
    if len(pieces) < 3 or len(pieces) % 2 == 0:
        return None
    if not all(WORD.search(p) for p in pieces[1::2]):
        return None
    return [" ".join(p.split()) if i % 2 else p for i, p in enumerate(pieces)]


def _norm(text: str) -> str:
    return " ".join(text.split()).strip(" .,:;!?").lower()


def html_file(segments: list[list[str]]) -> bytes:
    from html import escape

    body = "".join("<p>" + "".join(f"<b>{escape(p)}</b>" if i % 2 else escape(p) for i, p in enumerate(pieces))
                   + "</p>\n" for pieces in segments)
    return f'<html><head><meta charset="utf-8"></head><body>\n{body}</body></html>'.encode("utf-8")


def html_read(data: bytes) -> list[tuple[list[str], str]]:
    """Per paragraph: its bold texts in order, and its whole text."""
    from lxml import html

    root = html.fromstring(data.decode("utf-8"))
    return [([b.text_content() for b in p.iter("b")], p.text_content()) for p in root.iter("p")]


def docx_file(segments: list[list[str]]) -> bytes:
    import docx

    document = docx.Document()
    for pieces in segments:
        paragraph = document.add_paragraph()
        for i, piece in enumerate(pieces):
            if piece:
                paragraph.add_run(piece).bold = bool(i % 2)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def docx_read(data: bytes) -> list[tuple[list[str], str]]:
    import docx

    document = docx.Document(io.BytesIO(data))
    return [(_bold_groups([(run.text, bool(run.bold)) for run in paragraph.runs]), paragraph.text)
            for paragraph in document.paragraphs]


def _bold_groups(runs: list[tuple[str, bool]]) -> list[str]:
    """The texts of consecutive bold runs, one per group (a format may split a group into several runs)."""
    groups: list[str] = []
    previous = False
    for text, bold in runs:
        if bold and previous:
            groups[-1] += text
        elif bold:
            groups.append(text)
        previous = bold
    return groups


def pptx_file(segments: list[list[str]]) -> bytes:
    from pptx import Presentation
    from pptx.util import Inches

    deck = Presentation()
    for start in range(0, len(segments), 10):   # ten paragraphs a slide
        frame = deck.slides.add_slide(deck.slide_layouts[6]).shapes.add_textbox(
            Inches(0.5), Inches(0.5), Inches(9), Inches(6)).text_frame
        for n, pieces in enumerate(segments[start:start + 10]):
            paragraph = frame.paragraphs[0] if n == 0 else frame.add_paragraph()
            for i, piece in enumerate(pieces):
                if piece:
                    run = paragraph.add_run()
                    run.text = piece
                    run.font.bold = bool(i % 2)
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def pptx_read(data: bytes) -> list[tuple[list[str], str]]:
    from pptx import Presentation

    found = []
    for slide in Presentation(io.BytesIO(data)).slides:
        for shape in slide.shapes:
            for paragraph in shape.text_frame.paragraphs:
                runs = [(run.text, bool(run.font.bold)) for run in paragraph.runs]
                found.append((_bold_groups(runs), "".join(t for t, _ in runs)))
    return found


_ODF = {"office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
        "text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
        "style": "urn:oasis:names:tc:opendocument:xmlns:style:1.0",
        "fo": "urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0"}


def odt_file(segments: list[list[str]]) -> bytes:
    import zipfile
    from html import escape

    decls = " ".join(f'xmlns:{k}="{v}"' for k, v in _ODF.items())
    body = "".join("<text:p>" + "".join(f'<text:span text:style-name="B">{escape(p)}</text:span>' if i % 2
                                        else escape(p) for i, p in enumerate(pieces)) + "</text:p>"
                   for pieces in segments)
    content = (f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {decls} office:version="1.3">'
               '<office:automatic-styles><style:style style:name="B" style:family="text">'
               '<style:text-properties fo:font-weight="bold"/></style:style></office:automatic-styles>'
               f"<office:body><office:text>{body}</office:text></office:body></office:document-content>")
    media = "application/vnd.oasis.opendocument.text"
    manifest = ('<manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0" '
                f'manifest:version="1.3"><manifest:file-entry manifest:full-path="/" manifest:media-type="{media}"/>'
                '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/>'
                "</manifest:manifest>")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("mimetype", media, compress_type=zipfile.ZIP_STORED)
        zf.writestr("content.xml", content)
        zf.writestr("META-INF/manifest.xml", manifest)
    return out.getvalue()


def odt_read(data: bytes) -> list[tuple[list[str], str]]:
    import zipfile

    from lxml import etree

    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        root = etree.fromstring(zf.read("content.xml"))
    found = []
    for paragraph in root.iter(f"{{{_ODF['text']}}}p"):
        spans = ["".join(span.itertext()) for span in paragraph.iter(f"{{{_ODF['text']}}}span")]
        found.append((spans, "".join(paragraph.itertext())))
    return found


def xliff_file(segments: list[list[str]]) -> bytes:
    from html import escape

    units = "".join(f'<trans-unit id="u{n}"><source>' + "".join(
        f'<g id="{i}">{escape(p)}</g>' if i % 2 else escape(p) for i, p in enumerate(pieces)) + "</source></trans-unit>"
        for n, pieces in enumerate(segments))
    return ('<?xml version="1.0" encoding="UTF-8"?><xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">'
            f'<file source-language="en" datatype="plaintext" original="held"><body>{units}</body></file></xliff>'
            ).encode("utf-8")


def xliff_read(data: bytes) -> list[tuple[list[str], str]]:
    from lxml import etree

    ns = "{urn:oasis:names:tc:xliff:document:1.2}"
    found = []
    for unit in etree.fromstring(data).iter(f"{ns}trans-unit"):
        target = unit.find(f"{ns}target")
        found.append(([] if target is None else ["".join(g.itertext()) for g in target.iter(f"{ns}g")],
                      "" if target is None else "".join(target.itertext())))
    return found


FORMATS = {"html": (html_file, html_read, "held.html"), "docx": (docx_file, docx_read, "held.docx"),
           "pptx": (pptx_file, pptx_read, "held.pptx"), "odt": (odt_file, odt_read, "held.odt"),
           "xliff": (xliff_file, xliff_read, "held.xlf")}


def measure(service: Any, direction: str, rows: list[tuple[list[str], list[str]]], fmt: str) -> dict[str, Any]:
    from hunyuan_mt.documents.reader import translate_document
    from hunyuan_mt.demo.evaluate import chrf

    make, read, name = FORMATS[fmt]
    src, tgt = direction.split("2")
    sources = [s for s, _ in rows]
    started = time.perf_counter()
    rendered = translate_document(make(sources), name, service.cfg.limits,
                                  lambda segs, progress: service.translate_segments(segs, src, tgt, progress))
    seconds = time.perf_counter() - started
    back = read(rendered.data)
    should = translated = kept = 0
    hyps, refs = [], []
    for (source, reference), (bold, whole) in zip(rows, back):
        formatted = [(s, r) for s, r in zip(source[1::2], reference[1::2])]
        kept += len(bold) == len(formatted)
        for k, (s, r) in enumerate(formatted):
            if _norm(s) != _norm(r):
                should += 1
                translated += k < len(bold) and _norm(bold[k]) != _norm(s) and bool(_norm(bold[k]))
        hyps.append(" ".join(whole.split()))
        refs.append(" ".join("".join(reference).split()))
    return {"segments": len(rows), "formatted_to_translate": should, "translated": translated,
            "translated_pct": round(100 * translated / should, 1) if should else None,
            "tags_kept_pct": round(100 * kept / len(rows), 1) if rows else None,
            "chrf": chrf(hyps, refs), "seconds": round(seconds, 2), "note": rendered.note}


def held_out(data: Path, direction: str, limit: int) -> list[tuple[list[str], list[str]]]:
    rows = []
    for line in (data / "tag_test" / f"{direction}.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        source, reference = usable(record["src"]), usable(record["tgt"])
        if source and reference and len(source) == len(reference):
            rows.append((source, reference))
    return rows[:limit]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tagged", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("data/demo"), help="the extraction (its tag_test)")
    parser.add_argument("--build", action="append", default=[], metavar="NAME=ROOT",
                        help="a demo build to score (ROOT holds models/demo and adapters/); default: the project's")
    parser.add_argument("--form", action="append", default=[], choices=["sentinels", "spaced"],
                        help="model.markup to run (default: both)")
    parser.add_argument("--limit", type=int, default=60, help="segments per direction and format")
    parser.add_argument("--directions", default="en2es,en2de,en2fr,en2zh,es2en,de2en,fr2en,zh2en")
    parser.add_argument("--name", default="tagged", help="results file name under bench/results")
    parser.add_argument("--formats", default=",".join(FORMATS), help="of " + ", ".join(FORMATS))
    args = parser.parse_args(argv)
    from hunyuan_mt.config import PROJECT_ROOT

    builds = dict(b.split("=", 1) for b in args.build) or {"shipped": str(PROJECT_ROOT)}
    forms = args.form or ["sentinels", "spaced"]
    directions = args.directions.split(",")
    results: dict[str, Any] = {}
    for build, root in builds.items():
        for form in forms:
            service = _service(Path(root), {"model.warmup": False, "model.markup": form})
            try:
                for direction in directions:
                    rows = held_out(args.data, direction, args.limit)
                    for fmt in args.formats.split(","):
                        key = f"{build}/{form}/{direction}/{fmt}"
                        results[key] = measure(service, direction, rows, fmt)
                        print(key, {k: v for k, v in results[key].items() if k != "note"}, flush=True)
            finally:
                service.close()
    lines = ["# Formatted words in held-out tagged segments (`python -m bench.tagged`)", "",
             "Per build and markup form: formatted pieces whose reference changed them, and the share the output "
             "changed too; formatted elements kept; chrF of the whole segment.", "",
             "| build | markup | direction | format | segments | formatted to translate | translated | tags kept | chrF |",
             "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for key, r in results.items():
        build, form, direction, fmt = key.split("/")
        lines.append(f"| {build} | {form} | {direction} | {fmt} | {r['segments']} | {r['formatted_to_translate']} | "
                     f"{r['translated_pct']} % | {r['tags_kept_pct']} % | {r['chrf']} |")
    write_results(args.name, {"builds": builds, "limit": args.limit, "results": results}, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
