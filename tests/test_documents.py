"""Documents: a round trip per format keeps the structure, and every bad upload gets a clear typed error.

The translator here is a plain function (upper-casing, or a dict): documents do not depend on the model, only on
`translate_segments(segments, progress) -> translations`.
"""

from __future__ import annotations

import io
import random
import struct
import zipfile
import zlib
from dataclasses import replace
from pathlib import Path

import docx
import pytest
import srt
from docx.shared import Inches
from pypdf import PdfReader, PdfWriter
from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

from bench.markup import tag_sequence
from hunyuan_mt.config import LimitsConfig
from hunyuan_mt.documents import SUPPORTED_EXTENSIONS, read_document, translate_document
from hunyuan_mt.documents.base import needs_translation
from hunyuan_mt.documents.pdf import paragraphs_of
from hunyuan_mt.documents.runs import distribute
from hunyuan_mt.errors import InputTooLarge, InvalidInput, UnsupportedDocument

LIMITS = LimitsConfig()


def upper(segments: list[str], progress=None) -> list[str]:
    return [s.upper() for s in segments]


def identity(segments: list[str], progress=None) -> list[str]:
    return list(segments)


def assert_clean_segments(segments: list[str]) -> None:
    """What is sent to the model: stripped, non-empty, with letters (no whitespace, numbers or code alone)."""
    assert segments
    for s in segments:
        assert s == s.strip() and s, repr(s)
        assert needs_translation(s), repr(s)


# ------------------------------------------------------------------------------------------------------------------
# Fixture builders: real files made with the real libraries, in memory.


def make_docx(*, image_only: bool = False, with_image: bool = False) -> bytes:
    d = docx.Document()
    if image_only:
        d.add_picture(io.BytesIO(tiny_png()), width=Inches(1))
    else:
        d.add_heading("Annual report", level=1)
        p = d.add_paragraph("Sales grew ")
        bold = p.add_run("much faster")
        bold.bold = True
        p.add_run(" than planned.")
        table = d.add_table(rows=2, cols=2)
        table.style = "Table Grid"
        for (r, c), text in {(0, 0): "Region", (0, 1): "Result", (1, 0): "North", (1, 1): "42"}.items():
            table.cell(r, c).text = text
        d.add_paragraph("   ")
        d.sections[0].header.paragraphs[0].text = "Confidential draft"
        if with_image:
            d.add_picture(io.BytesIO(tiny_png()), width=Inches(1))
    buf = io.BytesIO()
    d.save(buf)
    return buf.getvalue()


def tiny_png() -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # 1×1, 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00"))
            + chunk(b"IEND", b""))


def make_pdf(pages: list[list[str]], user_password: str | None = None, owner_password: str | None = None) -> bytes:
    """A PDF with a real text layer: Helvetica text drawn by a content stream; '' is an empty line (a gap)."""
    writer = PdfWriter()
    for lines in pages:
        page = writer.add_blank_page(612, 792)
        font = DictionaryObject({NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
                                 NameObject("/BaseFont"): NameObject("/Helvetica")})
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})})
        ops = ["BT /F1 12 Tf 14 TL 72 720 Td"]
        ops += ["T*" if not line else f"({line}) Tj T*" for line in lines]
        ops.append("ET")
        stream = DecodedStreamObject()
        stream.set_data(" ".join(ops).encode("latin-1"))
        page.replace_contents(stream)
    if user_password is not None or owner_password is not None:
        writer.encrypt(user_password or "", owner_password=owner_password, algorithm="AES-128")
    buf = io.BytesIO()
    writer.write(buf)
    return buf.getvalue()


SRT = """1
00:00:01,000 --> 00:00:02,500
Hello there,
my old friend.

2
00:00:03,000 --> 00:00:04,250 X1:100 X2:200
- Are you coming?
- Not today.

7
00:01:05,040 --> 00:01:07,999
♪ ♪

8
01:02:03,004 --> 01:02:05,000
<i>The end.</i>
"""

MARKDOWN = """---
title: Release notes
tags: [a, b]
---
# Release notes #

Install it with `pip install thing` and read [the guide](https://example.com/guide).

> A quoted remark.

- First item
- Second item with **bold**

1. Numbered step

| Name | Meaning |
|------|---------|
| a \\| b | Pipe inside |

```python
def hello():
    return "do not translate"
```

    indented code stays too

<div class="note">raw html block</div>

`only_code()`

Hard break  
next line
"""

HTML = """<!DOCTYPE html>
<html><head><title>My page</title>
<style>p { color: red }</style><script>var greeting = "hello";</script></head>
<body>
<!-- a comment -->
<h1 class="t">Welcome &amp; hello</h1>
<p>Hello <b>world</b>, see <a href="https://x.example/docs">the docs</a>.<br>
Next line</p>
<pre>keep this</pre><code>and this</code><p translate="no">BrandName</p>
<p>Caf&eacute; &lt;tag&gt; 3 &gt; 2</p>
</body></html>
"""


# ------------------------------------------------------------------------------------------------------------------
# Round trips


def test_txt_round_trip_keeps_paragraphs_and_layout():
    text = "Title line\n\n  Indented paragraph here.\n\n\n- one\n- two\n\n12345\n"
    doc = read_document(text.encode(), "notes.txt", LIMITS)
    assert doc.segments == ["Title line", "Indented paragraph here.", "- one", "- two"]
    assert doc.render(doc.segments).data.decode() == text  # byte-identical when nothing changes
    out = translate_document(text.encode(), "notes.txt", LIMITS, upper, target="es")
    assert out.data.decode() == "TITLE LINE\n\n  INDENTED PARAGRAPH HERE.\n\n\n- ONE\n- TWO\n\n12345\n"
    assert (out.filename, out.media_type) == ("notes.es.txt", "text/plain; charset=utf-8")


def test_txt_hard_wrapped_prose_is_one_segment():
    text = ("This is a long sentence that was wrapped by an editor at\n"
            "a fixed width and continues here.\r\n\r\nNext.\r\n")
    doc = read_document(text.encode(), "wrapped.txt", LIMITS)
    assert doc.segments == ["This is a long sentence that was wrapped by an editor at a fixed width and continues "
                            "here.", "Next."]
    assert doc.render(["Uno.", "Dos."]).data.decode() == "Uno.\r\n\r\nDos.\r\n"


def test_txt_encodings_utf8_bom_utf16_and_detected_cp1252():
    text = "Première ligne, déjà vue.\n\nDeuxième paragraphe à traduire.\n"
    bom = read_document(b"\xef\xbb\xbf" + text.encode(), "a.txt", LIMITS)
    assert bom.segments[0] == "Première ligne, déjà vue."
    assert bom.render(bom.segments).data == b"\xef\xbb\xbf" + text.encode()
    utf16 = read_document(text.encode("utf-16"), "b.txt", LIMITS)
    assert utf16.segments == bom.segments
    assert utf16.render(utf16.segments).data == b"\xef\xbb\xbf" + text.encode()  # output is UTF-8

    legacy = ("Le café était très chaud, et la crème brûlée délicieuse. Où êtes-vous allés après le dîner? "
              "Nous étions à l'hôtel près de la forêt, où l'été dure longtemps.\n").encode("cp1252")
    doc = read_document(legacy, "c.txt", LIMITS)
    assert doc.segments[0].startswith("Le café était très chaud")
    rendered = doc.render(doc.segments)
    assert rendered.data.decode("utf-8") == legacy.decode("cp1252")
    assert "saved as UTF-8" in rendered.note


