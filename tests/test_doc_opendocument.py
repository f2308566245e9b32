"""OpenDocument (.odt, .ods, .odp): a round trip changes the text and nothing else.

The fixtures under tests/data/office were made by LibreOffice from the flat sources beside them (make.sh). The
translator is `shout`: what a model that copies masked spans does, with upper-casing for translation, so that
`%s`, URLs and sentinels come back as they went and every translated letter shows.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from lxml import etree

from hunyuan_mt.text import masking
from hunyuan_mt.config import LimitsConfig
from hunyuan_mt.documents.base import needs_translation
from hunyuan_mt.documents.opendocument import OpenDocument, read_odp, read_ods, read_odt
from hunyuan_mt.errors import InvalidInput, UnsupportedDocument

OFFICE = Path(__file__).parent / "data" / "office"
LIMITS = LimitsConfig()
READERS: dict[str, Callable[[bytes, str, LimitsConfig], OpenDocument]] = {
    "odt": read_odt, "ods": read_ods, "odp": read_odp}
NS = {
    "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
    "style": "urn:oasis:names:tc:opendocument:xmlns:style:1.0",
    "text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
    "table": "urn:oasis:names:tc:opendocument:xmlns:table:1.0",
    "draw": "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0",
    "presentation": "urn:oasis:names:tc:opendocument:xmlns:presentation:1.0",
    "fo": "urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0",
    "xlink": "http://www.w3.org/1999/xlink",
    "dc": "http://purl.org/dc/elements/1.1/",
    "meta": "urn:oasis:names:tc:opendocument:xmlns:meta:1.0",
    "officeooo": "http://openoffice.org/2009/office",
    "manifest": "urn:oasis:names:tc:opendocument:xmlns:manifest:1.0",
}
DECLS = " ".join(f'xmlns:{prefix}="{uri}"' for prefix, uri in NS.items())
MEDIA = {"odt": "application/vnd.oasis.opendocument.text",
         "ods": "application/vnd.oasis.opendocument.spreadsheet",
         "odp": "application/vnd.oasis.opendocument.presentation"}


def q(name: str) -> str:
    prefix, local = name.split(":")
    return f"{{{NS[prefix]}}}{local}"


def shout(segment: str) -> str:
    protected = masking.protect(segment)
    return masking.restore(protected.text.upper(), protected)


def fixture(kind: str) -> bytes:
    return (OFFICE / f"gdk-pixbuf.{kind}").read_bytes()


def members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def part(data: bytes, name: str) -> etree._Element:
    return etree.fromstring(members(data)[name])


def shape(root: etree._Element) -> list[tuple[str, list[tuple[str, str]]]]:
    """Every element's tag and attributes, in document order."""
    return [(el.tag, sorted(el.attrib.items())) for el in root.iter() if isinstance(el.tag, str)]


def text_nodes(root: etree._Element) -> list[str]:
    """Every element's text and tail, in document order (the same positions in two trees of one shape)."""
    return [value or "" for el in root.iter() if isinstance(el.tag, str) for value in (el.text, el.tail)]


def translate(kind: str, data: bytes | None = None, translator: Callable[[str], str] = shout,
              target: str | None = "es") -> tuple[OpenDocument, bytes]:
    data = fixture(kind) if data is None else data
    document = READERS[kind](data, f"gdk-pixbuf.{kind}", LIMITS)
    rendered = document.render([translator(s) for s in document.segments], target=target)
    assert rendered.filename == f"gdk-pixbuf.{target or 'translated'}.{kind}"
    assert rendered.media_type == MEDIA[kind]
    return document, rendered.data


