"""EPUB books (.epub, EPUB 2 and 3): the chapters, the navigation labels and the title are translated in place;
every other byte of the book is kept.

Translated:
- each XHTML content document of the spine, in reading order, and the EPUB 3 navigation document (its link texts
  and headings), each through its own `HtmlDocument` (htmlpage.py): text nodes, inline tags carried as sentinels,
  alt/title attributes; code, pre, script and style are kept, and every byte outside the translated spans too;
- the EPUB 2 navigation labels in `toc.ncx` (`navLabel/text`, and `docTitle/text`, the title again);
- the book title (`dc:title` in the OPF). With a target, the OPF's first `dc:language` becomes it, and so do the
  `lang`/`xml:lang` of each translated chapter's root element and of the NCX root.

Kept: stylesheets, images, fonts, the manifest, the spine order, ids, hrefs, the member order, and `mimetype`
first and stored (the OCF rule that lets a reader sniff the type at a fixed offset). Members with nothing to
translate are copied byte for byte.

ebooklib 0.20 reads the package (container, manifest, spine, media types); the zip is written here with zipfile.
Measured on tests/data/office/gdk-pixbuf.epub (LibreOffice), ebooklib's `write_epub` of the unchanged book moves
every member from OEBPS/ to EPUB/, drops each chapter's <head> with its stylesheet link, pretty-prints the chapters
(which puts spaces between inline spans that touched, and inside <pre>), regenerates toc.ncx and the nav document
(adding a page list the book did not have) and reorders the OPF metadata: of 7 members only the stylesheet and
`mimetype` came back identical. So ebooklib only reads, and only the members translated here are rewritten.

XHTML is XML, which does not forgive what HTML does, so three things are handled on top of HtmlDocument: the root's
`lang` and `xml:lang` both become the target (HtmlDocument sets only the first it meets); an XML declaration that
names another encoding is set to UTF-8, which the output always is; and a translation whose sentinels are not back
once each and in order gets its tags after the text, in source order, because out of order they would close
elements that are not open (`reader.translate_keeping_markup` re-does such segments before they get here).
Characters XML 1.0 forbids are dropped from every translation. The OPF and toc.ncx are parsed and written back by
lxml: equivalent XML, but lxml writes namespace declarations before an element's other attributes and drops the
whitespace between the parts of the prolog.
"""

from __future__ import annotations

import html
import io
import logging
import posixpath
import re
import zipfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from urllib.parse import unquote

from ebooklib import epub
from lxml import etree

from ..text import masking
from ..config import LimitsConfig
from ..errors import InvalidInput, UnsupportedDocument
from .archive import check_zip, rewrite_zip
from .base import (Document, RenderedDocument, check_xml_caps, needs_translation, output_filename,
                   split_outer_whitespace)
from .htmlpage import HtmlDocument, read_html

log = logging.getLogger(__name__)

EPUB_MEDIA_TYPE = "application/epub+zip"
_NOTE = ("The chapters, the table of contents and the title were translated; styles, images, fonts, links and the "
         "book's structure are kept.")

_DC = "http://purl.org/dc/elements/1.1/"
_XMLENC = "http://www.w3.org/2001/04/xmlenc#"
_XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
# Font obfuscation (IDPF, and Adobe's older scheme) only scrambles fonts and is not DRM; the fonts are copied as
# they are, so reading systems undo it as before.
_FONT_OBFUSCATION = {"http://www.idpf.org/2008/embedding", "http://ns.adobe.com/pdf/enc#RC"}
# text/html is not an EPUB content type, but some generators write it for XHTML chapters.
_CHAPTER_TYPES = {"application/xhtml+xml", "text/html"}

# Not allowed anywhere in an XML 1.0 document; lxml refuses them and a reading system would refuse the chapter.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_MARK = re.compile("\x00(\\d+)\x00")
_XML_DECLARATION = re.compile(rb"^(?:\xef\xbb\xbf)?<\?xml\b[^>]*\?>\s*")
_DECLARED_ENCODING = re.compile(r"""(^\ufeff?<\?xml\b[^>]*?\bencoding\s*=\s*["'])([^"']+)""")
_HTML_START_TAG = re.compile(r"<html\b[^>]*>", re.I)
_LANG_ATTRIBUTE = re.compile(r"""(\s(?:xml:)?lang\s*=\s*)(?:"[^"]*"|'[^']*')""", re.I)


