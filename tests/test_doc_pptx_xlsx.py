"""PowerPoint (.pptx) and Excel (.xlsx) documents: a round trip keeps the structure, translates every text and
nothing else, and every bad upload gets a typed error that names the file.

The fixtures in tests/data/office were written by LibreOffice (make.sh); the cases they lack (group shapes, a real
notes placeholder, fields, hyperlinks, dates, comments) are built in memory with python-pptx and openpyxl.
"""

from __future__ import annotations

import copy
import datetime
import io
import zipfile
from pathlib import Path

import docx
import openpyxl
import pptx
import pytest
from lxml import etree
from openpyxl.cell.rich_text import CellRichText, TextBlock
from openpyxl.cell.text import InlineFont
from openpyxl.comments import Comment
from pptx.chart.data import CategoryChartData
from pptx.enum.chart import XL_CHART_TYPE
from pptx.enum.shapes import MSO_SHAPE_TYPE
from pptx.oxml.ns import qn
from pptx.util import Inches

from hunyuan_mt.text import masking
from hunyuan_mt.config import LimitsConfig
from hunyuan_mt.documents.base import needs_translation
from hunyuan_mt.documents.presentation import PPTX_MEDIA_TYPE, read_presentation
from hunyuan_mt.documents.spreadsheet import XLSX_MEDIA_TYPE, read_spreadsheet
from hunyuan_mt.errors import InvalidInput, UnsupportedDocument

LIMITS = LimitsConfig()
OFFICE = Path(__file__).parent / "data" / "office"
URL = "https://gitlab.gnome.org/GNOME/gdk-pixbuf"


def shout(segment: str) -> str:
    """A translation as the service returns it: the words change, while the masked spans (`%s`, URLs) and the
    document's own sentinels come back verbatim."""
    masked = masking.protect(segment)
    return masking.restore("» " + masked.text.upper(), masked)


def shout_text(text: str) -> str:
    """What `shout` makes of a whole paragraph or cell, run boundaries aside."""
    return shout(" ".join(text.split())) if needs_translation(text) else text


def assert_clean(segments: list[str]) -> None:
    assert segments
    for s in segments:
        assert s == s.strip() and needs_translation(s), repr(s)


def rezip(data: bytes, name: str, content: bytes | None) -> bytes:
    """`data` with member `name` replaced by `content` (or removed when None)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if item.filename != name:
                dst.writestr(item, src.read(item.filename))
            elif content is not None:
                dst.writestr(item, content)
    return out.getvalue()


# ------------------------------------------------------------------------------------------------------------------
# PowerPoint


def pptx_bytes(prs: pptx.presentation.Presentation) -> bytes:
    buf = io.BytesIO()
    prs.save(buf)
    return buf.getvalue()


def open_pptx(data: bytes) -> pptx.presentation.Presentation:
    return pptx.Presentation(io.BytesIO(data))


def all_shapes(shapes) -> list:
    """Every shape, group members included, in document order."""
    out = []
    for shape in shapes:
        out.append(shape)
        if shape.shape_type == MSO_SHAPE_TYPE.GROUP:
            out.extend(all_shapes(shape.shapes))
    return out


def text_frames(prs) -> list[tuple[str, object]]:
    """(where, text frame) of every slide shape, table cell and notes shape."""
    frames = []
    for n, slide in enumerate(prs.slides):
        for shape in all_shapes(slide.shapes):
            if shape.has_text_frame:
                frames.append((f"slide {n} {shape.shape_type}", shape.text_frame))
            if getattr(shape, "has_table", False):
                for r, row in enumerate(shape.table.rows):
                    for c, cell in enumerate(row.cells):
                        frames.append((f"slide {n} cell {r},{c}", cell.text_frame))
        if slide.has_notes_slide:
            for shape in slide.notes_slide.shapes:
                if shape.has_text_frame:
                    frames.append((f"notes {n} {shape.name}", shape.text_frame))
    return frames


def pptx_structure(prs) -> list:
    """Everything but the text: slides, shapes, tables, paragraphs, and each run's formatting and link."""
    out: list = [len(prs.slides)]
    for slide in prs.slides:
        out.append([(s.shape_type, s.name, s.has_text_frame) for s in all_shapes(slide.shapes)])
        out.append([(len(s.table.rows), len(s.table.columns)) for s in all_shapes(slide.shapes)
                    if getattr(s, "has_table", False)])
        out.append(slide.has_notes_slide)
    for where, frame in text_frames(prs):
        for p in frame.paragraphs:
            out.append((where, [(r.font.bold, r.font.italic, r.font.size, r.hyperlink.address) for r in p.runs],
                        [child.tag for child in p._p]))
    return out