def with_member(data: bytes, name: str, edit: Callable[[bytes], bytes]) -> bytes:
    """The package with one member changed (mimetype stays first and stored)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            body = zin.read(info)
            zout.writestr(info, edit(body) if info.filename == name else body)
    return out.getvalue()


def package(kind: str, body: str, automatic: str = "") -> bytes:
    """A minimal package of `kind` whose office body holds `body`."""
    container = {"odt": "text", "ods": "spreadsheet", "odp": "presentation"}[kind]
    content = (f'<?xml version="1.0" encoding="UTF-8"?><office:document-content {DECLS} office:version="1.3">'
               f"<office:automatic-styles>{automatic}</office:automatic-styles>"
               f"<office:body><office:{container}>{body}</office:{container}></office:body>"
               "</office:document-content>")
    manifest = (f'<manifest:manifest xmlns:manifest="{NS["manifest"]}" manifest:version="1.3">'
                f'<manifest:file-entry manifest:full-path="/" manifest:media-type="{MEDIA[kind]}"/>'
                '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/>'
                "</manifest:manifest>")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("mimetype", MEDIA[kind], compress_type=zipfile.ZIP_STORED)
        zf.writestr("content.xml", content)
        zf.writestr("META-INF/manifest.xml", manifest)
    return out.getvalue()


def assert_clean_segments(segments: list[str]) -> None:
    assert segments
    for segment in segments:
        assert segment == segment.strip() and needs_translation(segment), repr(segment)


# ------------------------------------------------------------------------------------------------------------------
# The three fixtures: same structure, every text translated, nothing else changed.


@pytest.mark.parametrize("kind", ["odt", "ods", "odp"])
def test_round_trip_keeps_the_package_and_the_element_tree(kind: str) -> None:
    _, out = translate(kind)
    before, after = members(fixture(kind)), members(out)
    with zipfile.ZipFile(io.BytesIO(out)) as zf, zipfile.ZipFile(io.BytesIO(fixture(kind))) as source:
        first = zf.infolist()[0]
        assert zf.testzip() is None
        assert [(i.filename, i.compress_type) for i in zf.infolist()] == [
            (i.filename, i.compress_type) for i in source.infolist()]
    assert (first.filename, first.compress_type, first.extra) == ("mimetype", zipfile.ZIP_STORED, b"")
    assert list(after) == list(before)
    # Only the parts holding text (content.xml) and meta.xml (dc:language) are rewritten; the manifest, the
    # settings, the thumbnails and every style part stay byte for byte.
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"content.xml", "meta.xml"}
    # Tags and every attribute (style names, hrefs, sheet names, cell values and types, formulas) are unchanged.
    assert shape(part(out, "content.xml")) == shape(part(fixture(kind), "content.xml"))
    meta = part(out, "meta.xml")
    assert meta.findtext("office:meta/dc:language", namespaces=NS) == "es"
    assert [tag for tag, _ in shape(meta)] == [tag for tag, _ in shape(part(fixture(kind), "meta.xml"))] + [
        q("dc:language")]


@pytest.mark.parametrize("kind", ["odt", "ods", "odp"])
def test_every_text_is_translated_and_everything_else_is_kept(kind: str) -> None:
    document, out = translate(kind)
    assert_clean_segments(document.segments)
    before, after = text_nodes(part(fixture(kind), "content.xml")), text_nodes(part(out, "content.xml"))
    assert len(before) == len(after)
    changed = 0
    for old, new in zip(before, after):
        if new != old:
            assert new == shout(old), (old, new)
            changed += 1
        # Nothing with lower-case letters is left outside the masked spans (%s, the URL): all of it was translated.
        assert not any(ch.islower() for ch in masking.protect(new).text), (old, new)
    assert changed >= sum(shout(s) != s for s in document.segments) > 0
    for paragraph in part(out, "content.xml").iter(q("text:p"), q("text:h")):
        assert "  " not in "".join(paragraph.itertext())


def test_odt_segments_cut_at_tabs_and_breaks_with_the_footnote_apart() -> None:
    document, out = translate("odt")
    assert document.segments == [
        "Image loaders",
        "The image loaders read ⟦0⟧BMP, GIF and JPEG⟦1⟧ files into a pixbuf.",
        "Could not allocate memory: %s",
        "See ⟦0⟧the project page⟦1⟧ for the ⟦2⟧release notes⟦3⟧.",
        "The loaders are built as modules.",
        "Options:", "--verbose", "Print the version and exit.",
        "Color profile has invalid length %d.",
        "BMP image has unsupported depth",
        "Format", "Description", "ANI", "ANI image was truncated or incomplete.",
        "Failed to load image “%s”: reason not known, probably a corrupt image file",
    ]
    body = part(out, "content.xml")
    link = body.find(".//text:a", NS)
    assert link.text == "THE PROJECT PAGE"
    assert link.get(q("xlink:href")) == "https://gitlab.gnome.org/GNOME/gdk-pixbuf"
    bold = body.find(".//text:span", NS)
    assert (bold.text, bold.tail) == ("BMP, GIF AND JPEG", " FILES INTO A PIXBUF.")
    note = body.find(".//text:note", NS)
    assert note.findtext("text:note-citation", namespaces=NS) == "1"
    assert note.findtext("text:note-body/text:p", namespaces=NS) == "THE LOADERS ARE BUILT AS MODULES."
    options = next(p for p in body.iter(q("text:p")) if p.find("text:tab", NS) is not None)
    assert [child.tag for child in options] == [q("text:tab"), q("text:line-break")]
    assert [options.text, options[0].tail, options[1].tail] == ["OPTIONS:", "--VERBOSE", "PRINT THE VERSION AND EXIT."]
    assert "COULD NOT ALLOCATE MEMORY: %s" in [p.text for p in body.iter(q("text:p"))]


def test_ods_translates_text_cells_only() -> None:
    document, out = translate("ods")
    assert document.segments == [
        "Format", "Message", "Count", "Released",
        "BMP", "BMP image has bogus header data",
        "GIF", "GIF image was truncated or incomplete.",
        "Total", "Could not allocate memory: ⟦0⟧%s⟦1⟧ bytes needed",
        "Image has zero width", "Unsupported animation type",
    ]
    body = part(out, "content.xml")
    assert [t.get(q("table:name")) for t in body.iter(q("table:table"))] == ["Loaders", "Notes"]
    rows = [[(cell.get(q("office:value-type")), cell.get(q("office:value")), cell.get(q("table:formula")),
              "".join(cell.itertext())) for cell in row.iter(q("table:table-cell"))]
            for row in body.iter(q("table:table-row"))]
    assert rows[1][2:] == [("float", "3", None, "3"), ("float", "45239", None, "45239")]
    assert rows[3] == [("string", None, None, "TOTAL"),
                       ("string", None, None, "COULD NOT ALLOCATE MEMORY: %s BYTES NEEDED"),
                       ("float", "8", "of:=SUM([.C2:.C3])", "8"),
                       ("string", None, None, "https://gitlab.gnome.org/GNOME/gdk-pixbuf")]
    assert body.find(".//text:span", NS).text == "%s"
    assert rows[5] == [("string", None, None, "UNSUPPORTED ANIMATION TYPE")]


def test_odp_translates_slides_tables_and_speaker_notes() -> None:
    document, out = translate("odp")
    assert document.segments == [
        "Image loaders", "The loaders read ⟦0⟧BMP, GIF and JPEG⟦1⟧ files.", "Could not allocate memory: %s",
        "Mention that the loaders are built as modules.",
        "Known problems", "Format", "Problem", "ANI", "ANI image was truncated or incomplete.",
    ]
    body = part(out, "content.xml")
    assert [page.get(q("draw:name")) for page in body.iter(q("draw:page"))] == ["page1", "page2"]
    notes = body.find(".//presentation:notes", NS)
    assert "".join(notes.itertext()).strip() == "MENTION THAT THE LOADERS ARE BUILT AS MODULES."
    cells = ["".join(cell.itertext()).strip() for cell in body.iter(q("table:table-cell"))]
    assert cells == ["FORMAT", "PROBLEM", "ANI", "ANI IMAGE WAS TRUNCATED OR INCOMPLETE."]


# ------------------------------------------------------------------------------------------------------------------
# Parts other than the body.


def test_odt_headers_and_footers_of_master_pages_are_translated() -> None:
    master = (b'<style:master-page style:name="Standard" style:page-layout-name="Mpm1"><style:header>'
              b"<text:p>Confidential draft</text:p></style:header><style:footer><text:p>Page "
              b'<text:page-number text:select-page="current">1</text:page-number> of the report</text:p>'
              b"</style:footer></style:master-page>")
    data = with_member(fixture("odt"), "styles.xml",
                       lambda xml: xml.replace(b'<style:master-page style:name="Standard" '
                                               b'style:page-layout-name="Mpm1"/>', master))
    document, out = translate("odt", data)
    assert document.segments[-2:] == ["Confidential draft", "Page ⟦0⟧ of the report"]
    styles = part(out, "styles.xml")
    assert shape(styles) == shape(part(data, "styles.xml"))
    page = styles.find(".//style:master-page", NS)
    assert page.findtext("style:header/text:p", namespaces=NS) == "CONFIDENTIAL DRAFT"
    footer = page.find("style:footer/text:p", NS)
    assert (footer.text, footer[0].text, footer[0].tail) == ("PAGE ", "1", " OF THE REPORT")


def test_odp_master_page_prompts_are_left_alone() -> None:
    prompt = b"<draw:text-box><text:p>Click to edit the title text format</text:p></draw:text-box>"
    data = with_member(fixture("odp"), "styles.xml", lambda xml: xml.replace(b"<draw:text-box/>", prompt, 1))
    assert b"Click to edit" in members(data)["styles.xml"]
    document, out = translate("odp", data)
    assert not any("Click" in s for s in document.segments)
    assert members(out)["styles.xml"] == members(data)["styles.xml"]


def test_document_title_is_translated() -> None:
    data = with_member(fixture("odt"), "meta.xml",
                       lambda xml: xml.replace(b"</office:meta>", b"<dc:title>Image loaders guide</dc:title>"
                                                                  b"</office:meta>"))
    document, out = translate("odt", data, target="de")
    assert document.segments[-1] == "Image loaders guide"
    meta = part(out, "meta.xml")
    assert meta.findtext("office:meta/dc:title", namespaces=NS) == "IMAGE LOADERS GUIDE"
    assert meta.findtext("office:meta/dc:language", namespaces=NS) == "de"


def test_without_a_target_meta_is_kept() -> None:
    _, out = translate("odp", target=None)
    assert members(out)["meta.xml"] == members(fixture("odp"))["meta.xml"]


# ------------------------------------------------------------------------------------------------------------------
# Inline content.


def test_fields_spaces_notes_and_bookmarks_keep_their_place() -> None:
    body = ('<text:p><text:s text:c="4"/>Indented line</text:p>'
            '<text:p>Today is <text:date text:date-value="2024-01-05">January 5, 2024</text:date> and it rains'
            "</text:p>"
            '<text:p>Read the<text:note text:id="n1" text:note-class="endnote"><text:note-citation>i'
            "</text:note-citation><text:note-body><text:p>Only on Linux</text:p></text:note-body></text:note> "
            "manual first</text:p>"
            '<text:h text:outline-level="1"><text:bookmark-start text:name="b"/>Loader options'
            '<text:bookmark-end text:name="b"/></text:h>')
    document, out = translate("odt", package("odt", body))
    assert document.segments == ["Indented line", "Today is ⟦0⟧ and it rains", "Read the⟦0⟧ manual first",
                                 "Only on Linux", "Loader options"]
    text = part(out, "content.xml").find(".//office:text", NS)
    indented, today, read, heading = text
    assert (indented.text, indented[0].tail) == (None, "INDENTED LINE")  # the spaces stay in front
    assert (today.text, today[0].text, today[0].tail) == ("TODAY IS ", "January 5, 2024", " AND IT RAINS")
    assert (read.text, read[0].tail) == ("READ THE", " MANUAL FIRST")
    assert read[0].findtext("text:note-citation", namespaces=NS) == "i"
    assert read.findtext(".//text:note-body/text:p", namespaces=NS) == "ONLY ON LINUX"
    assert [heading.text, heading[0].tail, heading[1].tail] == [None, "LOADER OPTIONS", None]


@pytest.mark.parametrize("translation, footer", [
    ("Seite⟦0⟧von", ["Seite ", " von ", ""]),               # the model dropped the spaces beside the fields
    ("Seite ⟦0⟧ von", ["Seite ", " von ", ""]),             # split_at_sentinels would keep only one of the two
    ("Seite von", ["Seite ", " von ", ""]),                 # no sentinels: cut in proportion, spaces kept
])
def test_the_spacing_around_a_field_is_the_sources(translation: str, footer: list[str]) -> None:
    body = ('<text:p>Page <text:page-number text:select-page="current">1</text:page-number> of '
            '<text:page-count>3</text:page-count></text:p>'
            '<text:p>Read the<text:note text:id="n1" text:note-class="footnote"><text:note-citation>1'
            "</text:note-citation><text:note-body><text:p>Only on Linux</text:p></text:note-body></text:note> "
            "manual first</text:p>")
    document = read_odt(package("odt", body), "fields.odt", LIMITS)
    assert document.segments == ["Page ⟦0⟧ of", "Read the⟦0⟧ manual first", "Only on Linux"]
    out = document.render([translation, "Lies das ⟦0⟧ Handbuch zuerst", "Nur unter Linux"]).data
    page, read = part(out, "content.xml").find(".//office:text", NS)
    assert [page.text, page[0].tail, page[1].tail or ""] == footer
    assert [page[0].text, page[1].text] == ["1", "3"]
    assert (read.text, read[0].tail) == ("Lies das", " Handbuch zuerst")  # the note mark stays on its word


def test_deleted_changes_and_comments_are_not_translated() -> None:
    body = ('<text:tracked-changes><text:changed-region text:id="c1"><text:deletion><office:change-info>'
            "<dc:creator>Ann</dc:creator><dc:date>2024-01-05T10:00:00</dc:date></office:change-info>"
            "<text:p>Removed words</text:p></text:deletion></text:changed-region></text:tracked-changes>"
            '<text:p>Kept <text:change text:change-id="c1"/>words<office:annotation><dc:creator>Ann</dc:creator>'
            "<text:p>Please check this</text:p></office:annotation></text:p>")
    document, out = translate("odt", package("odt", body))
    assert document.segments == ["Kept ⟦0⟧words"]
    content = members(out)["content.xml"]
    assert b"Removed words" in content and b"Please check this" in content and b"KEPT " in content


def test_styles_that_differ_only_in_editing_ids_are_one_look() -> None:
    automatic = ('<style:style style:name="T1" style:family="text"><style:text-properties officeooo:rsid="0012ab"/>'
                 '</style:style><style:style style:name="T2" style:family="text"><style:text-properties '
                 'fo:font-weight="bold" officeooo:rsid="0034cd"/></style:style>')
    body = ('<text:p>Hel<text:span text:style-name="T1">lo wor</text:span>ld, '
            '<text:span text:style-name="T2">bold</text:span> move</text:p>')
    german = "Hallo Welt, ⟦0⟧fett⟦1⟧ Zug"
    document, out = translate("odt", package("odt", body, automatic), translator=lambda _: german)
    assert document.segments == ["Hello world, ⟦0⟧bold⟦1⟧ move"]
    paragraph = part(out, "content.xml").find(".//text:p", NS)
    assert paragraph.text == "Hallo Welt, "
    assert [(span.text or "", span.tail or "") for span in paragraph] == [("", ""), ("fett", " Zug")]


def test_a_translation_without_its_sentinels_still_places_all_text() -> None:
    document = read_odt(fixture("odt"), "gdk-pixbuf.odt", LIMITS)
    german = {"See ⟦0⟧the project page⟦1⟧ for the ⟦2⟧release notes⟦3⟧.":
              "Die Versionshinweise stehen auf der Projektseite.",
              "The image loaders read ⟦0⟧BMP, GIF and JPEG⟦1⟧ files into a pixbuf.":
              "Die Bildlader lesen BMP-, GIF- und JPEG-Dateien in einen Pixbuf."}
    out = document.render([german.get(s, s) for s in document.segments]).data
    body = part(out, "content.xml")  # well-formed
    assert shape(body) == shape(part(fixture("odt"), "content.xml"))
    paragraphs = {"".join(p.xpath("text()|*[not(self::text:note)]//text()", namespaces=NS)): p
                  for p in body.iter(q("text:p"))}
    assert "Die Versionshinweise stehen auf der Projektseite." in paragraphs
    assert "Die Bildlader lesen BMP-, GIF- und JPEG-Dateien in einen Pixbuf." in paragraphs
    link = paragraphs["Die Versionshinweise stehen auf der Projektseite."].find("text:a", NS)
    assert link.text and link.text == link.text.strip()  # the link holds whole words
    assert not any("  " in text for text in paragraphs)


# ------------------------------------------------------------------------------------------------------------------
# Spreadsheet cells.


def test_ods_cells_that_hold_values_or_formulas_are_kept() -> None:
    body = ('<table:table table:name="Sheet One"><table:table-row>'
            '<table:table-cell office:value-type="date" office:date-value="2024-01-05"><text:p>Friday, January 5'
            "</text:p></table:table-cell>"
            '<table:table-cell office:value-type="boolean" office:boolean-value="true"><text:p>True</text:p>'
            "</table:table-cell>"
            '<table:table-cell table:formula="of:=&quot;Sum&quot;&amp;&quot; total&quot;" office:value-type='
            '"string" office:string-value="Sum total"><text:p>Sum total</text:p></table:table-cell>'
            '<table:table-cell office:value-type="string" office:string-value="Old text"><text:p>Old text</text:p>'
            "</table:table-cell><table:table-cell><text:p>No type</text:p></table:table-cell>"
            "</table:table-row></table:table>")
    document, out = translate("ods", package("ods", body))
    assert document.segments == ["Old text", "No type"]
    cells = list(part(out, "content.xml").iter(q("table:table-cell")))
    assert ["".join(c.itertext()) for c in cells] == ["Friday, January 5", "True", "Sum total", "OLD TEXT",
                                                      "NO TYPE"]
    assert cells[2].get(q("office:string-value")) == "Sum total"
    # A string cell's stored value would still say "Old text": it goes, so the cell's text is its value.
    assert cells[3].get(q("office:string-value")) is None
    assert part(out, "content.xml").find(".//table:table", NS).get(q("table:name")) == "Sheet One"


# ------------------------------------------------------------------------------------------------------------------
# Bad uploads.


def test_a_damaged_package_is_refused_with_its_name() -> None:
    with pytest.raises(UnsupportedDocument, match=r"^broken\.odt: the \.odt is damaged"):
        read_odt(fixture("odt")[:3000], "broken.odt", LIMITS)
    bad_xml = with_member(fixture("odt"), "content.xml", lambda xml: xml[: len(xml) // 2])
    with pytest.raises(UnsupportedDocument, match=r"^half\.odt: the \.odt is damaged .* cannot be read"):
        read_odt(bad_xml, "half.odt", LIMITS)


def test_the_wrong_kind_names_what_it_is() -> None:
    with pytest.raises(UnsupportedDocument, match=r"^sheet\.odt: not an OpenDocument text \(it is an OpenDocument "
                                                  r"spreadsheet; .*\.ods\)"):
        read_odt(fixture("ods"), "sheet.odt", LIMITS)
    with pytest.raises(UnsupportedDocument, match=r"^slides\.ods: not an OpenDocument spreadsheet"):
        read_ods(fixture("odp"), "slides.ods", LIMITS)


def test_nothing_to_translate_is_invalid_input() -> None:
    numbers = ('<table:table table:name="Data"><table:table-row><table:table-cell office:value-type="float" '
               'office:value="3"><text:p>3</text:p></table:table-cell><table:table-cell office:value-type="string">'
               "<text:p>https://example.org/data</text:p></table:table-cell></table:table-row></table:table>")
    with pytest.raises(InvalidInput, match=r"^numbers\.ods: the spreadsheet has no text cells to translate"):
        read_ods(package("ods", numbers), "numbers.ods", LIMITS)
    with pytest.raises(InvalidInput, match=r"^empty\.odp: the presentation has no text"):
        read_odp(package("odp", '<draw:page draw:name="p1"/>'), "empty.odp", LIMITS)


def test_a_password_protected_package_says_so() -> None:
    locked = with_member(fixture("odt"), "META-INF/manifest.xml",
                         lambda xml: xml.replace(b'manifest:full-path="content.xml" manifest:media-type="text/xml"/>',
                                                 b'manifest:full-path="content.xml" manifest:media-type="text/xml">'
                                                 b"<manifest:encryption-data/></manifest:file-entry>"))
    assert b"encryption-data" in members(locked)["META-INF/manifest.xml"]
    with pytest.raises(UnsupportedDocument, match=r"^locked\.odt: .*password"):
        read_odt(locked, "locked.odt", LIMITS)