def test_markdown_round_trip_leaves_code_front_matter_and_syntax():
    calls: list[list[str]] = []

    def record(segments, progress=None):
        calls.append(list(segments))
        return upper(segments)

    out = translate_document(MARKDOWN.encode(), "notes.md", LIMITS, record).data.decode()
    sent = calls[0]
    assert_clean_segments(sent)
    # Emphasis and link syntax travel as sentinels: the translator cannot mangle them, nor the link's target.
    assert sent == ["Release notes", "Install it with `pip install thing` and read ⟦0⟧the guide⟦1⟧.",
                    "A quoted remark.", "First item", "Second item with ⟦0⟧bold⟦1⟧", "Numbered step", "Name", "Meaning",
                    "a | b", "Pipe inside", "Hard break", "next line"]
    # Then the formatted ones whole without their markup, and their pieces alone (reader.translate_keeping_markup).
    assert calls[1][:2] == ["Install it with `pip install thing` and read the guide.", "Second item with bold"]
    front_matter = "---\ntitle: Release notes\ntags: [a, b]\n---\n"
    expected = MARKDOWN.removeprefix(front_matter)
    unmasked = {"Install it with `pip install thing` and read [the guide](https://example.com/guide).":
                "INSTALL IT WITH `PIP INSTALL THING` AND READ [THE GUIDE](https://example.com/guide).",
                "Second item with **bold**": "SECOND ITEM WITH **BOLD**"}
    for source, translated in unmasked.items():
        expected = expected.replace(source, translated, 1)
    for s in sent:
        if "⟦" in s:
            continue
        expected = expected.replace(s, s.upper(), 1) if s != "a | b" else expected.replace("a \\| b", "A \\| B")
    assert out == front_matter + expected
    # The untranslated parts, spelled out: front matter, code blocks, inline-only code, HTML, markup.
    for kept in ("---\ntitle: Release notes\ntags: [a, b]\n---\n", 'def hello():\n    return "do not translate"',
                 "    indented code stays too", '<div class="note">raw html block</div>', "`only_code()`",
                 "|------|---------|", "# RELEASE NOTES #", "HARD BREAK  \nNEXT LINE"):
        assert kept in out


def test_markdown_identity_is_byte_identical_and_escapes_block_markers():
    doc = read_document(MARKDOWN.encode(), "notes.md", LIMITS)
    assert doc.render(doc.segments).data.decode() == MARKDOWN
    # A translation that would start a list or a heading is escaped; a pipe in a cell is escaped.
    translations = list(doc.segments)
    translations[doc.segments.index("A quoted remark.")] = "- not a list"
    translations[doc.segments.index("Pipe inside")] = "x | y"
    out = doc.render(translations).data.decode()
    assert "> \\- not a list" in out
    assert "| a \\| b | x \\| y |" in out


def test_markdown_line_breaks_from_the_translator_cannot_start_new_blocks():
    src = "- First item\n- Second item\n"
    doc = read_document(src.encode(), "l.md", LIMITS)
    out = doc.render(["Erster\n# Punkt", "Zweiter\n\nPunkt"]).data.decode()
    assert out == "- Erster # Punkt\n- Zweiter Punkt\n"


def test_markdown_wrapped_paragraph_becomes_one_line():
    src = "First line of a paragraph\ncontinues on the second line.\n\nNext\n"
    doc = read_document(src.encode(), "w.md", LIMITS)
    assert doc.segments == ["First line of a paragraph continues on the second line.", "Next"]
    assert doc.render(["Uno", "Dos"]).data.decode() == "Uno\n\nDos\n"


def test_srt_round_trip_keeps_indices_and_timings_exactly():
    doc = read_document(SRT.encode(), "movie.srt", LIMITS)
    assert doc.segments == ["Hello there, my old friend.", "- Are you coming?", "- Not today.",
                            "<i>The end.</i>"]
    out = doc.render([s.upper() for s in doc.segments], target="de")
    assert out.filename == "movie.de.srt"
    before, after = list(srt.parse(SRT)), list(srt.parse(out.data.decode()))
    assert [(s.index, s.start, s.end, s.proprietary) for s in after] == \
           [(s.index, s.start, s.end, s.proprietary) for s in before]
    assert [s.content for s in after] == ["HELLO THERE,\nMY OLD FRIEND.", "- ARE YOU COMING?\n- NOT TODAY.", "♪ ♪",
                                          "<I>THE END.</I>"]
    # The timing lines themselves are unchanged, character for character.
    timing_lines = [line for line in SRT.splitlines() if "-->" in line]
    assert timing_lines == [line for line in out.data.decode().splitlines() if "-->" in line]


def test_srt_keeps_crlf_line_endings():
    data = SRT.replace("\n", "\r\n").encode()
    out = translate_document(data, "a.srt", LIMITS, identity).data
    assert out.count(b"\r\n") >= SRT.count("\n") - 1 and b"\n\n" not in out


def test_docx_round_trip_keeps_heading_bold_run_table_and_header():
    data = make_docx()
    doc = read_document(data, "report.docx", LIMITS)
    # Where the formatting changes, the segment carries a sentinel the service's masking keeps intact.
    assert doc.segments == ["Annual report", "Sales grew ⟦0⟧much faster⟦1⟧ than planned.", "Region", "Result", "North",
                            "Confidential draft"]
    out = translate_document(data, "report.docx", LIMITS, upper, target="fr")
    assert out.filename == "report.fr.docx"
    assert out.media_type == "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
    result = docx.Document(io.BytesIO(out.data))
    paragraphs = result.paragraphs
    assert [(p.style.name, p.text) for p in paragraphs[:2]] == [
        ("Heading 1", "ANNUAL REPORT"), ("Normal", "SALES GREW MUCH FASTER THAN PLANNED.")]
    assert [(r.text, r.bold) for r in paragraphs[1].runs] == [("SALES GREW ", None), ("MUCH FASTER", True),
                                                               (" THAN PLANNED.", None)]
    assert len(result.tables) == 1 and result.tables[0].style.name == "Table Grid"
    assert [[c.text for c in row.cells] for row in result.tables[0].rows] == [["REGION", "RESULT"], ["NORTH", "42"]]
    assert result.sections[0].header.paragraphs[0].text == "CONFIDENTIAL DRAFT"
    assert paragraphs[2].text == "   "  # whitespace-only paragraph untouched, never sent


def _bold_runs_after(translation: str) -> list[tuple[str, bool | None]]:
    out = translate_document(make_docx(), "r.docx", LIMITS, lambda segs, p=None: [
        translation if s.startswith("Sales grew") else s for s in segs])
    return [(r.text, r.bold) for r in docx.Document(io.BytesIO(out.data)).paragraphs[1].runs]


def test_docx_bold_words_follow_the_sentinels_the_model_returned():
    assert _bold_runs_after("Las ventas crecieron ⟦0⟧ mucho más rápido ⟦1⟧ de lo previsto.") == [
        ("Las ventas crecieron ", None), ("mucho más rápido ", True), ("de lo previsto.", None)]
    # Reordered by the model (word order differs between languages): still exact.
    assert _bold_runs_after("⟦0⟧Viel schneller⟦1⟧ als geplant wuchs der Umsatz.") == [
        ("", None), ("Viel schneller", True), (" als geplant wuchs der Umsatz.", None)]


def _bold_runs_rendered(translation: str) -> list[tuple[str, bool | None]]:
    """Like _bold_runs_after, through `render` alone: what the runs get when no piece-by-piece pass is made."""
    doc = read_document(make_docx(), "r.docx", LIMITS)
    out = doc.render([translation if s.startswith("Sales grew") else s for s in doc.segments])
    return [(r.text, r.bold) for r in docx.Document(io.BytesIO(out.data)).paragraphs[1].runs]


def test_docx_without_usable_sentinels_falls_back_to_proportional_cuts_between_words():
    # Dropped sentinels: the text is spread by length; cuts land between words, spaces stay on their side.
    assert _bold_runs_rendered("Las ventas crecieron mucho más rápido de lo previsto.") == [
        ("Las ventas ", None), ("crecieron mucho más", True), (" rápido de lo previsto.", None)]
    # Out of order or duplicated: same fallback, sentinels removed.
    assert [t for t, _ in _bold_runs_rendered("Las ventas ⟦1⟧crecieron ⟦0⟧ mucho ⟦0⟧más rápido de lo previsto.")] \
        == ["Las ventas ", "crecieron mucho más", " rápido de lo previsto."]
    # Through translate_document, the sentence's translation without markup is kept whole and the runs are cut
    # from it by alignment: every run keeps text, the bold one a word of its own.
    runs = _bold_runs_after("Las ventas crecieron mucho más rápido de lo previsto.")
    assert "".join(text for text, _ in runs) == "Las ventas crecieron mucho más rápido de lo previsto."
    assert all(text.strip() for text, _ in runs) and runs[1][1] is True