def pptx_paragraph_texts(prs) -> list[str]:
    return [p.text for _, frame in text_frames(prs) for p in frame.paragraphs]


def test_pptx_fixture_round_trip_translates_every_text_and_keeps_the_rest():
    data = (OFFICE / "gdk-pixbuf.pptx").read_bytes()
    doc = read_presentation(data, "gdk-pixbuf.pptx", LIMITS)
    assert_clean(doc.segments)
    assert doc.segments == [
        "Image loaders", "The loaders read ⟦0⟧BMP, GIF and JPEG⟦1⟧ files.", "Could not allocate memory: %s",
        "Mention that the loaders are built as modules.",  # the notes, right after their slide
        "Known problems", "Format", "Problem", "ANI", "ANI image was truncated or incomplete."]
    out = doc.render([shout(s) for s in doc.segments], target="es")
    assert (out.filename, out.media_type) == ("gdk-pixbuf.es.pptx", PPTX_MEDIA_TYPE)
    assert "speaker notes" in out.note

    source, result = open_pptx(data), open_pptx(out.data)
    assert pptx_structure(result) == pptx_structure(source)
    before, after = pptx_paragraph_texts(source), pptx_paragraph_texts(result)
    assert after == [shout_text(t) for t in before]
    assert "» COULD NOT ALLOCATE MEMORY: %s" in after  # the placeholder is not upper-cased
    assert "» MENTION THAT THE LOADERS ARE BUILT AS MODULES." in after
    bold = [r.text for _, f in text_frames(result) for p in f.paragraphs for r in p.runs if r.font.bold]
    assert bold == ["BMP, GIF AND JPEG"]


def test_pptx_masters_and_layouts_are_not_translated():
    data = (OFFICE / "gdk-pixbuf.pptx").read_bytes()
    doc = read_presentation(data, "gdk-pixbuf.pptx", LIMITS)
    assert not any("Click to edit" in s for s in doc.segments)
    result = open_pptx(doc.render([shout(s) for s in doc.segments]).data)
    source = open_pptx(data)
    master_texts = lambda prs: [etree.tostring(layout.element) for layout in prs.slide_layouts] + [
        etree.tostring(prs.slide_master.element)]
    assert master_texts(result) == master_texts(source)
    assert b"Click to edit the title text format" in master_texts(result)[-1]


def test_pptx_identity_translation_changes_no_part():
    """python-pptx keeps every part; with the source text put back, each XML part means the same as before."""
    data = (OFFICE / "gdk-pixbuf.pptx").read_bytes()
    doc = read_presentation(data, "gdk-pixbuf.pptx", LIMITS)
    out = doc.render(list(doc.segments)).data
    parser = etree.XMLParser(remove_blank_text=True)
    canon = lambda blob: etree.tostring(etree.fromstring(blob, parser), method="c14n")
    with zipfile.ZipFile(io.BytesIO(data)) as a, zipfile.ZipFile(io.BytesIO(out)) as b:
        assert set(a.namelist()) == set(b.namelist())
        changed = [n for n in a.namelist() if canon(a.read(n)) != canon(b.read(n))]
    assert changed == ["[Content_Types].xml"]  # rebuilt from the parts present; LibreOffice lists absent ones too


