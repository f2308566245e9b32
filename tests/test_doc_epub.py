"""EPUB books: a translated book has the same zip, spine and element trees as the upload, with every chapter text,
navigation label and the title translated, everything else kept; bad uploads get typed errors.

The translator upper-cases each segment (sentinels have no case, so they come back in place): an untranslated text
is one that still has a lower-case letter.
"""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import pytest
from ebooklib import epub
from lxml import etree

from hunyuan_mt.text import masking
from hunyuan_mt.config import LimitsConfig
from hunyuan_mt.documents.ebook import EpubDocument, read_epub
from hunyuan_mt.errors import InvalidInput, UnsupportedDocument

LIMITS = LimitsConfig()
FIXTURE = Path(__file__).parent / "data" / "office" / "gdk-pixbuf.epub"
XHTML = "http://www.w3.org/1999/xhtml"
NCX = "http://www.daisy.org/z3986/2005/ncx/"
DC = "http://purl.org/dc/elements/1.1/"
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
# Attributes the translation may change; every other attribute (href, src, id, class, ...) must stay.
CHANGED_ATTRIBUTES = {"alt", "title", "lang", XML_LANG}
# Elements whose text is never translated.
KEPT = {f"{{{XHTML}}}{tag}" for tag in ("code", "pre", "script", "style")}
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
FONT = bytes(range(255, -1, -1))


def upper(segments: list[str]) -> list[str]:
    return [s.upper() for s in segments]


def translate(data: bytes, target: str | None = "es", filename: str = "book.epub") -> bytes:
    document = read_epub(data, filename, LIMITS)
    return document.render(upper(document.segments), target).data


def parse(data: bytes) -> etree._Element:
    """Well-formed XML or an exception: what a reading system needs of every chapter."""
    return etree.fromstring(data, etree.XMLParser(resolve_entities=False, no_network=True))


def zip_members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def layout(data: bytes) -> list[tuple[str, int]]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return [(info.filename, info.compress_type) for info in zf.infolist()]


def shape(root: etree._Element) -> list[tuple[object, dict[str, str]]]:
    """Every element in document order with its untranslatable attributes (a meta charset compared without case:
    HtmlDocument writes `utf-8` for `UTF-8`)."""
    def value(key: str, value: str) -> str:
        return value.lower() if key == "content" and "charset=" in value.lower() else value

    return [(e.tag, {k: value(k, v) for k, v in e.attrib.items() if k not in CHANGED_ATTRIBUTES})
            for e in root.iter()]


def visible_texts(root: etree._Element) -> list[str]:
    """Text nodes with letters outside code, pre, script and style."""
    found: list[str] = []

    def kept(element: etree._Element) -> bool:
        return any(a.tag in KEPT for a in (element, *element.iterancestors()))

    for element in root.iter():
        if isinstance(element.tag, str) and element.text and not kept(element):
            found.append(element.text)
        parent = element.getparent()
        if element.tail and parent is not None and not kept(parent):
            found.append(element.tail)
    return [t for t in found if any(ch.isalpha() for ch in t)]


def package(data: bytes) -> epub.EpubBook:
    return epub.read_epub(io.BytesIO(data), {"ignore_ncx": True})


def rezip(data: bytes, changes: dict[str, bytes | None]) -> bytes:
    """`data` with members replaced, added (at the end) or removed (None), mimetype first and stored."""
    members = zip_members(data)
    members.update(changes)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, content in members.items():
            if content is not None:
                zf.writestr(name, content, zipfile.ZIP_STORED if name == "mimetype" else zipfile.ZIP_DEFLATED)
    return out.getvalue()


# ------------------------------------------------------------------------------------------------------------------
# Books built here.