def test_docx_line_breaks_from_the_translator_become_spaces():
    doc = read_document(make_docx(), "r.docx", LIMITS)
    translations = [s.replace("Annual report", "Jahres-\nbericht") for s in doc.segments]
    result = docx.Document(io.BytesIO(doc.render(translations).data))
    assert result.paragraphs[0].text == "Jahres- bericht"


def test_docx_runs_that_look_alike_are_one_group_without_sentinels():
    d = docx.Document()
    p = d.add_paragraph()
    for text in ("Hel", "lo wor", "ld again"):
        p.add_run(text)  # how Word splits text after edits and spell checks
    p.runs[1]._r.get_or_add_rPr().append(docx.oxml.parse_xml(
        '<w:lang xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main" w:val="en-GB"/>'))
    buf = io.BytesIO()
    d.save(buf)
    doc = read_document(buf.getvalue(), "split.docx", LIMITS)
    assert doc.segments == ["Hello world again"]
    runs = docx.Document(io.BytesIO(doc.render(["Hola mundo otra vez"]).data)).paragraphs[0].runs
    assert [r.text for r in runs] == ["Hola mundo otra vez", "", ""]


def test_distribute_proportional_and_snapped():
    assert distribute(["Hello ", "world"], "HELLO WORLD") == ["HELLO ", "WORLD"]
    assert distribute(["Hello", " world"], "HELLO WORLD") == ["HELLO", " WORLD"]
    assert distribute(["ab", "cd"], "你好世界") == ["你好", "世界"]  # no spaces: proportional
    assert "".join(distribute(["a ", "bb ", "c"], "one two three four")) == "one two three four"


def with_footnotes(data: bytes) -> bytes:
    """Add a footnotes part (python-docx cannot write one) the way Word stores it."""
    w = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
    notes = (f'<w:footnotes xmlns:w="{w}"><w:footnote w:type="separator" w:id="-1"><w:p><w:r><w:separator/></w:r>'
             '</w:p></w:footnote><w:footnote w:id="1"><w:p><w:r><w:t>A footnote to translate.</w:t></w:r></w:p>'
             "</w:footnote></w:footnotes>").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            body = src.read(item.filename)
            if item.filename == "[Content_Types].xml":
                body = body.replace(b"</Types>", b'<Override PartName="/word/footnotes.xml" ContentType="application/'
                                    b'vnd.openxmlformats-officedocument.wordprocessingml.footnotes+xml"/></Types>')
            elif item.filename == "word/_rels/document.xml.rels":
                body = body.replace(b"</Relationships>", b'<Relationship Id="rIdNotes" Type="http://schemas.'
                                    b'openxmlformats.org/officeDocument/2006/relationships/footnotes" '
                                    b'Target="footnotes.xml"/></Relationships>')
            dst.writestr(item.filename, body)
        dst.writestr("word/footnotes.xml", notes)
    return buf.getvalue()


def test_docx_footnotes_are_translated_and_saved_back():
    data = with_footnotes(make_docx())
    doc = read_document(data, "notes.docx", LIMITS)
    assert doc.segments[-1] == "A footnote to translate."
    out = doc.render([s.upper() for s in doc.segments])
    with zipfile.ZipFile(io.BytesIO(out.data)) as zf:
        notes = zf.read("word/footnotes.xml").decode()
    assert "A FOOTNOTE TO TRANSLATE." in notes and "<w:separator/>" in notes
    assert docx.Document(io.BytesIO(out.data)).paragraphs[0].text == "ANNUAL REPORT"


def test_docx_keeps_images_beside_text():
    data = make_docx(with_image=True)
    out = translate_document(data, "img.docx", LIMITS, upper)
    result = docx.Document(io.BytesIO(out.data))
    assert len(result.inline_shapes) == 1
    assert result.paragraphs[0].text == "ANNUAL REPORT"


def test_pdf_text_layer_becomes_docx_with_paragraphs_and_note():
    data = make_pdf([["Annual report", "", "This is the first paragraph of the report, and it is long",
                      "enough to wrap onto a second line. It is hyphen-", "ated there.", "", "Second paragraph."],
                     ["Page two text."]])
    doc = read_document(data, "scan.pdf", LIMITS)
    assert doc.segments == ["Annual report", "This is the first paragraph of the report, and it is long enough to "
                            "wrap onto a second line. It is hyphenated there.", "Second paragraph.",
                            "Page two text."]
    out = doc.render([s.upper() for s in doc.segments])
    assert out.filename == "scan.translated.docx"
    assert "Word document (.docx)" in out.note
    result = docx.Document(io.BytesIO(out.data))
    assert [p.text for p in result.paragraphs] == [s.upper() for s in doc.segments]
    assert 'w:br w:type="page"' in result.paragraphs[2]._p.xml  # page break after page 1's last paragraph


def test_pdf_encrypted_with_empty_user_password_is_read():
    data = make_pdf([["Open to read."]], owner_password="owner-secret")
    assert read_document(data, "locked-edit.pdf", LIMITS).segments == ["Open to read."]


def test_pdf_paragraph_heuristics():
    assert paragraphs_of("A heading\n\nLong line of prose that goes on and on.\nShort end.\nNew one here.\n") == [
        "A heading", "Long line of prose that goes on and on. Short end.", "New one here."]


def test_html_round_trip_translates_sentences_and_keeps_markup():
    calls: list[list[str]] = []

    def record(segments, progress=None):
        calls.append(list(segments))
        return upper(segments)

    out = translate_document(HTML.encode(), "page.html", LIMITS, record).data.decode()
    assert_clean_segments([s for call in calls for s in call])
    # A sentence with inline tags is one segment; its tags travel as sentinels, its text unescaped.
    assert calls[0] == ["My page", "Welcome & hello", "Hello ⟦0⟧world⟦1⟧, see ⟦2⟧the docs⟦3⟧.⟦4⟧ Next line",
                        "Café <tag> 3 > 2"]
    # The formatted one again without its markup, whole, and the text of its elements alone.
    assert calls[1] == ["Hello world, see the docs. Next line", "world", "the docs"]
    assert "<title>MY PAGE</title>" in out
    assert '<h1 class="t">WELCOME &amp; HELLO</h1>' in out
    assert '<p>HELLO <b>WORLD</b>, SEE <a href="https://x.example/docs">THE DOCS</a>.<br> NEXT LINE</p>' in out
    assert "<p>CAFÉ &lt;TAG&gt; 3 &gt; 2</p>" in out
    for kept in ('var greeting = "hello";', "p { color: red }", "<pre>keep this</pre>", "<code>and this</code>",
                 '<p translate="no">BrandName</p>', "<!-- a comment -->", "<!DOCTYPE html>"):
        assert kept in out


def test_html_lang_alt_title_and_placeholder_are_translated_urls_and_code_kept():
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><body>\n<img src=\"cat.png\" alt=\"A sleeping cat\">\n"
            "<p>Open <a href=\"/home\" title=\"Go to the start page\">the page</a> now.</p>\n"
            "<input placeholder='Search the docs' aria-label=\"Search\">\n<p title=\"Tip &amp; trick\">Read this.</p>\n"
            "<code title=\"a code title\">x = 1</code>\n</body></html>\n")
    sent: list[str] = []

    def record(segments, progress=None):
        sent.extend(segments)
        return upper(segments)

    out = translate_document(page.encode(), "page.html", LIMITS, record, target="es").data.decode()
    for value in ("A sleeping cat", "Go to the start page", "Search the docs", "Search", "Tip & trick"):
        assert value in sent  # each value is a segment of its own
    assert '<html lang="es">' in out
    assert '<img src="cat.png" alt="A SLEEPING CAT">' in out
    assert '<a href="/home" title="GO TO THE START PAGE">THE PAGE</a>' in out  # inside a sentence's inline tag
    assert "<input placeholder='SEARCH THE DOCS' aria-label=\"SEARCH\">" in out
    assert '<p title="TIP &amp; TRICK">READ THIS.</p>' in out
    assert '<code title="a code title">x = 1</code>' in out  # code and its attributes stay