def add_field(paragraph, text: str, kind: str = "datetime1") -> None:
    """Append a field (what PowerPoint fills in itself: slide number, date) after the paragraph's runs."""
    fld = etree.SubElement(paragraph._p, qn("a:fld"), id="{B6F15528-21DE-4FAA-801E-634DDDAF4B2B}", type=kind)
    etree.SubElement(fld, qn("a:t")).text = text


def make_deck() -> bytes:
    """python-pptx's default template (whose master holds "Click to edit" prompts) with the cases the fixture
    lacks: placeholders, a group, a hyperlink, runs differing only in language, a line break, a field, a real
    notes placeholder."""
    prs = pptx.Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[1])  # title and content placeholders
    slide.shapes.title.text = "Loader status"
    body = slide.placeholders[1].text_frame
    body.text = "Read the "
    link = body.paragraphs[0].add_run()
    link.text = "release notes"
    link.hyperlink.address = "https://example.org/notes"
    body.paragraphs[0].add_run().text = " first."
    same = body.add_paragraph()
    for text, lang in (("Hello ", "en-US"), ("world", "en-GB")):
        run = same.add_run()
        run.text = text
        run._r.get_or_add_rPr().set("lang", lang)
    broken = body.add_paragraph()
    broken.add_run().text = "First line"
    broken._p.append(broken._p.makeelement(qn("a:br"), {}))
    tail = broken.add_run()
    tail.text = "second line"
    dated = body.add_paragraph()
    dated.add_run().text = "Updated on "
    add_field(dated, "Monday")
    dated.add_run().text = " by the team"
    group = slide.shapes.add_group_shape()
    for i, text in enumerate(("Grouped note", "Another grouped note")):
        group.shapes.add_textbox(Inches(1), Inches(5 + i), Inches(3), Inches(1)).text_frame.text = text
    slide.notes_slide.notes_text_frame.text = "Speak slowly here."
    prs.slides.add_slide(prs.slide_layouts[6])  # blank: no text at all
    return pptx_bytes(prs)


def test_pptx_placeholders_groups_links_fields_and_notes_placeholder():
    data = make_deck()
    doc = read_presentation(data, "deck.pptx", LIMITS)
    assert doc.segments == ["Loader status", "Read the ⟦0⟧release notes⟦1⟧ first.",
                            "Hello world",  # runs differing only in `lang` look alike: no sentinel
                            "First line", "second line", "Updated on", "by the team",
                            "Grouped note", "Another grouped note", "Speak slowly here."]
    out = doc.render([shout(s) for s in doc.segments])
    source, result = open_pptx(data), open_pptx(out.data)
    assert pptx_structure(result) == pptx_structure(source)
    assert pptx_paragraph_texts(result) == [
        "» LOADER STATUS", "» READ THE RELEASE NOTES FIRST.", "» HELLO WORLD", "» FIRST LINE\v» SECOND LINE",
        "» UPDATED ON Monday » BY THE TEAM",  # a field is the viewer's to fill in, not text to translate
        "» GROUPED NOTE", "» ANOTHER GROUPED NOTE",
        "",  # the notes slide's slide-image placeholder
        "» SPEAK SLOWLY HERE.", ""]  # the notes' slide-number placeholder

    body = result.slides[0].placeholders[1].text_frame.paragraphs
    assert [(r.text, r.hyperlink.address) for r in body[0].runs] == [
        ("» READ THE ", None), ("RELEASE NOTES", "https://example.org/notes"), (" FIRST.", None)]
    assert [r._r.find(qn("a:rPr")).get("lang") for r in body[1].runs] == ["en-US", "en-GB"]
    assert [child.tag for child in body[2]._p if child.tag != qn("a:pPr")] == [qn("a:r"), qn("a:br"), qn("a:r")]
    assert [child.tag for child in body[3]._p] == [qn("a:r"), qn("a:fld"), qn("a:r")]
    assert result.slides[0].notes_slide.notes_text_frame.text == "» SPEAK SLOWLY HERE."