def make_epub3(*, text: bool = True) -> bytes:
    """Two chapters (added to the manifest in the opposite order of the spine), a nav document in the spine, an
    NCX, a stylesheet, an image, and a font that META-INF/encryption.xml says is obfuscated."""
    book = epub.EpubBook()
    book.set_identifier("urn:uuid:12345678-1234-5678-1234-567812345678")
    book.set_title("The Pixbuf Handbook")
    book.set_language("en")
    css = epub.EpubItem(uid="style", file_name="style/main.css", media_type="text/css",
                        content=b"p { color: #123456; }\n")
    logo = epub.EpubImage(uid="logo", file_name="images/logo.png", media_type="image/png", content=PNG)
    font = epub.EpubItem(uid="font", file_name="fonts/body.otf", media_type="font/otf", content=FONT)
    ch1 = epub.EpubHtml(title="Loading images", file_name="text/ch1.xhtml", lang="en")
    ch2 = epub.EpubHtml(title="Saving images", file_name="text/ch2.xhtml", lang="en")
    if text:
        ch1.content = ('<h1 id="load">Loading images</h1>'
                       '<p>The loader reads <b>every</b> file &amp; checks it, see <a href="ch2.xhtml#save">saving</a>'
                       '.</p><p><img src="../images/logo.png" alt="The project logo"/></p>'
                       '<pre><code>pixbuf = gdk_pixbuf_new_from_file (path, &amp;error);</code></pre>')
        ch2.content = ('<h1 id="save">Saving images</h1>'
                       '<p class="lead">Call <code>gdk_pixbuf_save()</code> to write.</p>')
    else:
        ch1.title = ch2.title = ""
        ch1.content = ch2.content = '<p><img src="../images/logo.png" alt=""/></p>'
    for chapter in (ch1, ch2):
        chapter.add_item(css)
    for item in (css, logo, font, ch2, ch1):
        book.add_item(item)
    book.toc = (epub.Link("text/ch1.xhtml", "Loading images", "ch1"),
                epub.Link("text/ch2.xhtml#save", "Saving images", "ch2"))
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", ch1, ch2]
    out = io.BytesIO()
    epub.write_epub(out, book, {})
    encryption = (b'<?xml version="1.0" encoding="UTF-8"?>\n'
                  b'<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" '
                  b'xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData>'
                  b'<enc:EncryptionMethod Algorithm="http://www.idpf.org/2008/embedding"/>'
                  b'<enc:CipherData><enc:CipherReference URI="EPUB/fonts/body.otf"/></enc:CipherData>'
                  b'</enc:EncryptedData></encryption>')
    return rezip(out.getvalue(), {"META-INF/encryption.xml": encryption})


EPUB2_OPF = b"""<?xml version="1.0" encoding="UTF-8"?>
<package xmlns="http://www.idpf.org/2007/opf" version="2.0" unique-identifier="bookid">
  <metadata xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:opf="http://www.idpf.org/2007/opf">
    <dc:title>A short guide to image loaders</dc:title>
    <dc:creator opf:role="aut">GNOME</dc:creator>
    <dc:language>en</dc:language>
    <dc:identifier id="bookid">urn:isbn:9780000000000</dc:identifier>
  </metadata>
  <manifest>
    <item id="ncx" href="toc.ncx" media-type="application/x-dtbncx+xml"/>
    <item id="css" href="css/book.css" media-type="text/css"/>
    <item id="intro" href="text/intro.xhtml" media-type="application/xhtml+xml"/>
  </manifest>
  <spine toc="ncx">
    <itemref idref="intro"/>
  </spine>
</package>
"""

EPUB2_NCX = b"""<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE ncx PUBLIC "-//NISO//DTD ncx 2005-1//EN" "http://www.daisy.org/z3986/2005/ncx-2005-1.dtd">
<ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" version="2005-1" xml:lang="en">
  <head><meta name="dtb:uid" content="urn:isbn:9780000000000"/></head>
  <docTitle><text>A short guide to image loaders</text></docTitle>
  <docAuthor><text>GNOME</text></docAuthor>
  <navMap>
    <navPoint id="np1" playOrder="1"><navLabel><text>Introduction</text></navLabel>
      <content src="text/intro.xhtml"/></navPoint>
    <navPoint id="np2" playOrder="2"><navLabel><text>Supported formats</text></navLabel>
      <content src="text/intro.xhtml#formats"/></navPoint>
  </navMap>
</ncx>
"""