def test_a_glossary_term_the_tagged_translation_moved_out_of_its_element_lands_in_it():
    from hunyuan_mt.documents import translate_keeping_markup
    from hunyuan_mt.documents.base import ORIGIN_MODEL, ORIGIN_MODEL_SURE
    from hunyuan_mt.text.glossary import parse_terms

    doc = read_document(b"<p>Open the <b>file</b> now.</p>", "a.html", LIMITS)
    glossary = parse_terms({"file": "archivo"}, 10)
    whole = {"Open the file now.": "Abre el archivo ahora."}

    def translate(segments, progress=None):
        # Shown the markup, the model moves the term out of <b>; the bare sentence and the pieces come back term
        # for term.
        return ["Abre el ⟦0⟧⟦1⟧ archivo ahora." if "⟦0⟧" in s else whole.get(s, s.replace("file", "archivo"))
                for s in segments]

    origins = {"Open the file now.": ORIGIN_MODEL_SURE}
    kept = translate_keeping_markup(doc, translate, glossary=glossary, origins=origins)
    assert (kept.aligned, kept.unsure, kept.redone) == (1, 0, 0)
    assert "<p>Abre el <b>archivo</b> ahora.</p>" in doc.render(kept.translations, "es").data.decode()
    assert origins[doc.segments[0]] == ORIGIN_MODEL_SURE
    # A whole translation that has another word where the term should be: placed, and marked for review.
    whole["Open the file now."] = "Abre el fichero ahora."
    origins = {"Open the file now.": ORIGIN_MODEL_SURE}
    kept = translate_keeping_markup(doc, translate, glossary=glossary, origins=origins)
    assert (kept.aligned, kept.unsure) == (1, 1) and origins[doc.segments[0]] == ORIGIN_MODEL


#: A model that copies what stands between sentinels (found by hand: "Pulse **Save** para mantener su *changes*"), but
#: translates the same sentence without markup, and the words alone.
_WORDS = {"Save": "Guardar", "changes": "Cambios", "GIMP": "GIMP",
          "Click Save to keep your changes.": "Pulse Guardar para mantener sus cambios.",
          "Open GIMP in Save mode.": "Abra GIMP en modo Guardar."}


def _copying_model(segments, progress=None):
    out = []
    for s in segments:
        if "⟦" in s:
            out.append(s.replace("Click", "Pulse").replace("to keep your", "para mantener sus")
                       .replace("in", "en").replace("Open", "Abra"))
        else:
            out.append(_WORDS.get(s, s))
    return out


def test_formatted_words_come_from_the_whole_sentence_not_the_models_copy_of_them():
    data = b"<p>Click <b>Save</b> to keep your <i>changes</i>.</p><p>Open <b>GIMP</b> in <i>Save</i> mode.</p>"
    rendered = translate_document(data, "a.html", LIMITS, _copying_model)
    html = rendered.data.decode()
    assert "<p>Pulse <b>Guardar</b> para mantener sus <i>cambios</i>.</p>" in html
    # A name stays as it is; the Spanish word order puts the formatted word last.
    assert "<p>Abra <b>GIMP</b> en modo <i>Guardar</i>.</p>" in html
    assert "piece by piece" not in rendered.note
    # The bare sentences, then each element's text alone, once, whatever the number of segments holding it.
    sent: list[list[str]] = []
    translate_document(data, "a.html", LIMITS, lambda s, p=None: sent.append(list(s)) or _copying_model(s))
    assert sent[1] == ["Click Save to keep your changes.", "Open GIMP in Save mode.", "Save", "changes", "GIMP"]


def test_markup_with_too_few_words_to_hold_it_is_translated_piece_by_piece_and_marked_for_review():
    from hunyuan_mt.documents import translate_keeping_markup
    from hunyuan_mt.documents.base import ORIGIN_MODEL, ORIGIN_MODEL_SURE

    def translate(segments, progress=None):
        # The whole sentence comes back as one word: three formatted pieces cannot each get one of their own.
        return ["Guardar." if "⟦" not in s and " " in s and s.endswith(".") else
                "⟦1⟧Pulse ⟦0⟧Guardar para mantener sus cambios." if "⟦" in s
                else {"Click": "Pulse", "Save": "Guardar", "changes": "Cambios"}.get(s, s) for s in segments]

    doc = read_document(b"<p>Click <b>Save</b> to keep your <i>changes</i>.</p>", "a.html", LIMITS)
    origins = {"Click Save to keep your changes.": ORIGIN_MODEL_SURE}
    kept = translate_keeping_markup(doc, translate, origins=origins)
    assert (kept.aligned, kept.redone) == (0, 1) and origins[doc.segments[0]] == ORIGIN_MODEL
    # Pieces alone start as sentences do; inside the sentence they keep the source's lower-case start.
    assert "<p>Pulse <b>Guardar</b> to keep your <i>cambios</i>.</p>" in doc.render(kept.translations).data.decode()
    rendered = translate_document(b"<p>Click <b>Save</b> to keep your <i>changes</i>.</p>", "a.html", LIMITS,
                                  translate)
    assert "1 segment whose markup could not be placed in the whole sentence's translation was translated piece " \
           "by piece" in rendered.note


def test_a_segment_from_the_memory_keeps_its_formatted_words():
    from hunyuan_mt.documents import translate_keeping_markup
    from hunyuan_mt.documents.base import ORIGIN_MEMORY

    doc = read_document(b"<p>Click <b>Save</b> to keep your <i>changes</i>.</p>", "a.html", LIMITS)
    kept = translate_keeping_markup(doc, _copying_model, origins={doc.segments[0]: ORIGIN_MEMORY})
    assert kept.aligned == 0 and "⟦0⟧Save⟦1⟧" in kept.translations[0]
    kept = translate_keeping_markup(doc, _copying_model)
    assert kept.aligned == 1 and "⟦0⟧Guardar⟦1⟧" in kept.translations[0]


def test_html_tags_come_back_exactly_once_whatever_the_translator_does():
    doc = read_document(HTML.encode(), "page.html", LIMITS)
    i = next(n for n, s in enumerate(doc.segments) if "⟦4⟧" in s)
    translations = list(doc.segments)
    # Reordered, duplicated, dropped sentinels and markup-looking text from the model.
    translations[i] = "Bonjour ⟦0⟧monde⟦1⟧ ⟦1⟧, voir ⟦3⟧ les docs <script> & plus"
    out = doc.render(translations).data.decode()
    paragraph = out[out.index("<p>Bonjour"):out.index("</p>", out.index("<p>Bonjour"))]
    assert paragraph.count("<b>") == paragraph.count("</b>") == 1
    assert paragraph.count('<a href="https://x.example/docs">') == paragraph.count("</a>") == 1
    assert paragraph.count("<br>") == 1
    assert "&lt;script&gt; &amp; plus" in paragraph and "<script>" not in paragraph


def test_html_in_a_legacy_charset_is_declared_utf8_in_the_output():
    page = ('<html><head><meta http-equiv="Content-Type" content="text/html; charset=windows-1252">'
            "<title>Caf\u00e9 cr\u00e8me</title></head><body><p>D\u00e9j\u00e0 vu \u00e0 l'h\u00f4tel, "
            "o\u00f9 l'\u00e9t\u00e9 est tr\u00e8s long et la for\u00eat tr\u00e8s belle.</p></body></html>")
    doc = read_document(page.encode("cp1252"), "old.html", LIMITS)
    assert doc.segments[0] == "Caf\u00e9 cr\u00e8me"
    out = doc.render(doc.segments)
    assert out.data.decode("utf-8") == page.replace("charset=windows-1252", "charset=utf-8")


@pytest.mark.parametrize("name,data", [
    ("a.txt", b"Hello.\n\n   \n\n42\n\nWorld.\n"),
    ("a.md", MARKDOWN.encode()),
    ("a.srt", SRT.encode()),
    ("a.html", HTML.encode()),
    ("a.docx", None),
    ("a.pdf", None),
])
def test_segments_sent_are_never_blank_numbers_or_code(name, data):
    if name == "a.docx":
        data = make_docx()
    elif name == "a.pdf":
        data = make_pdf([["Text here.", "", "   ", "", "12 34"]])
    assert_clean_segments(read_document(data, name, LIMITS).segments)