def test_pptx_chart_text_is_kept_and_the_note_says_so():
    prs = pptx.Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[5])  # title only
    slide.shapes.title.text = "Loaders by format"
    chart_data = CategoryChartData()
    chart_data.categories = ["Decoded", "Failed"]
    chart_data.add_series("Images", (7, 2))
    frame = slide.shapes.add_chart(XL_CHART_TYPE.COLUMN_CLUSTERED, Inches(1), Inches(2), Inches(6), Inches(4),
                                   chart_data)
    frame.chart.has_title = True
    frame.chart.chart_title.text_frame.text = "Images decoded"
    data = pptx_bytes(prs)
    doc = read_presentation(data, "chart.pptx", LIMITS)
    assert doc.segments == ["Loaders by format"]
    out = doc.render([shout(s) for s in doc.segments])
    assert out.note.endswith("The text of 1 chart was not translated.")
    result = open_pptx(out.data)
    assert result.slides[0].shapes.title.text == "» LOADERS BY FORMAT"
    assert result.slides[0].shapes[1].chart.chart_title.text_frame.text == "Images decoded"


def test_pptx_sentinels_dropped_or_reordered_still_place_all_text():
    data = (OFFICE / "gdk-pixbuf.pptx").read_bytes()
    for bad in ("Los cargadores leen BMP, GIF y JPEG archivos.",       # sentinels dropped
                "Los cargadores ⟦1⟧leen BMP, GIF y JPEG⟦0⟧ archivos."):  # sentinels swapped
        doc = read_presentation(data, "g.pptx", LIMITS)
        index = doc.segments.index("The loaders read ⟦0⟧BMP, GIF and JPEG⟦1⟧ files.")
        translations = list(doc.segments)
        translations[index] = bad
        result = open_pptx(doc.render(translations).data)
        runs = result.slides[0].shapes[1].text_frame.paragraphs[0].runs
        assert [r.font.bold for r in runs] == [False, True, False]
        assert "".join(r.text for r in runs) == "Los cargadores leen BMP, GIF y JPEG archivos."
        assert pptx_structure(result) == pptx_structure(open_pptx(data))


def test_pptx_damaged_files_are_refused_with_the_filename():
    data = (OFFICE / "gdk-pixbuf.pptx").read_bytes()
    with pytest.raises(UnsupportedDocument, match=r"^half\.pptx: the \.pptx is damaged"):
        read_presentation(data[: len(data) // 2], "half.pptx", LIMITS)
    bad_slide = rezip(data, "ppt/slides/slide1.xml", b"<p:sld><not-closed")
    with pytest.raises(UnsupportedDocument) as err:
        read_presentation(bad_slide, "bad.pptx", LIMITS)
    assert err.value.message == ("bad.pptx: the .pptx is damaged or not a PowerPoint presentation and cannot be "
                                 "read")


def make_docx() -> bytes:
    d = docx.Document()
    d.add_paragraph("Just a letter.")
    buf = io.BytesIO()
    d.save(buf)
    return buf.getvalue()


def test_pptx_that_is_another_office_file_says_what_it_is():
    with pytest.raises(UnsupportedDocument) as err:
        read_presentation(make_docx(), "slides.pptx", LIMITS)
    assert err.value.message == ("slides.pptx: not a PowerPoint presentation (it is a Word document; save it as "
                                 ".pptx or upload it as .docx)")
    with pytest.raises(UnsupportedDocument, match=r"^book\.pptx: not a PowerPoint presentation \(it is an Excel"):
        read_presentation((OFFICE / "gdk-pixbuf.xlsx").read_bytes(), "book.pptx", LIMITS)


def tiny_png() -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), "red").save(buf, "PNG")
    return buf.getvalue()


def test_pptx_without_text_is_refused():
    prs = pptx.Presentation()
    prs.slides.add_slide(prs.slide_layouts[6])
    with pytest.raises(InvalidInput) as err:
        read_presentation(pptx_bytes(prs), "blank.pptx", LIMITS)
    assert err.value.message == "blank.pptx: the presentation has no text to translate"
    prs.slides[0].shapes.add_picture(io.BytesIO(tiny_png()), Inches(1), Inches(1))
    with pytest.raises(InvalidInput, match=r"^photo\.pptx: the presentation holds only images"):
        read_presentation(pptx_bytes(prs), "photo.pptx", LIMITS)