EPUB2_CHAPTER = """<?xml version="1.0" encoding="{encoding}"?>
<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.1//EN" "http://www.w3.org/TR/xhtml11/DTD/xhtml11.dtd">
<html xmlns="http://www.w3.org/1999/xhtml" xml:lang="en">
<head><title>Introduction</title><link rel="stylesheet" type="text/css" href="../css/book.css"/></head>
<body>
  <h1>Introduction</h1>
  <p>Loaders turn <em>compressed</em> files into pixels &lt;fast&gt; &amp; safely.</p>
  <h2 id="formats">Supported formats</h2>
  <p>PNG, JPEG &#8212; and <span title="Tagged Image File Format">TIFF</span> too.</p>
</body>
</html>
"""


def make_epub2(encoding: str = "utf-8") -> bytes:
    """EPUB 2 as older tools wrote it by hand: an NCX with a DOCTYPE and xml:lang, an XHTML 1.1 chapter."""
    chapter = EPUB2_CHAPTER.format(encoding=encoding).encode(encoding)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("mimetype", b"application/epub+zip", zipfile.ZIP_STORED)
        zf.writestr("META-INF/container.xml",
                    b'<?xml version="1.0"?><container version="1.0" '
                    b'xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles>'
                    b'<rootfile full-path="OPS/content.opf" media-type="application/oebps-package+xml"/>'
                    b'</rootfiles></container>')
        zf.writestr("OPS/content.opf", EPUB2_OPF)
        zf.writestr("OPS/toc.ncx", EPUB2_NCX)
        zf.writestr("OPS/css/book.css", b"h1 { font-size: 2em; }\n")
        zf.writestr("OPS/text/intro.xhtml", chapter)
    return out.getvalue()


# ------------------------------------------------------------------------------------------------------------------
# Round trips.


def assert_same_book(before: bytes, after: bytes, translated: set[str]) -> None:
    """Same members in the same order and compression, mimetype first and stored, the same spine and manifest,
    and every member outside `translated` byte-identical."""
    assert layout(after) == layout(before)
    assert layout(after)[0] == ("mimetype", zipfile.ZIP_STORED)
    old, new = zip_members(before), zip_members(after)
    assert new["mimetype"] == b"application/epub+zip"
    assert {name for name in old if old[name] != new[name]} == translated
    old_book, new_book = package(before), package(after)
    assert new_book.spine == old_book.spine
    assert [(i.id, i.file_name, i.media_type) for i in new_book.get_items()] == \
        [(i.id, i.file_name, i.media_type) for i in old_book.get_items()]


def assert_chapter_translated(before: bytes, after: bytes) -> etree._Element:
    """The output parses as XML, has the source's element tree, and none of its texts is left untranslated."""
    old, new = parse(before), parse(after)
    assert shape(new) == shape(old)
    assert any(t != t.upper() for t in visible_texts(old))  # so the check below can fail
    assert [t for t in visible_texts(new) if t != t.upper()] == []
    return new