def test_translate_document_sends_repeats_once_and_passes_progress():
    calls: list[tuple[list[str], object]] = []
    progress_seen: list[tuple[int, int]] = []

    def fake(segments, progress=None):
        calls.append((list(segments), progress))
        for i in range(len(segments)):
            progress(i + 1, len(segments))
        return upper(segments)

    out = translate_document(b"Same.\n\nOther.\n\nSame.\n", "r.txt", LIMITS, fake,
                             progress=lambda d, t: progress_seen.append((d, t)))
    assert calls[0][0] == ["Same.", "Other."]
    assert progress_seen == [(1, 2), (2, 2)]
    assert out.data == b"SAME.\n\nOTHER.\n\nSAME.\n"


# ------------------------------------------------------------------------------------------------------------------
# Bad uploads: each a typed error with a readable message.


def test_unsupported_extension_lists_supported_ones():
    with pytest.raises(UnsupportedDocument) as err:
        read_document(b"a,b\n1,2\n", "table.csv", LIMITS)
    assert err.value.message == ("table.csv: unsupported file type '.csv'; supported: "
                                 + ", ".join(SUPPORTED_EXTENSIONS))
    assert ".docx" in err.value.message and ".srt" in err.value.message
    with pytest.raises(UnsupportedDocument, match=r"unsupported file type \(no extension\)"):
        read_document(b"hello", "README", LIMITS)


@pytest.mark.parametrize("name,data,says", [
    ("report.docx", None, "the file's content is a PDF document, not a Word document as its .docx extension says"),
    ("notes.txt", None, "the file's content is a zip archive, not a plain-text file as its .txt extension says"),
    ("notes.txt", bytes(range(256)) * 8, "the file's content is binary data, not a plain-text file"),
    ("photo.md", tiny_png(), "the file's content is a PNG image, not a Markdown file"),
    ("paper.pdf", b"just some text pretending", "the file's content is text, not a PDF as its .pdf extension says"),
    ("letter.docx", b"plain text, no zip", "the file's content is text, not a Word document"),
    ("old.docx", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(64), "legacy Word .doc file, not a .docx"),
    ("old.xlsx", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(64), "legacy Excel .xls file, not a .xlsx"),
    ("old.pptx", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(64), "legacy PowerPoint .ppt file, not a .pptx"),
    ("old.odt", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(64),
     "the file's content is a legacy Office file (.doc/.xls/.ppt), not an OpenDocument text document"),
])
def test_extension_that_lies_about_the_content(name, data, says):
    if data is None:
        data = make_pdf([["Hello."]]) if name.endswith(".docx") else make_docx()
    with pytest.raises(UnsupportedDocument) as err:
        read_document(data, name, LIMITS)
    assert says in err.value.message
    assert err.value.message.startswith(name + ": ")


def test_zip_that_is_not_a_word_document():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("xl/workbook.xml", "<workbook/>")
    with pytest.raises(UnsupportedDocument, match=r"not a Word document \(it is an Excel workbook; save it as \.docx or upload it as \.xlsx\)"):
        read_document(buf.getvalue(), "sheet.docx", LIMITS)


def test_corrupt_docx():
    truncated = make_docx()[:3000]
    with pytest.raises(UnsupportedDocument, match=r"^broken\.docx: the \.docx is damaged"):
        read_document(truncated, "broken.docx", LIMITS)
    # A readable zip whose document part is not XML.
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(make_docx())) as src, zipfile.ZipFile(buf, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, b"<w:document><not-closed" if item.filename == "word/document.xml"
                         else src.read(item.filename))
    with pytest.raises(UnsupportedDocument, match=r"bad-xml\.docx: the \.docx is damaged or not a Word document"):
        read_document(buf.getvalue(), "bad-xml.docx", LIMITS)


def test_zip_bomb_docx_is_refused_from_declared_sizes():
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(make_docx())) as src, zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            dst.writestr(item, src.read(item.filename))
        dst.writestr("word/media/bomb.bin", bytes(4 * 1024 * 1024))  # 4 MiB of zeros, a few KiB packed
    data = buf.getvalue()
    assert len(data) < 100_000
    limits = replace(LIMITS, max_unzipped_bytes=1024 * 1024)
    with pytest.raises(InputTooLarge) as err:
        read_document(data, "bomb.docx", limits)
    declared = sum(i.file_size for i in zipfile.ZipFile(io.BytesIO(data)).infolist())
    assert err.value.message == f"bomb.docx: unpacks to {declared} bytes, the limit is 1048576 bytes"
    # The same file is fine under the default limit: the check is about the size, not the member.
    assert read_document(data, "bomb.docx", LIMITS).segments[0] == "Annual report"


def test_zip_bomb_that_understates_its_sizes_never_inflates_past_them():
    # Forge the declared size of word/document.xml (padded with 4 MiB of whitespace) down to 1000 bytes: zipfile
    # stops at the declared size and the CRC check fails, so the file is refused as damaged, nothing inflated.
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(make_docx())) as src, zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            body = src.read(item.filename)
            if item.filename == "word/document.xml":
                body = body.replace(b"<w:body>", b"<w:body>" + b" " * (4 * 1024 * 1024), 1)
            dst.writestr(item.filename, body)
    data = bytearray(buf.getvalue())
    directory = data.find(b"PK\x01\x02")
    while directory >= 0:
        name_len = struct.unpack_from("<H", data, directory + 28)[0]
        if data[directory + 46:directory + 46 + name_len] == b"word/document.xml":
            struct.pack_into("<I", data, directory + 24, 1000)  # uncompressed size in the central directory
        directory = data.find(b"PK\x01\x02", directory + 4)
    limits = replace(LIMITS, max_unzipped_bytes=1024 * 1024)
    with pytest.raises(UnsupportedDocument, match=r"^liar\.docx: the \.docx is damaged"):
        read_document(bytes(data), "liar.docx", limits)


def test_docx_with_only_images():
    with pytest.raises(InvalidInput) as err:
        read_document(make_docx(image_only=True), "pictures.docx", LIMITS)
    assert err.value.message == ("pictures.docx: the document holds only images, no text to translate "
                                 "(text inside images needs OCR first)")


def test_encrypted_pdf():
    with pytest.raises(UnsupportedDocument, match=r"^secret\.pdf: the PDF is password-protected; remove the password"):
        read_document(make_pdf([["Top secret."]], user_password="pw"), "secret.pdf", LIMITS)


def test_pdf_without_text_layer_suggests_ocr():
    with pytest.raises(UnsupportedDocument) as err:
        read_document(make_pdf([[], []]), "scan.pdf", LIMITS)
    assert err.value.message == ("scan.pdf: the PDF has no text layer (it is probably a scanned image); run OCR on "
                                 "it first, e.g. with ocrmypdf, and upload the result")


def test_corrupt_pdf():
    with pytest.raises(UnsupportedDocument, match=r"^bad\.pdf: the PDF is damaged"):
        read_document(b"%PDF-1.7\n" + bytes(range(256)) * 4, "bad.pdf", LIMITS)


def test_file_over_the_size_limit_quotes_both_numbers():
    limits = replace(LIMITS, max_file_bytes=100)
    with pytest.raises(InputTooLarge) as err:
        read_document(b"word " * 40, "big.txt", limits)
    assert err.value.message == "big.txt: the file is 200 bytes, the limit is 100 bytes"
    assert err.value.http_status == 413


def test_character_and_segment_limits():
    text = "\n\n".join(f"Paragraph number {i}." for i in range(10)).encode()
    with pytest.raises(InputTooLarge) as err:
        read_document(text, "many.txt", replace(LIMITS, max_segments=5))
    assert err.value.message == "many.txt: 10 segments to translate, the limit is 5"
    chars = sum(len(f"Paragraph number {i}.") for i in range(10))
    with pytest.raises(InputTooLarge) as err:
        read_document(text, "many.txt", replace(LIMITS, max_doc_chars=50))
    assert err.value.message == f"many.txt: {chars} characters to translate, the limit is 50"


@pytest.mark.parametrize("broken,says", [
    ("3\n00:00:05,000 -> 00:00:0x,000\nBroken arrow\n",
     "movie.srt: subtitle block 5 is not valid SRT (it reads '3 / 00:00:05,000 -> 00:00:0x,000')"),
    ("9\n00:00:09,000 --> 00:00:07,000\nBackwards\n",
     "movie.srt: subtitle block 5 (index 9) ends at 00:00:07,000, before it starts at 00:00:09,000"),
])
def test_srt_with_broken_timings_names_the_block(broken, says):
    with pytest.raises(InvalidInput) as err:
        read_document((SRT + "\n" + broken).encode(), "movie.srt", LIMITS)
    assert err.value.message.startswith(says)