# --------------------------------------------------------------------------------------------------------------
# The parts of a book that are translated: each one zip member, its segments, and its new bytes.


class _Part(ABC):
    def __init__(self, member: str, segments: list[str]) -> None:
        #: The zip member this part replaces.
        self.member = member
        self.segments = segments

    @abstractmethod
    def render(self, translations: list[str], target: str | None) -> bytes: ...


class _Chapter(_Part):
    """An XHTML content document (a chapter, or the navigation document), translated by HtmlDocument."""

    def __init__(self, member: str, page: HtmlDocument) -> None:
        super().__init__(member, page.segments)
        self._page = page

    def render(self, translations: list[str], target: str | None) -> bytes:
        # Rendered without a target: the root's language is set below, on both attributes XHTML may carry.
        ordered = [_tags_in_order(s, t) for s, t in zip(self.segments, translations)]
        text = self._page.render(ordered).data.decode("utf-8")
        if not _declares_utf8(text):  # HtmlDocument writes UTF-8 whatever the chapter was
            text = _DECLARED_ENCODING.sub(lambda m: m.group(1) + "UTF-8", text, count=1)
        if target:
            value = html.escape(target, quote=True)
            text = _HTML_START_TAG.sub(lambda m: _LANG_ATTRIBUTE.sub(lambda a: f'{a.group(1)}"{value}"',
                                                                     m.group(0)), text, count=1)
        return text.encode("utf-8")


@dataclass
class _Slot:
    """An element whose text is one segment; the whitespace around the text stays."""

    element: etree._Element
    lead: str
    trail: str


class _XmlTexts(_Part):
    """Elements of an XML member (the OPF, toc.ncx) whose texts are segments, and where the language is named."""

    def __init__(self, member: str, raw: bytes, tree: etree._ElementTree, elements: list[etree._Element],
                 languages: list[tuple[etree._Element, str | None]]) -> None:
        self._raw = raw
        self._tree = tree
        self._slots: list[_Slot] = []
        segments: list[str] = []
        for element in elements:
            lead, core, trail = split_outer_whitespace(element.text or "")
            self._slots.append(_Slot(element, lead, trail))
            segments.append(core)
        #: Where the target language goes: (element, attribute), or (element, None) for the element's text; with
        #: the value the upload had there, put back when a later render has no target.
        self._languages = [(element, attribute, element.text if attribute is None else element.get(attribute))
                           for element, attribute in languages]
        super().__init__(member, segments)

    @property
    def names_language(self) -> bool:
        """Whether a target changes this member even with nothing to translate in it."""
        return bool(self._languages)

    def render(self, translations: list[str], target: str | None) -> bytes:
        if not self._slots and not (target and self._languages):
            return self._raw
        for slot, translation in zip(self._slots, translations):
            slot.element.text = slot.lead + translation + slot.trail
        for element, attribute, original in self._languages:
            if attribute is None:
                element.text = target or original
            else:
                element.set(attribute, target or original or "")
        return _serialize(self._raw, self._tree)


def _tags_in_order(segment: str, translation: str) -> str:
    """`translation`, or when its sentinels would not put the segment's tags back in source order (XML would then
    close elements that are not open), its text followed by every sentinel in order."""
    count = masking.sentinel_count(segment)
    if not count:
        return translation
    # Restore with markers in place of the tags, exactly as HtmlDocument will, and see where each lands.
    marks = [f"\x00{i}\x00" for i in range(count)]
    restored = masking.restore(translation, masking.Protected(segment, marks))
    if [int(i) for i in _MARK.findall(restored)] == list(range(count)):
        return translation
    text = " ".join(_MARK.sub(" ", restored).split())
    return text + "".join(masking.sentinel(i) for i in range(count))


def _declares_utf8(text: str) -> bool:
    match = _DECLARED_ENCODING.search(text)
    return match is None or _is_utf8(match.group(2))