def test_libreoffice_book_round_trip_keeps_structure_and_translates_every_text() -> None:
    before = FIXTURE.read_bytes()
    document = read_epub(before, "gdk-pixbuf.epub", LIMITS)
    rendered = document.render(upper(document.segments), target="es")
    after = rendered.data
    assert rendered.filename == "gdk-pixbuf.es.epub"
    assert rendered.media_type == "application/epub+zip"
    chapter, nav, opf, ncx = ("OEBPS/sections/section0001.xhtml", "OEBPS/toc.xhtml", "OEBPS/content.opf",
                              "OEBPS/toc.ncx")
    assert_same_book(before, after, {chapter, nav, opf, ncx})
    old, new = zip_members(before), zip_members(after)
    body = assert_chapter_translated(old[chapter], new[chapter])
    assert "BMP, GIF AND JPEG" in "".join(body.itertext())
    assert [a.get("href") for a in body.iter(f"{{{XHTML}}}a")] == \
        ["https://gitlab.gnome.org/GNOME/gdk-pixbuf", "#dataF1", "#calledF1"]
    assert_chapter_translated(old[nav], new[nav])
    assert [a.text for a in parse(new[nav]).iter(f"{{{XHTML}}}a")] == ["IMAGE LOADERS"]
    assert [t.text for t in parse(new[ncx]).iter(f"{{{NCX}}}text")] == [None, "IMAGE LOADERS"]
    package_root = parse(new[opf])
    assert package_root.findtext(f".//{{{DC}}}title") == "UNKNOWN TITLE"
    assert package_root.findtext(f".//{{{DC}}}language") == "es"
    assert package_root.findtext(f".//{{{DC}}}creator") == "Unknown Author"  # not a title: kept
    assert shape(package_root) == shape(parse(old[opf]))
    assert shape(parse(new[ncx])) == shape(parse(old[ncx]))


def test_book_without_target_keeps_its_language_even_after_a_render_with_one() -> None:
    document = read_epub(make_epub3(), "handbook.epub", LIMITS)
    document.render(upper(document.segments), target="es")
    after = zip_members(document.render(upper(document.segments), target=None).data)
    assert parse(after["EPUB/content.opf"]).findtext(f".//{{{DC}}}language") == "en"
    root = parse(after["EPUB/text/ch1.xhtml"])
    assert (root.get("lang"), root.get(XML_LANG)) == ("en", "en")