def test_srt_that_is_not_srt():
    with pytest.raises(InvalidInput, match=r"^x\.srt: subtitle block 1 is not valid SRT"):
        read_document(b"Just a line of prose.\n", "x.srt", LIMITS)


@pytest.mark.parametrize("name", ["empty.txt", "empty.docx", "empty.pdf", "empty.srt"])
def test_empty_file(name):
    with pytest.raises(InvalidInput) as err:
        read_document(b"", name, LIMITS)
    assert err.value.message == f"{name}: the file is empty"


@pytest.mark.parametrize("name,data", [("blank.txt", b" \n\n\t\n"), ("code.md", b"```\nx = 1\n```\n"),
                                       ("numbers.txt", b"1 2 3\n\n4.5\n")])
def test_nothing_to_translate(name, data):
    with pytest.raises(InvalidInput, match=f"^{name}: no text to translate was found$"):
        read_document(data, name, LIMITS)


def test_non_utf8_text_that_cannot_be_decoded_is_refused_clearly():
    # Invalid UTF-8 with a BOM claims to be UTF-8: no guessing.
    with pytest.raises(InvalidInput, match=r"^bad\.txt: starts with a UTF-8-SIG byte-order mark but is not valid"):
        read_document(b"\xef\xbb\xbfabc \xff\xfe\xfa broken", "bad.txt", LIMITS)


def test_non_utf8_text_of_unknown_encoding_is_refused_clearly():
    # High bytes in no recognisable code page (seeded, so the same bytes every run); no NULs, so not "binary".
    data = bytes(b | 0x80 for b in random.Random(7).randbytes(600))
    with pytest.raises(InvalidInput) as err:
        read_document(data, "mystery.txt", LIMITS)
    assert err.value.message == ("mystery.txt: the text is not UTF-8 and its encoding could not be detected; save it "
                                 "as UTF-8 and upload it again")


def test_filename_never_becomes_a_path():
    out = translate_document(b"Hello.", "../../etc/passwd.txt", LIMITS, upper, target="es")
    assert out.filename == "passwd.es.txt"
    with pytest.raises(InvalidInput, match=r"^x\.txt: the file is empty"):
        read_document(b"", "C:\\Users\\me\\x.txt", LIMITS)


def test_pdf_reader_sees_what_make_pdf_wrote():
    # Guards the fixture: the PDFs above really carry a text layer.
    assert "Hello there" in PdfReader(io.BytesIO(make_pdf([["Hello there"]]))).pages[0].extract_text()


# ------------------------------------------------------------------------------------------------------------------
# Markup that comes back out of order


def swapping(segments: list[str], progress=None) -> list[str]:
    """A translator that reorders ⟦0⟧ and ⟦1⟧ (as the demo model did with <b>Save</b>) and upper-cases the rest."""
    return [s.replace("⟦0⟧", "\x00").replace("⟦1⟧", "⟦0⟧").replace("\x00", "⟦1⟧").upper() for s in segments]


def test_markup_out_of_order_is_placed_in_the_whole_translation() -> None:
    source = b"<p>Click <b>Save</b> to keep your changes.</p><p>Plain <i>one</i>.</p><p>No tags here.</p>"
    sent: list[list[str]] = []

    def recording(segments: list[str], progress=None) -> list[str]:
        sent.append(list(segments))
        return swapping(segments)

    rendered = translate_document(source, "page.html", LIMITS, recording)
    out = rendered.data.decode("utf-8")
    assert "<p>CLICK <b>SAVE</b> TO KEEP YOUR CHANGES.</p>" in out
    assert "<p>PLAIN <i>ONE</i>.</p>" in out and "<p>NO TAGS HERE.</p>" in out
    assert tag_sequence(out) == tag_sequence(source.decode()) is not None
    # One pass for the segments, a second for the formatted ones without their markup and for their pieces.
    assert sent[1] == ["Click Save to keep your changes.", "Plain one.", "Click", "Save", "to keep your changes.",
                       "Plain", "one"]
    assert "piece by piece" not in rendered.note


def test_markup_emptied_by_the_model_is_placed_around_its_words_again() -> None:
    """Sentinels back in order but the formatted word moved out of them (`su contraseña <strong></strong>.`): the
    formatting would sit on nothing, so it is placed in the whole sentence's translation, around its word."""
    sent: list[list[str]] = []

    def moving(segments: list[str], progress=None) -> list[str]:
        sent.append(list(segments))
        if len(sent) == 1:
            return ["Pulse ⟦0⟧aquí⟦1⟧ para cambiar su contraseña ⟦2⟧⟦3⟧."]
        return [{"Click here to change your password.": "Pulse aquí para cambiar su contraseña.", "Click": "Pulse",
                 "here": "aquí", "to change your": "para cambiar su", "password": "contraseña"}.get(s, s)
                for s in segments]

    rendered = translate_document(b'<p>Click <a href="/s">here</a> to change your <strong>password</strong>.</p>',
                                  "page.html", LIMITS, moving)
    assert '<p>Pulse <a href="/s">aquí</a> para cambiar su <strong>contraseña</strong>.</p>' in rendered.data.decode()
    assert sent[1] == ["Click here to change your password.", "here", "password"]
    assert "piece by piece" not in rendered.note


def test_an_element_the_model_emptied_goes_around_the_word_before_its_tags_and_is_marked_for_review() -> None:
    """The demo's `Your <u>account</u> has been created.` (es): shown the markup it wrote `la cuenta ⟦0⟧⟦1⟧.`, and
    alone "account" came back as nonsense; the piece-by-piece fallback made `Puede <u>contrario</u> se ha creado.`"""
    from hunyuan_mt.documents import translate_keeping_markup
    from hunyuan_mt.documents.base import ORIGIN_MODEL, ORIGIN_MODEL_SURE

    answers = {"Your ⟦0⟧account⟦1⟧ has been created.": "Se ha creado la cuenta ⟦0⟧⟦1⟧.",
               "Your account has been created.": "Se ha creado la cuenta de usuario.",
               "Your": "Puede", "account": "contrario", "has been created.": "se ha creado."}
    doc = read_document(b"<p>Your <u>account</u> has been created.</p>", "a.html", LIMITS)
    origins = {"Your account has been created.": ORIGIN_MODEL_SURE}
    kept = translate_keeping_markup(doc, lambda segments, progress=None: [answers[s] for s in segments],
                                    origins=origins)
    assert "<p>Se ha creado la <u>cuenta</u> de usuario.</p>" in doc.render(kept.translations).data.decode()
    assert (kept.aligned, kept.unsure, kept.redone) == (1, 1, 0) and origins[doc.segments[0]] == ORIGIN_MODEL


def test_markup_in_order_in_the_whole_sentences_words_is_kept_as_the_model_gave_it() -> None:
    calls: list[list[str]] = []

    def in_order(segments: list[str], progress=None) -> list[str]:
        calls.append(list(segments))
        return upper(segments)

    rendered = translate_document(b"<p>Click <b>Save</b>   now.</p>", "page.html", LIMITS, in_order)
    assert "<p>CLICK <b>SAVE</b> NOW.</p>" in rendered.data.decode("utf-8")
    assert calls == [["Click ⟦0⟧Save⟦1⟧ now."], ["Click Save now.", "Save"]]
    assert "piece by piece" not in rendered.note


def test_docx_runs_out_of_order_are_placed_by_alignment() -> None:
    rendered = translate_document(make_docx(), "report.docx", LIMITS, swapping)
    paragraph = next(p for p in docx.Document(io.BytesIO(rendered.data)).paragraphs if "MUCH FASTER" in p.text)
    bold = [r.text for r in paragraph.runs if r.bold]
    assert bold == ["MUCH FASTER"], [(r.text, r.bold) for r in paragraph.runs]