# ------------------------------------------------------------------------------------------------------------------
# Excel


def open_xlsx(data: bytes) -> openpyxl.Workbook:
    return openpyxl.load_workbook(io.BytesIO(data), rich_text=True)


def xlsx_structure(wb: openpyxl.Workbook) -> list:
    """Everything but the text: sheets, their used range, merged cells, and each cell's type, style and format."""
    out: list = [wb.sheetnames]
    for ws in wb.worksheets:
        out.append((ws.title, ws.dimensions, sorted(str(r) for r in ws.merged_cells.ranges)))
        for row in ws.iter_rows():
            for cell in row:
                out.append((cell.coordinate, cell.data_type, cell.number_format, cell.font.b,
                            type(cell.value).__name__, cell.comment is not None))
    return out


def cells(wb: openpyxl.Workbook) -> dict[tuple[str, str], object]:
    return {(ws.title, c.coordinate): c.value for ws in wb.worksheets for row in ws.iter_rows() for c in row}


def blocks(value: CellRichText) -> list[tuple[str, bool]]:
    return [(b.text, bool(b.font.b)) if isinstance(b, TextBlock) else (b, False) for b in value]


def test_xlsx_fixture_round_trip_translates_text_cells_only():
    data = (OFFICE / "gdk-pixbuf.xlsx").read_bytes()
    doc = read_spreadsheet(data, "gdk-pixbuf.xlsx", LIMITS)
    assert_clean(doc.segments)
    assert URL not in doc.segments  # a cell that is only a link is data
    assert "Could not allocate memory: ⟦0⟧%s⟦1⟧ bytes needed" in doc.segments
    out = doc.render([shout(s) for s in doc.segments], target="es")
    assert (out.filename, out.media_type) == ("gdk-pixbuf.es.xlsx", XLSX_MEDIA_TYPE)

    source, result = open_xlsx(data), open_xlsx(out.data)
    assert xlsx_structure(result) == xlsx_structure(source)
    assert result.sheetnames == ["Loaders", "Notes"]
    before, after = cells(source), cells(result)
    for key, value in before.items():
        if isinstance(value, CellRichText):
            assert str(after[key]) == shout_text(str(value)), key
        elif isinstance(value, str) and not value.startswith("=") and value != URL:
            assert after[key] == shout_text(value) and after[key] != value, key
        else:  # numbers, the two dates (stored by LibreOffice as plain serial numbers), the formula, the link
            assert after[key] == value, key
    assert after["Loaders", "C4"] == "=SUM(C2:C3)" and after["Loaders", "D2"] == 45239
    assert after["Notes", "A1"] == "» IMAGE HAS ZERO WIDTH"
    assert blocks(after["Loaders", "B4"]) == [("» COULD NOT ALLOCATE MEMORY: ", False), ("%s", True),
                                             (" BYTES NEEDED", False)]


def make_workbook() -> bytes:
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Sales Q1"
    ws["A1"] = "Region"
    ws["B1"] = datetime.datetime(2024, 5, 17, 10, 30)
    ws["C1"] = True
    ws["D1"] = "#N/A"  # an error value
    ws["A2"] = "  North and south  "
    ws["B2"] = 42.5
    ws["C2"] = "First line\nsecond line"
    ws["D2"] = "12345"  # a number stored as text
    ws["A3"] = "support@example.org"
    ws["B3"] = "=B2*2"
    ws["C3"] = CellRichText(["Plain ", TextBlock(InlineFont(b=True), "bold"), TextBlock(InlineFont(i=True),
                                                                                          " italic")])
    ws["A3"].comment = Comment("Ask the sales team first.", "Ann")
    ws.merge_cells("A5:B5")
    ws["A5"] = "Merged heading"
    other = wb.create_sheet("Summary")
    other["A1"] = "='Sales Q1'!B2"
    other["A2"] = "Total"
    buf = io.BytesIO()
    wb.save(buf)
    return buf.getvalue()