def test_epub3_chapters_follow_the_spine_and_nav_labels_title_and_alt_are_translated() -> None:
    before = make_epub3()
    document = read_epub(before, "handbook.epub", LIMITS)
    segments = document.segments
    assert segments[0] == "The Pixbuf Handbook"  # the title, from the OPF
    # The spine reads ch1 before ch2, though the manifest and the zip list ch2 first.
    assert segments.index("Call ⟦0⟧ to write.") > \
        segments.index("The loader reads ⟦0⟧every⟦1⟧ file & checks it, see ⟦2⟧saving⟦3⟧.")
    after = translate(before)
    chapters = ["EPUB/nav.xhtml", "EPUB/text/ch1.xhtml", "EPUB/text/ch2.xhtml"]
    assert_same_book(before, after, {*chapters, "EPUB/content.opf", "EPUB/toc.ncx"})
    old, new = zip_members(before), zip_members(after)
    for name in chapters:
        root = assert_chapter_translated(old[name], new[name])
        assert (root.get("lang"), root.get(XML_LANG)) == ("es", "es")  # both, as XHTML carries both
    nav = parse(new["EPUB/nav.xhtml"])
    assert [(a.get("href"), a.text) for a in nav.iter(f"{{{XHTML}}}a")] == \
        [("text/ch1.xhtml", "LOADING IMAGES"), ("text/ch2.xhtml#save", "SAVING IMAGES")]
    ncx = parse(new["EPUB/toc.ncx"])
    assert [t.text for t in ncx.iter(f"{{{NCX}}}text")] == ["THE PIXBUF HANDBOOK", "LOADING IMAGES", "SAVING IMAGES"]
    assert [c.get("src") for c in ncx.iter(f"{{{NCX}}}content")] == ["text/ch1.xhtml", "text/ch2.xhtml#save"]
    opf = parse(new["EPUB/content.opf"])
    assert opf.findtext(f".//{{{DC}}}title") == "THE PIXBUF HANDBOOK"
    assert opf.findtext(f".//{{{DC}}}language") == "es"
    ch1 = parse(new["EPUB/text/ch1.xhtml"])
    img = next(ch1.iter(f"{{{XHTML}}}img"))
    assert (img.get("src"), img.get("alt")) == ("../images/logo.png", "THE PROJECT LOGO")
    assert next(ch1.iter(f"{{{XHTML}}}code")).text == "pixbuf = gdk_pixbuf_new_from_file (path, &error);"
    assert "THE LOADER READS EVERY FILE & CHECKS IT, SEE SAVING." in " ".join("".join(ch1.itertext()).split())
    # The stylesheet, the image, the obfuscated font and its encryption.xml are byte-identical (assert_same_book);
    # ebooklib reads the translated book back with the same spine and items.
    reread = package(after)
    assert reread.title == "THE PIXBUF HANDBOOK"
    assert reread.get_item_with_id("font").content == FONT


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16"])
def test_epub2_ncx_labels_doc_title_and_languages_are_translated(encoding: str) -> None:
    before = make_epub2(encoding)
    after = translate(before)
    chapter = "OPS/text/intro.xhtml"
    assert_same_book(before, after, {chapter, "OPS/content.opf", "OPS/toc.ncx"})
    old, new = zip_members(before), zip_members(after)
    # What the bytes now are, whatever the upload was (a UTF-16 chapter keeps a byte-order mark, now UTF-8's).
    assert re.match(rb'(\xef\xbb\xbf)?<\?xml version="1.0" encoding="(?i:utf-8)"\?>', new[chapter])
    root = assert_chapter_translated(old[chapter], new[chapter])
    assert root.get(XML_LANG) == "es" and root.get("lang") is None  # no attribute added
    span = next(root.iter(f"{{{XHTML}}}span"))
    assert (span.text, span.get("title")) == ("TIFF", "TAGGED IMAGE FILE FORMAT")
    assert "LOADERS TURN COMPRESSED FILES INTO PIXELS <FAST> & SAFELY." in "".join(root.itertext())
    ncx_tree = etree.ElementTree(parse(new["OPS/toc.ncx"]))
    assert ncx_tree.docinfo.doctype.startswith("<!DOCTYPE ncx PUBLIC")
    ncx = ncx_tree.getroot()
    assert ncx.get(XML_LANG) == "es"
    assert [t.text for t in ncx.iter(f"{{{NCX}}}text")] == \
        ["A SHORT GUIDE TO IMAGE LOADERS", "GNOME", "INTRODUCTION", "SUPPORTED FORMATS"]
    assert "GNOME" in EPUB2_NCX.decode()  # the author was not a label: unchanged, not upper-cased
    assert [p.get("playOrder") for p in ncx.iter(f"{{{NCX}}}navPoint")] == ["1", "2"]
    opf = parse(new["OPS/content.opf"])
    assert opf.findtext(f".//{{{DC}}}title") == "A SHORT GUIDE TO IMAGE LOADERS"
    assert opf.findtext(f".//{{{DC}}}language") == "es"
    # ebooklib reads an EPUB 2 table of contents from the NCX.
    assert [link.title for link in package(after).toc] == ["INTRODUCTION", "SUPPORTED FORMATS"]


def test_tags_stay_well_formed_when_the_translation_swaps_or_drops_sentinels() -> None:
    document = read_epub(make_epub3(), "handbook.epub", LIMITS)

    def scramble(segment: str) -> str:
        count = masking.sentinel_count(segment)
        if count < 2:
            return segment.upper() + "\x01"
        # Sentinels reversed and the first one lost: restored as they stand, </b> would come before <b>.
        text = masking.SENTINEL.sub("", segment).upper()
        return text + "".join(masking.sentinel(i) for i in reversed(range(1, count)))

    after = zip_members(document.render([scramble(s) for s in document.segments], "es").data)
    ch1 = parse(after["EPUB/text/ch1.xhtml"])  # parses: tags in source order, the control characters dropped
    assert parse(after["EPUB/content.opf"]).findtext(f".//{{{DC}}}title") == "THE PIXBUF HANDBOOK"
    paragraph = next(ch1.iter(f"{{{XHTML}}}p"))
    assert paragraph.text.startswith("THE LOADER READS EVERY FILE & CHECKS IT, SEE SAVING.")
    assert [e.tag for e in paragraph] == [f"{{{XHTML}}}b", f"{{{XHTML}}}a"]