@pytest.mark.parametrize("translation, rendered", [
    ("⟦0⟧Página web⟦1⟧ (`/ui`): ver ⟦2⟧la guía⟦3⟧.", "**Página web** (`/ui`): ver [la guía](https://x.org/g)."),
    ("⟦0⟧ Página web ⟦1⟧ (`/ui`): ver ⟦2⟧ la guía ⟦3⟧.", "**Página web** (`/ui`): ver [la guía](https://x.org/g)."),
])
def test_markdown_emphasis_and_links_come_back_around_their_words(translation: str, rendered: str) -> None:
    doc = read_document(b"**Web page** (`/ui`): see [the guide](https://x.org/g).\n", "a.md", LIMITS)
    assert doc.segments == ["⟦0⟧Web page⟦1⟧ (`/ui`): see ⟦2⟧the guide⟦3⟧."]
    assert doc.render([translation]).data.decode() == rendered + "\n"


def test_markdown_markers_out_of_order_are_translated_piece_by_piece() -> None:
    out = translate_document(b"Use **Save** or *Cancel* now.\n", "a.md", LIMITS, swapping).data.decode()
    assert out == "USE **SAVE** OR *CANCEL* NOW.\n"


@pytest.mark.parametrize("text", ["see [1] and **x**", "a ![logo](p.png) **b**", "plain", "use snake_case_name"])
def test_markdown_markers_that_are_not_certain_stay_text(text: str) -> None:
    from hunyuan_mt.documents.markdown import mask_inline

    assert mask_inline(text) is None


# ---------------------------------------------------------------------------------------------------- gettext

GETTEXT_FIXTURE = Path(__file__).resolve().parent / "data" / "gdk-pixbuf.es.po"


def test_gettext_catalogue_round_trip_fills_untranslated_entries_fuzzy_and_keeps_the_rest():
    import polib

    source = GETTEXT_FIXTURE.read_bytes()
    before = polib.pofile(source.decode("utf-8"))
    sent: list[str] = []

    def record(segments, progress=None):
        sent.extend(segments)
        return upper(segments)

    rendered = translate_document(source, GETTEXT_FIXTURE.name, LIMITS, record, target="es")
    assert rendered.filename == "gdk-pixbuf.es.es.po" and rendered.media_type == "text/x-gettext-translation"
    after = polib.pofile(rendered.data.decode("utf-8"))
    # The same entries, in the same order, with the same contexts, ids, references, comments and obsolete ones.
    assert [(e.msgctxt, e.msgid, e.msgid_plural, e.occurrences, e.comment, e.obsolete) for e in before] == \
        [(e.msgctxt, e.msgid, e.msgid_plural, e.occurrences, e.comment, e.obsolete) for e in after]
    assert before.metadata == after.metadata
    for old, new in zip(before, after):
        if old.obsolete:
            assert new.msgstr == old.msgstr
        elif old.msgstr or any(old.msgstr_plural.values()):  # a translator's work, fuzzy included, stays as it was
            assert (new.msgstr, new.flags) == (old.msgstr, old.flags)
        elif old.msgid_plural:
            assert new.msgstr_plural == {0: old.msgid.upper(), 1: old.msgid_plural.upper()}
            assert new.flags == ["fuzzy"] + old.flags
        else:
            assert new.msgstr == old.msgid.upper() and new.flags == ["fuzzy"] + old.flags
    untranslated = [e for e in before if not e.obsolete and not e.msgstr and not any(e.msgstr_plural.values())]
    assert len(sent) == len(untranslated) + sum(1 for e in untranslated if e.msgid_plural)
    assert "c-format" in after[4].flags and "fuzzy" in after[4].flags


def test_a_pot_template_comes_back_as_a_po_for_the_target_language():
    import polib

    pot = b'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\nmsgctxt "menu"\nmsgid "Open %s"\nmsgstr ""\n'
    rendered = translate_document(pot, "app.pot", LIMITS, upper, target="de")
    catalogue = polib.pofile(rendered.data.decode("utf-8"))
    assert rendered.filename == "app.de.po" and catalogue.metadata["Language"] == "de"
    assert [(e.msgctxt, e.msgid, e.msgstr, e.flags) for e in catalogue] == [("menu", "Open %s", "OPEN %S", ["fuzzy"])]
    with pytest.raises(InvalidInput, match="not a readable gettext catalogue"):
        read_document(b'msgid "a"\nmsgstr "b"\ngarbage line\n', "bad.po", LIMITS)
    # An upload whose content names a file on the server is read as content, never as that file.
    with pytest.raises(InvalidInput, match="not a readable gettext catalogue"):
        read_document(str(GETTEXT_FIXTURE).encode(), "path.po", LIMITS)


# ---------------------------------------------------------------------------------------------------- JSON and YAML

I18N_JSON = """{
  "menu": {
    "open": "Open file",
    "count": "{{count}} files selected",
    "size": 12,
    "visible": true,
    "icon": null
  },
  "@menu": {"description": "ARB metadata stays as it is"},
  "toolbar": ["Save", "42", "Quit"]
}
"""

RAILS_YAML = """# Rails-style UI strings
en:
  greeting: "Hello, %{name}!"   # the placeholder stays
  save: &save Save the file
  again: *save
  close: 'Close'
  count: 3
  enabled: yes
  help: >
    A long help text
    over two lines.
"""