def _is_utf8(encoding: str) -> bool:
    return encoding.lower().replace("-", "").replace("_", "") == "utf8"


def _serialize(raw: bytes, tree: etree._ElementTree) -> bytes:
    """The tree as UTF-8, behind the source's own XML declaration when that one says UTF-8 (or no encoding)."""
    declaration = _XML_DECLARATION.match(raw)
    if declaration is None:
        return etree.tostring(tree, encoding="utf-8", xml_declaration=False)
    if _declares_utf8(declaration.group(0).decode("utf-8").lstrip("\ufeff")):
        return declaration.group(0) + etree.tostring(tree, encoding="utf-8", xml_declaration=False)
    return etree.tostring(tree, encoding="UTF-8", xml_declaration=True)


def _parse_xml(raw: bytes) -> etree._ElementTree:
    # A parser per call (lxml parsers are not shared across threads); no entity expansion, no DTD, no network.
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, strip_cdata=False)
    root = etree.fromstring(raw, parser)
    check_xml_caps(root, "the book")
    return etree.ElementTree(root)


# --------------------------------------------------------------------------------------------------------------
# Reading the package.


@dataclass(frozen=True)
class _Package:
    """What ebooklib found, as zip member names."""

    opf: str
    #: XHTML content documents of the spine, in reading order, each once.
    chapters: list[str]
    nav: str | None
    ncx: list[str]
    has_images: bool


def _read_package(data: bytes) -> _Package:
    reader = epub.EpubReader(io.BytesIO(data), {"ignore_ncx": True})
    book = reader.load()
    if not reader.opf_file:
        raise KeyError("no rootfile in META-INF/container.xml")
    items = list(book.get_items())
    by_id = {item.id: item for item in items}

    def member(item: epub.EpubItem) -> str:
        return posixpath.normpath(posixpath.join(reader.opf_dir, item.get_name()))

    chapters: list[str] = []
    for idref, _linear in book.spine:
        item = by_id.get(idref)
        # An itemref that names no manifest item is skipped, as reading systems skip it.
        if item is not None and item.media_type in _CHAPTER_TYPES and member(item) not in chapters:
            chapters.append(member(item))
    nav = next((member(item) for item in items if isinstance(item, epub.EpubNav)), None)
    return _Package(opf=reader.opf_file, chapters=chapters, nav=nav,
                    ncx=[member(item) for item in items if isinstance(item, epub.EpubNcx)],
                    has_images=any((item.media_type or "").startswith("image/") for item in items))


def _encrypted_members(zf: zipfile.ZipFile) -> set[str]:
    """Members that META-INF/encryption.xml says are encrypted, font obfuscation left out."""
    try:
        raw = zf.read("META-INF/encryption.xml")
    except KeyError:
        return set()
    found: set[str] = set()
    for data in _parse_xml(raw).iter(f"{{{_XMLENC}}}EncryptedData"):
        method = data.find(f"{{{_XMLENC}}}EncryptionMethod")
        if method is not None and method.get("Algorithm") in _FONT_OBFUSCATION:
            continue
        for reference in data.iter(f"{{{_XMLENC}}}CipherReference"):
            if reference.get("URI"):  # relative to the root of the container, which is the zip's root
                found.add(posixpath.normpath(unquote(reference.get("URI", ""))))
    return found


def _opf_part(member: str, raw: bytes) -> _XmlTexts:
    tree = _parse_xml(raw)
    titles = [e for e in tree.iter(f"{{{_DC}}}title") if len(e) == 0 and needs_translation(e.text or "")]
    languages: list[tuple[etree._Element, str | None]] = [(e, _XML_LANG) for e in titles if e.get(_XML_LANG)]
    first_language = next(tree.iter(f"{{{_DC}}}language"), None)
    if first_language is not None:
        languages.append((first_language, None))
    return _XmlTexts(member, raw, tree, titles, languages)