# ------------------------------------------------------------------------------------------------------------------
# Bad uploads.


def test_truncated_book_is_damaged() -> None:
    data = FIXTURE.read_bytes()
    with pytest.raises(UnsupportedDocument, match=r"^book\.epub: the \.epub is damaged"):
        read_epub(data[: len(data) // 2], "book.epub", LIMITS)


@pytest.mark.parametrize("changes", [
    {"OEBPS/content.opf": b"<package><metadata>"},  # not XML
    {"OEBPS/sections/section0001.xhtml": None},  # in the manifest, not in the zip
    {"META-INF/container.xml": None},
], ids=["broken-opf", "missing-chapter", "no-container"])
def test_broken_package_is_damaged(changes: dict[str, bytes | None]) -> None:
    with pytest.raises(UnsupportedDocument, match=r"^book\.epub: the \.epub is damaged .* cannot be read"):
        read_epub(rezip(FIXTURE.read_bytes(), changes), "book.epub", LIMITS)


def test_broken_package_with_obfuscated_fonts_is_damaged_not_encrypted() -> None:
    # Font obfuscation is not DRM: a book that has it and fails to read is called damaged, as it is.
    with pytest.raises(UnsupportedDocument, match=r"^book\.epub: the \.epub is damaged"):
        read_epub(rezip(make_epub3(), {"EPUB/content.opf": b"<package>"}), "book.epub", LIMITS)


def test_mimetype_goes_first_and_stored_even_when_the_upload_had_it_elsewhere() -> None:
    members = zip_members(FIXTURE.read_bytes())
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(members, key=lambda n: n == "mimetype"):  # last, and deflated
            zf.writestr(name, members[name])
    after = translate(out.getvalue())
    assert layout(after)[0] == ("mimetype", zipfile.ZIP_STORED)
    assert [name for name, _ in layout(after)[1:]] == [n for n in members if n != "mimetype"]
    # The OCF rule, as readers sniff it: the first local header names mimetype and holds it uncompressed.
    assert after[30:38] == b"mimetype" and after[38:58] == b"application/epub+zip"


def test_word_document_named_epub_says_what_it_is() -> None:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("[Content_Types].xml", b"<Types/>")
        zf.writestr("word/document.xml", b"<w:document/>")
    with pytest.raises(UnsupportedDocument, match=r"not an EPUB book \(it is a Word document"):
        read_epub(out.getvalue(), "report.epub", LIMITS)


def test_book_of_images_has_nothing_to_translate() -> None:
    with pytest.raises(InvalidInput, match=r"^comic\.epub: the book holds only images"):
        read_epub(make_epub3(text=False), "comic.epub", LIMITS)


def test_drm_encrypted_chapters_are_refused() -> None:
    encryption = (b'<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" '
                  b'xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData>'
                  b'<enc:EncryptionMethod Algorithm="http://www.w3.org/2001/04/xmlenc#aes128-cbc"/>'
                  b'<enc:CipherData><enc:CipherReference URI="OEBPS/sections/section0001.xhtml"/></enc:CipherData>'
                  b'</enc:EncryptedData></encryption>')
    data = rezip(FIXTURE.read_bytes(), {"META-INF/encryption.xml": encryption,
                                        "OEBPS/sections/section0001.xhtml": bytes(range(256)) * 4})
    with pytest.raises(UnsupportedDocument, match=r"^book\.epub: the book is encrypted \(DRM\)"):
        read_epub(data, "book.epub", LIMITS)


def test_document_is_an_epub_document_with_sentinel_markup() -> None:
    document = read_epub(FIXTURE.read_bytes(), "gdk-pixbuf.epub", LIMITS)
    assert isinstance(document, EpubDocument) and document.kind == "epub" and document.sentinel_markup
    assert all(s == s.strip() and s for s in document.segments)