def _shape(node):
    """The tree with every string leaf replaced by its type name: what must not change."""
    if isinstance(node, dict):
        return {k: _shape(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_shape(v) for v in node]
    return "str" if isinstance(node, str) else node


def test_json_strings_are_translated_and_everything_else_kept():
    import json

    rendered = translate_document(I18N_JSON.encode(), "en.json", LIMITS, upper, target="es")
    before, after = json.loads(I18N_JSON), json.loads(rendered.data)
    assert rendered.filename == "en.es.json" and _shape(after) == _shape(before)
    assert after["menu"]["open"] == "OPEN FILE" and after["toolbar"] == ["SAVE", "42", "QUIT"]
    assert after["@menu"] == before["@menu"]
    assert rendered.data.decode().startswith('{\n  "menu": {\n    "open"')  # the file's own two-space indent
    with pytest.raises(InvalidInput, match=r"not valid JSON \(line 1, column"):
        read_document(b'{"a": }', "bad.json", LIMITS)


def test_yaml_strings_are_translated_with_comments_anchors_and_quotes_kept():
    from ruamel.yaml import YAML

    rendered = translate_document(RAILS_YAML.encode(), "en.yml", LIMITS, upper, target="es")
    text = rendered.data.decode()
    before, after = YAML(typ="safe").load(RAILS_YAML), YAML(typ="safe").load(text)
    # The locale key names the target now (a Rails app would load the file as English otherwise).
    assert rendered.filename == "en.es.yml" and list(after) == ["es"] and _shape(after["es"]) == _shape(before["en"])
    assert after["es"]["save"] == after["es"]["again"] == "SAVE THE FILE"
    assert after["es"]["help"] == "A LONG HELP TEXT OVER TWO LINES.\n"  # the folded block keeps its newline
    for kept in ("# Rails-style UI strings", "# the placeholder stays", "&save", "again: *save", "close: 'CLOSE'",
                 'greeting: "HELLO, %{NAME}!"', "count: 3", "enabled: yes"):
        assert kept in text, kept
    with pytest.raises(InvalidInput, match="not valid YAML"):
        read_document(b"a: [unclosed\n", "bad.yaml", LIMITS)


def test_placeholders_of_i18n_files_are_single_spans():
    from hunyuan_mt.text.masking import protect

    assert protect("{{count}} files selected").spans == ["{{count}}"]
    assert protect("Hello, %{name}!").spans == ["%{name}"]


# ---------------------------------------------------------------------------------------------------- XLIFF

XLIFF_12 = b"""<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">
  <file source-language="en" datatype="plaintext" original="src/app/app.component.html">
    <body>
      <trans-unit id="greet" datatype="html">
        <source>Hello <g id="START_BOLD" ctype="x-b">dear</g> user,<x id="LINE_BREAK" ctype="lb"/>welcome &amp; enjoy.</source>
        <note priority="1" from="description">Shown on the start page</note>
      </trans-unit>
      <trans-unit id="lines"><source>Line one<ph id="0">&lt;br/&gt;</ph>line two</source></trans-unit>
      <trans-unit id="brand" translate="no"><source>ACME Cloud</source></trans-unit>
      <trans-unit id="done"><source>Save</source><target state="translated">Guardar</target></trans-unit>
      <trans-unit id="app"><source>Open <mrk mtype="protected">Settings.app</mrk> now</source><target state="new"/></trans-unit>
    </body>
  </file>
</xliff>
"""

XLIFF_20 = b"""<?xml version="1.0" encoding="UTF-8"?>
<xliff xmlns="urn:oasis:names:tc:xliff:document:2.0" version="2.0" srcLang="en">
  <file id="f1">
    <unit id="u1">
      <notes><note>A call to action</note></notes>
      <segment><source>Click <pc id="1" dataRefStart="d1">here</pc> to <ph id="2" dataRef="d2"/> continue.</source></segment>
      <ignorable><source> </source></ignorable>
      <segment><source>It takes <sc id="3"/>one<ec startRef="3"/> minute.</source></segment>
    </unit>
    <unit id="u2" translate="no"><segment><source>ACME</source></segment></unit>
  </file>
</xliff>
"""


def _codes(element) -> list[tuple[str, dict]]:
    from lxml import etree

    return [(etree.QName(e).localname, dict(e.attrib)) for e in element.iterdescendants()]


def test_xliff_12_targets_keep_every_inline_code_and_leave_translated_units_alone():
    from lxml import etree

    ns = {"x": "urn:oasis:names:tc:xliff:document:1.2"}
    rendered = translate_document(XLIFF_12, "messages.xlf", LIMITS, upper, target="es")
    before, after = etree.fromstring(XLIFF_12), etree.fromstring(rendered.data)
    assert rendered.filename == "messages.es.xlf"
    assert after.find("x:file", ns).get("target-language") == "es"
    units = {u.get("id"): u for u in after.iterfind(".//x:trans-unit", ns)}
    assert list(units) == [u.get("id") for u in before.iterfind(".//x:trans-unit", ns)]
    for unit_id in ("greet", "lines", "app"):
        source, target = units[unit_id].find("x:source", ns), units[unit_id].find("x:target", ns)
        assert _codes(target) == _codes(source), unit_id  # the same codes, same ids, same order
        assert (target.get("state"), target.get("state-qualifier")) == ("needs-review-translation", "mt-suggestion")
    greet = units["greet"].find("x:target", ns)
    assert "".join(greet.itertext()) == "HELLO DEAR USER,WELCOME & ENJOY."
    assert units["lines"].find("x:target/x:ph", ns).text == "<br/>"  # native code copied whole
    assert units["app"].find("x:target/x:mrk", ns).text == "Settings.app"  # protected text untouched
    assert units["greet"].find("x:note", ns).text == "Shown on the start page"
    assert units["brand"].find("x:target", ns) is None  # translate="no"
    assert units["done"].find("x:target", ns).text == "Guardar"  # a translator's work stays


def test_xliff_20_segments_get_targets_and_translate_no_units_none():
    from lxml import etree

    ns = {"x": "urn:oasis:names:tc:xliff:document:2.0"}
    rendered = translate_document(XLIFF_20, "m.xliff", LIMITS, upper, target="de")
    after = etree.fromstring(rendered.data)
    assert rendered.filename == "m.de.xliff" and after.get("trgLang") == "de"
    segments = after.findall(".//x:unit[@id='u1']/x:segment", ns)
    for segment in segments:
        # No origins told: the model's, for review (2.x has no review state: "initial", and the subState says why).
        assert (segment.get("state"), segment.get("subState")) == ("initial", "hunyuan-mt:mt-suggestion")
        assert _codes(segment.find("x:target", ns)) == _codes(segment.find("x:source", ns))
    assert "".join(segments[0].find("x:target", ns).itertext()) == "CLICK HERE TO  CONTINUE."
    assert after.find(".//x:unit[@id='u1']/x:notes/x:note", ns).text == "A call to action"
    assert after.find(".//x:unit[@id='u2']/x:segment/x:target", ns) is None
    with pytest.raises(InvalidInput, match="not an XLIFF 1.2 or 2.x file"):
        read_document(b"<root/>", "a.xlf", LIMITS)
    with pytest.raises(InvalidInput, match="not well-formed XML"):
        read_document(b"<xliff", "a.xlf", LIMITS)


def test_xliff_external_entities_are_never_read():
    hostile = (b'<?xml version="1.0"?><!DOCTYPE xliff [<!ENTITY secret SYSTEM "file:///etc/hostname">]>'
               b'<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2"><file source-language="en">'
               b'<body><trans-unit id="a"><source>Open &secret; now</source></trans-unit></body></file></xliff>')
    out = translate_document(hostile, "a.xlf", LIMITS, identity, target="es").data.decode()
    secret = Path("/etc/hostname").read_text().strip() if Path("/etc/hostname").exists() else "unreadable"
    assert secret not in out.split("</source>", 1)[1]


def test_pieces_redone_for_their_markup_are_neither_billed_nor_detected_again():
    """A document whose markup came back out of order is translated again piece by piece: that second call keeps
    the language detected on the whole document and is not charged a second time."""
    from hunyuan_mt.text.languages import LANGUAGES
    from hunyuan_mt.web.doctranslate import translate_upload

    class Service:
        detected: list[str] = []
        calls: list[tuple[str, list[str]]] = []

        def detect(self, text):
            self.detected.append(text)
            return [type("D", (), {"code": "fr" if len(self.detected) > 1 else "en"})()]

        def translate_segments(self, segments, src, tgt, progress=None, glossary=None, ticket=None, context=None,
                               origins=None):
            self.calls.append((src, list(segments)))
            # The first call swaps the markup sentinels (⟦1⟧ before ⟦0⟧): the reader then redoes those pieces.
            return [s.replace("⟦0⟧", "\x00").replace("⟦1⟧", "⟦0⟧").replace("\x00", "⟦1⟧") if len(self.calls) == 1
                    else s.upper() for s in segments]

    html = b"<p>Open the <b>file</b> and save the <i>document</i> now.</p>"
    charged: list[int] = []
    service = Service()
    rendered, used = translate_upload(service, html, "page.html", "auto", "es", LIMITS, charge=charged.append)
    assert used == "en" and "en" in LANGUAGES
    assert len(service.calls) == 2 and [src for src, _ in service.calls] == ["en", "en"]
    assert len(service.detected) == 1 and len(charged) == 1
    assert b"<b>FILE</b>" in rendered.data


def test_inline_code_is_one_sentinel_of_its_sentence_and_comes_back_whole():
    """`Call <code>f(x)</code> to write.` is one sentence with the code element as one sentinel (it used to be cut
    into "Call" and "to write."); code blocks, kbd keys and translate="no" spans come back byte for byte."""
    page = (b'<p>Call <code>f(x &lt; 2)</code> to write the <b>file</b>.</p><pre><code>x = 1</code></pre>'
            b'<p>Press <kbd>Ctrl</kbd>+<kbd>C</kbd> to copy; <span translate="no">Hunyuan</span> stays.</p>')
    doc = read_document(page, "a.html", LIMITS)
    assert doc.segments == ["Call ⟦0⟧ to write the ⟦1⟧file⟦2⟧.", "Press ⟦0⟧+⟦1⟧ to copy; ⟦2⟧ stays."]
    out = doc.render([s.upper() for s in doc.segments]).data.decode()
    assert out == ('<p>CALL <code>f(x &lt; 2)</code> TO WRITE THE <b>FILE</b>.</p><pre><code>x = 1</code></pre>'
                   '<p>PRESS <kbd>Ctrl</kbd>+<kbd>C</kbd> TO COPY; <span translate="no">Hunyuan</span> STAYS.</p>')


def test_format_libraries_load_on_first_use_and_every_format_resolves():
    """A server's start imports none of the Office, PDF or e-book libraries (they cost every process ~0.7 s); each
    extension's reader is found where its entry says, so a misnamed entry fails here, not at a user's upload."""
    import subprocess
    import sys

    from hunyuan_mt.documents import reader

    code = ("import sys; import hunyuan_mt.documents, hunyuan_mt.service.translation; "
            "print(sorted(m for m in ('docx', 'pptx', 'openpyxl', 'pypdf', 'ebooklib', 'polib') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    for ext in SUPPORTED_EXTENSIONS:
        assert callable(reader._resolve(reader._FORMATS[ext].reader)), ext
    assert all(callable(reader._resolve(target)) for target in reader._LAYOUT_WRITERS.values())