def test_xlsx_dates_booleans_errors_line_breaks_comments_and_merged_cells():
    data = make_workbook()
    doc = read_spreadsheet(data, "sales.xlsx", LIMITS)
    assert doc.segments == ["Region", "North and south", "First line", "second line",
                            "Ask the sales team first.",  # A3's comment (its e-mail address is data)
                            "Plain ⟦0⟧bold⟦1⟧ italic", "Merged heading", "Total"]
    result = open_xlsx(doc.render([shout(s) for s in doc.segments]).data)
    source = open_xlsx(data)
    assert xlsx_structure(result) == xlsx_structure(source)
    after = cells(result)
    assert after["Sales Q1", "B1"] == datetime.datetime(2024, 5, 17, 10, 30)
    assert (after["Sales Q1", "C1"], after["Sales Q1", "D1"], after["Sales Q1", "D2"]) == (True, "#N/A", "12345")
    assert after["Sales Q1", "A2"] == "  » NORTH AND SOUTH  "  # the cell's own spaces stay
    assert after["Sales Q1", "C2"] == "» FIRST LINE\n» SECOND LINE"
    assert after["Sales Q1", "A3"] == "support@example.org"
    assert blocks(after["Sales Q1", "C3"]) == [("» PLAIN ", False), ("BOLD", True), (" ITALIC", False)]
    assert after["Sales Q1", "C3"][2].font.i
    assert (after["Sales Q1", "B3"], after["Summary", "A1"]) == ("=B2*2", "='Sales Q1'!B2")
    comment = result["Sales Q1"]["A3"].comment
    assert (comment.text, comment.author) == ("» ASK THE SALES TEAM FIRST.", "Ann")
    assert after["Sales Q1", "A5"] == "» MERGED HEADING"


def test_xlsx_translation_that_looks_like_a_formula_or_an_error_stays_text():
    doc = read_spreadsheet(make_workbook(), "sales.xlsx", LIMITS)
    translations = list(doc.segments)
    translations[doc.segments.index("Region")] = "=Región"
    translations[doc.segments.index("Total")] = "#N/A"
    translations[doc.segments.index("Merged heading")] = "Título\x07 unido"  # a control character XML refuses
    result = open_xlsx(doc.render(translations).data)
    assert (result["Sales Q1"]["A1"].value, result["Sales Q1"]["A1"].data_type) == ("=Región", "s")
    assert (result["Summary"]["A2"].value, result["Summary"]["A2"].data_type) == ("#N/A", "s")
    assert result["Sales Q1"]["A5"].value == "Título unido"


def test_xlsx_sentinels_dropped_or_reordered_still_place_all_text():
    data = (OFFICE / "gdk-pixbuf.xlsx").read_bytes()
    for bad in ("No se pudo asignar memoria: %s bytes necesarios",
                "No se pudo asignar ⟦1⟧memoria: %s⟦0⟧ bytes necesarios"):
        doc = read_spreadsheet(data, "g.xlsx", LIMITS)
        translations = list(doc.segments)
        translations[doc.segments.index("Could not allocate memory: ⟦0⟧%s⟦1⟧ bytes needed")] = bad
        result = open_xlsx(doc.render(translations).data)
        value = result["Loaders"]["B4"].value
        assert isinstance(value, CellRichText) and result["Loaders"]["B4"].data_type == "s"
        assert str(value) == "No se pudo asignar memoria: %s bytes necesarios"
        # The text is cut in proportion to the runs and at spaces, so the two-letter bold run can come back empty
        # and be dropped; the runs that remain carry the source's fonts.
        fonts = [b.font for b in open_xlsx(data)["Loaders"]["B4"].value]
        assert len(value) >= 2 and all(b.font in fonts for b in value)
        assert xlsx_structure(result) == xlsx_structure(open_xlsx(data))