def _ncx_part(member: str, raw: bytes) -> _XmlTexts:
    tree = _parse_xml(raw)
    # Any namespace: some older tools wrote their NCX without one.
    labels = [e for e in tree.iter("{*}text")
              if etree.QName(e.getparent()).localname in ("navLabel", "docTitle")
              and len(e) == 0 and needs_translation(e.text or "")]
    root = tree.getroot()
    languages: list[tuple[etree._Element, str | None]] = [(root, _XML_LANG)] if root.get(_XML_LANG) else []
    return _XmlTexts(member, raw, tree, labels, languages)


# --------------------------------------------------------------------------------------------------------------
# The document.


class EpubDocument(Document):
    kind = "epub"
    sentinel_markup = True

    def __init__(self, filename: str, data: bytes, parts: list[_Part]) -> None:
        self._data = data
        self._parts = parts
        super().__init__(filename, [segment for part in parts for segment in part.segments])

    def _render(self, translations: list[str], target: str | None) -> RenderedDocument:
        clean = [_NOT_XML.sub("", t) for t in translations]
        replaced: dict[str, bytes] = {}
        start = 0
        for part in self._parts:
            end = start + len(part.segments)
            replaced[part.member] = part.render(clean[start:end], target)
            start = end
        return RenderedDocument(rewrite_zip(self._data, replaced), output_filename(self.filename, ".epub", target),
                                EPUB_MEDIA_TYPE, _NOTE)


def _damaged(filename: str) -> UnsupportedDocument:
    return UnsupportedDocument(f"{filename}: the .epub is damaged or not a valid EPUB book and cannot be read")


def _encrypted(filename: str) -> UnsupportedDocument:
    return UnsupportedDocument(f"{filename}: the book is encrypted (DRM) and cannot be translated; only DRM-free "
                               "EPUB files can be read")


# Untrusted input reaches the zip, ebooklib and XML layers; any of these failing means a damaged book.
_UNREADABLE = (epub.EpubException, zipfile.BadZipFile, KeyError, IndexError, AttributeError, TypeError, ValueError,
               etree.LxmlError, EOFError, OSError)


def _parts(zf: zipfile.ZipFile, filename: str, package: _Package,
           limits: LimitsConfig) -> tuple[list[_Part], bool]:
    """The parts with something to translate, title first, then the chapters in reading order, then the
    navigation; and whether any chapter had text."""
    parts: list[_Part] = []
    opf = _opf_part(package.opf, zf.read(package.opf))
    if opf.segments or opf.names_language:
        parts.append(opf)
    chapters: list[_Part] = []
    documents = package.chapters + [package.nav] if package.nav and package.nav not in package.chapters else \
        package.chapters
    for member in documents:
        page = read_html(zf.read(member), filename, limits)
        if page.segments:
            chapters.append(_Chapter(member, page))
    has_text = any(part.member != package.nav for part in chapters)
    parts.extend(chapters)
    for member in package.ncx:
        ncx = _ncx_part(member, zf.read(member))
        if ncx.segments or ncx.names_language:
            parts.append(ncx)
    return parts, has_text


def read_epub(data: bytes, filename: str, limits: LimitsConfig) -> EpubDocument:
    check_zip(data, filename, limits, "epub")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            # Every member is inflated once here (CRC checked), so a damaged one is found now, not after translating.
            if zf.testzip() is not None:
                raise zipfile.BadZipFile("a member fails its CRC check")
            encrypted = _encrypted_members(zf)
            try:
                package = _read_package(data)
            except _UNREADABLE:
                if encrypted:  # ebooklib choked on an encrypted navigation document or NCX
                    raise _encrypted(filename) from None
                raise
            if encrypted & {package.opf, package.nav, *package.chapters, *package.ncx}:
                raise _encrypted(filename)
            parts, has_text = _parts(zf, filename, package, limits)
    except _UNREADABLE as exc:
        log.info("unreadable epub %r: %s: %s", filename, type(exc).__name__, exc)
        raise _damaged(filename) from None
    if not has_text:
        if package.has_images:
            raise InvalidInput(f"{filename}: the book holds only images, no text to translate "
                               "(text inside images needs OCR first)")
        raise InvalidInput(f"{filename}: the book has no text to translate")
    return EpubDocument(filename, data, parts)