def test_xlsx_damaged_files_are_refused_with_the_filename():
    data = (OFFICE / "gdk-pixbuf.xlsx").read_bytes()
    with pytest.raises(UnsupportedDocument, match=r"^half\.xlsx: the \.xlsx is damaged"):
        read_spreadsheet(data[: len(data) // 2], "half.xlsx", LIMITS)
    for member in ("xl/worksheets/sheet1.xml", "xl/sharedStrings.xml", "xl/styles.xml"):
        bad = rezip(data, member, b"<worksheet><not-closed")
        with pytest.raises(UnsupportedDocument) as err:
            read_spreadsheet(bad, "bad.xlsx", LIMITS)
        assert err.value.message == "bad.xlsx: the .xlsx is damaged or not an Excel workbook and cannot be read"


def test_xlsx_that_is_another_office_file_says_what_it_is():
    with pytest.raises(UnsupportedDocument) as err:
        read_spreadsheet((OFFICE / "gdk-pixbuf.pptx").read_bytes(), "table.xlsx", LIMITS)
    assert err.value.message == ("table.xlsx: not an Excel workbook (it is a PowerPoint presentation; save it as "
                                 ".xlsx or upload it as .pptx)")


def test_xlsx_without_text_is_refused():
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.append([1, 2.5, datetime.date(2024, 1, 1), "=A1+B1", URL, "42 %"])
    buf = io.BytesIO()
    wb.save(buf)
    with pytest.raises(InvalidInput) as err:
        read_spreadsheet(buf.getvalue(), "numbers.xlsx", LIMITS)
    assert err.value.message == ("numbers.xlsx: the workbook has no text to translate (only numbers, dates, "
                                 "formulas or links)")


def with_text_box(data: bytes) -> bytes:
    """Add a text-box shape beside the picture of `data`'s first drawing, as Excel stores one."""
    name = "xl/drawings/drawing1.xml"
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        root = etree.fromstring(zf.read(name))
    xdr = "http://schemas.openxmlformats.org/drawingml/2006/spreadsheetDrawing"
    a = "http://schemas.openxmlformats.org/drawingml/2006/main"
    anchor = copy.deepcopy(root[0])
    for child in list(anchor):
        if child.tag == f"{{{xdr}}}pic":
            anchor.remove(child)
            shape = etree.fromstring(
                f'<xdr:sp xmlns:xdr="{xdr}" xmlns:a="{a}"><xdr:nvSpPr><xdr:cNvPr id="9" name="TextBox 1"/>'
                '<xdr:cNvSpPr txBox="1"/></xdr:nvSpPr><xdr:spPr><a:prstGeom prst="rect"/></xdr:spPr>'
                '<xdr:txBody><a:bodyPr/><a:p><a:r><a:t>Shape text</a:t></a:r></a:p></xdr:txBody></xdr:sp>')
            child.addprevious(shape)
    root.append(anchor)
    return rezip(data, name, etree.tostring(root, xml_declaration=True, encoding="UTF-8", standalone=True))


def test_xlsx_keeps_pictures_and_says_when_shapes_are_lost():
    wb = openpyxl.load_workbook(io.BytesIO(make_workbook()))
    wb.active.add_image(openpyxl.drawing.image.Image(io.BytesIO(tiny_png())), "F2")
    buf = io.BytesIO()
    wb.save(buf)
    plain = read_spreadsheet(buf.getvalue(), "pic.xlsx", LIMITS).render(["x"] * 8)
    assert "could not be kept" not in plain.note
    with zipfile.ZipFile(io.BytesIO(plain.data)) as zf:
        assert any(n.startswith("xl/media/") for n in zf.namelist())  # the picture survives

    shaped = read_spreadsheet(with_text_box(buf.getvalue()), "shape.xlsx", LIMITS).render(["x"] * 8)
    assert "1 drawing shape (text boxes, arrows, SmartArt) could not be kept" in shaped.note
    with zipfile.ZipFile(io.BytesIO(shaped.data)) as zf:
        assert any(n.startswith("xl/media/") for n in zf.namelist())
        assert b"Shape text" not in zf.read("xl/drawings/drawing1.xml")
