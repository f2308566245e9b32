"""OpenDocument text (.odt), spreadsheets (.ods) and presentations (.odp), translated in place.

An OpenDocument package is a zip of XML parts, so no ODF library is needed: the parts that hold text are parsed
with lxml (the project's XML library, with entities, network access and huge trees off), their text is changed in
place, and every other member is copied unchanged. odfpy would load the whole package into its own object model and
write every part back out of it; editing the parts in place keeps all that this reader does not touch (styles,
images, settings, macros, the manifest, the thumbnail) byte for byte. `mimetype` is written first and uncompressed,
as the format requires.

Translated: every paragraph and heading (`text:p`, `text:h`) of content.xml: body text, lists, table cells,
frames and text boxes, drawing shapes, slides and their speaker notes, and footnotes and endnotes as paragraphs of
their own. In .odt also the headers and footers of the master pages (styles.xml). The document title (dc:title in
meta.xml) is translated too, and dc:language is set to the target language.

Kept as they are:
- cells whose `office:value-type` is not "string" (numbers, dates, percentages, currencies, booleans, times) and
  every cell with a `table:formula`: what they show is a value, not text; sheet names, which formulas refer to;
- fields (page numbers, dates, sheet names, cross-references), whose text the application computes, and
  bookmarks, index marks, notes, images and other anchored objects: each keeps its place in the sentence (a
  sentinel stands for it when text follows it) and the spacing it had on each side;
- `text:s` (a run of spaces) as an element, with the text after it a group of its own, so that an indent stays in
  front of the translation; a paragraph's outer whitespace;
- deleted text of tracked changes; comments (`office:annotation`: they discuss the source wording, and the .docx
  reader leaves Word's comments alone too); ruby (phonetic) annotations; the placeholder prompts of an .odp's
  master pages and the print headers of an .ods; embedded objects (a chart is a sub-document of its own);
- the styles' spell-check language (fo:language, fo:country and their Asian and complex-script twins: mapping a
  language code onto them is more than the output is worth);
- a paragraph piece that is nothing but a URL, e-mail address, placeholder or number (masking spans only).

Inline formatting works as in .docx (`runs.py`): a paragraph is cut into segments at tabs and line breaks; within a
segment, text whose look changes (a `text:span` style that shows, a link, a field) is marked with a sentinel, and
the translation is put back at the sentinels, or in proportion when they do not come back. ODF keeps text in
mixed content, so slots are an element's `.text` and `.tail`. Automatic styles that differ only in what does not
show (LibreOffice's editing-session rsids, the proofing language) count as one look, so they add no sentinels.
"""

from __future__ import annotations

import io
import logging
import re
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from lxml import etree

from ..text import masking
from ..config import LimitsConfig
from ..errors import InvalidInput, UnsupportedDocument
from .archive import check_zip, rewrite_zip
from .base import Document, RenderedDocument, check_xml_caps, needs_translation, output_filename
from .runs import RunChunk, TextSlot, one_line

log = logging.getLogger(__name__)

MEDIA_TYPES = {"odt": "application/vnd.oasis.opendocument.text",
               "ods": "application/vnd.oasis.opendocument.spreadsheet",
               "odp": "application/vnd.oasis.opendocument.presentation"}

_NS = {
    "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
    "style": "urn:oasis:names:tc:opendocument:xmlns:style:1.0",
    "text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
    "table": "urn:oasis:names:tc:opendocument:xmlns:table:1.0",
    "dc": "http://purl.org/dc/elements/1.1/",
}


def _q(name: str) -> str:
    prefix, local = name.split(":")
    return f"{{{_NS[prefix]}}}{local}"


_PARAGRAPHS = {_q("text:p"), _q("text:h")}
_CELLS = {_q("table:table-cell"), _q("table:covered-table-cell")}
_SPAN = _q("text:span")
# Inline elements whose content is more of the paragraph's text, with a place of their own (a link's target, an
# RDF annotation): their text is a separate group, like a hyperlink in .docx.
_CONTAINERS = {_q("text:a"), _q("text:meta")}
# Elements that end a segment: the translation cannot move them, so the text on each side is translated apart.
_BOUNDARIES = {_q("text:tab"), _q("text:line-break")}
# Layout caches the application recomputes on load: text may flow past them.
_TRANSPARENT = {_q("text:soft-page-break")}
# Subtrees whose paragraphs are not text of the document: deleted revisions, comments.
_SKIPPED = {_q("text:tracked-changes"), _q("office:annotation")}
# Where an .odt's master pages keep their header and footer text.
_HEADERS_FOOTERS = {_q(f"style:{part}{side}") for part in ("header", "footer") for side in ("", "-left", "-first")}
_VALUE_TYPE = _q("office:value-type")
_STRING_VALUE = _q("office:string-value")
_FORMULA = _q("table:formula")
_STYLE_NAME = _q("text:style-name")
_CLASS_NAMES = _q("text:class-names")
# Style properties that do not change how text looks: LibreOffice's editing-session ids and the proofing language.
_INVISIBLE = re.compile(r"(paragraph-)?rsid$|(language|country|script|rfc-language-tag)(-asian|-complex)?$")
_LANGUAGE_TAG = re.compile(r"[A-Za-z]{2,3}(-[A-Za-z0-9]{1,8})*")


def _parser() -> etree.XMLParser:
    # Uploads are untrusted: no entities, no network, libxml2's default size and depth limits (no huge_tree).
    return etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False, remove_blank_text=False)


# ------------------------------------------------------------------------------------------------------------------
# Looks: what an automatic style shows.


def _looks(root: etree._Element) -> dict[str, object]:
    """Automatic text styles by name → what they show (parent style and visible properties); None for a style that
    shows nothing (only rsids or a proofing language)."""
    looks: dict[str, object] = {}
    automatic = root.find(_q("office:automatic-styles"))
    if automatic is None:
        return looks
    for style in automatic.iterchildren(_q("style:style")):
        if style.get(_q("style:family")) != "text":
            continue
        shown = tuple(sorted((child.tag, key, value) for child in style for key, value in child.attrib.items()
                             if not _INVISIBLE.match(etree.QName(key).localname)))
        parent = style.get(_q("style:parent-style-name"))
        looks[style.get(_q("style:name"), "")] = (parent, shown) if parent or shown else None
    return looks


def _span_look(span: etree._Element, looks: dict[str, object]) -> object:
    name = span.get(_STYLE_NAME)
    look = looks.get(name, name) if name else None
    classes = span.get(_CLASS_NAMES)
    return (look, classes) if classes else look


# ------------------------------------------------------------------------------------------------------------------
# Paragraphs → chunks of slots.


def _set_edge(slots: list[TextSlot], space: bool, end: bool) -> None:
    """Make the text of `slots` end (`end`) or start with whitespace or with none, editing the slots nearest that
    edge; nothing when they hold no text."""
    ordered = slots[::-1] if end else slots
    texts = [slot.get() for slot in ordered]
    if not "".join(texts).strip():
        return
    if space:
        nearest = next(i for i, text in enumerate(texts) if text)
        text = texts[nearest]
        if not (text[-1] if end else text[0]).isspace():
            ordered[nearest].set(text + " " if end else " " + text)
        return
    for slot, text in zip(ordered, texts):
        kept = text.rstrip() if end else text.lstrip()
        if kept != text:
            slot.set(kept)
        if kept:
            return


@dataclass(eq=False)
class _Chunk(RunChunk):
    """A chunk that also keeps the spacing around the objects in it (fields, notes, images, `text:s`).

    Between two formatting groups the translation decides the spacing, and `masking.split_at_sentinels` drops a
    space on one side so that no double space appears. Beside an object, the source's spacing is layout: "Page
    <page-number/> of 3" needs its space on both sides, a footnote mark sits right after its word.
    """

    #: Per object: the slot of the text after it, whether the source had whitespace before and after it.
    anchors: list[tuple[TextSlot, bool, bool]] = field(default_factory=list)

    def anchor(self, tail: TextSlot) -> None:
        """Note an object whose `tail` slot is about to be added."""
        self.anchors.append((tail, self.text()[-1:].isspace(), tail.get()[:1].isspace()))

    def fill(self, translation: str) -> None:
        super().fill(translation)
        slots = [slot for group in self.groups for slot in group]
        for tail, space_before, space_after in self.anchors:
            at = next(i for i, slot in enumerate(slots) if slot is tail)
            _set_edge(slots[:at], space_before, end=True)
            _set_edge(slots[at:], space_after, end=False)


@dataclass
class _Walk:
    """One paragraph's chunks as they are collected (a new chunk at each boundary)."""

    looks: dict[str, object]
    chunks: list[_Chunk]

    def add(self, slot: TextSlot, container: object, look: tuple[object, ...]) -> None:
        self.chunks[-1].add(slot, container, look)

    def inline(self, element: etree._Element, container: object, look: tuple[object, ...]) -> None:
        """`element`'s own text and its children's, in document order."""
        self.add(TextSlot(element), container, look)
        for child in element:
            tag = child.tag
            tail = TextSlot(child, tail=True)
            if tag == _SPAN:
                span_look = _span_look(child, self.looks)
                self.inline(child, container, look + (span_look,) if span_look is not None else look)
                self.add(tail, container, look)
            elif tag in _CONTAINERS:
                self.inline(child, child, look)
                self.add(tail, container, look)
            elif tag in _BOUNDARIES:
                self.chunks.append(_Chunk())
                self.add(tail, container, look)
            elif tag in _TRANSPARENT or not isinstance(tag, str):  # comments and processing instructions too
                self.add(tail, container, look)
            else:
                # A field, note, bookmark, frame, text:s, ...: its content is not this paragraph's text. The text
                # after it is a group of its own, so a sentinel keeps its place in the translated sentence.
                self.chunks[-1].anchor(tail)
                self.add(tail, child, look)


def paragraph_chunks(paragraph: etree._Element, looks: dict[str, object]) -> list[_Chunk]:
    walk = _Walk(looks, [_Chunk()])
    walk.inline(paragraph, paragraph, ())
    return [chunk for chunk in walk.chunks if chunk.groups]


def _is_text_cell(cell: etree._Element) -> bool:
    return cell.get(_VALUE_TYPE) in (None, "string") and cell.get(_FORMULA) is None


def _paragraphs(element: etree._Element) -> Iterator[etree._Element]:
    """Every paragraph and heading under `element` that is document text, outer ones before the notes, frames and
    shapes they hold."""
    number_cell = element.tag in _CELLS and not _is_text_cell(element)
    for child in element:
        if child.tag in _SKIPPED:
            continue
        if child.tag in _PARAGRAPHS:
            if number_cell:
                continue  # the displayed value of a number, date or formula
            yield child
        yield from _paragraphs(child)


def _translatable(text: str) -> bool:
    """Letters that are not all inside masking spans (a URL or an e-mail address alone is copied anyway)."""
    return needs_translation(text) and masking.protect(text.strip()).has_words


# ------------------------------------------------------------------------------------------------------------------
# The package.


@dataclass
class _Part:
    """One XML member of the package, parsed, and the roots whose paragraphs are translated."""

    name: str
    root: etree._Element
    text_roots: list[etree._Element]


def _parse(zf: zipfile.ZipFile, name: str) -> etree._Element:
    root = etree.fromstring(zf.read(name), _parser())
    check_xml_caps(root, name)
    return root


def _text_roots(name: str, root: etree._Element, kind: str) -> list[etree._Element]:
    if name == "content.xml":
        body = root.find(_q("office:body"))
        if body is None:
            raise ValueError("content.xml has no office:body")
        return [body]
    # styles.xml (.odt only): the header and footer text of each master page. An .odp's master pages hold
    # placeholder prompts and an .ods's headers are print furniture; neither is read.
    master = root.find(_q("office:master-styles"))
    if kind != "odt" or master is None:
        return []
    return [child for page in master.iterchildren(_q("style:master-page")) for child in page
            if child.tag in _HEADERS_FOOTERS]


def _serialise(root: etree._Element) -> bytes:
    tree = root.getroottree()
    return etree.tostring(tree, xml_declaration=True, encoding="UTF-8", standalone=tree.docinfo.standalone)


# ------------------------------------------------------------------------------------------------------------------
# The document.

_NOTES = {"odt": "Paragraph styles and text formatting are kept; where a sentence mixes formats, the formatting is "
                 "placed at the matching position of the translation.",
          "ods": "Only text cells were translated; numbers, dates, formulas and sheet names are kept.",
          "odp": "Slides, speaker notes and text formatting are kept; master slides are not translated."}
_NO_TEXT = {"odt": "the document has no text to translate",
            "ods": "the spreadsheet has no text cells to translate (numbers, dates and formulas are kept as they are)",
            "odp": "the presentation has no text to translate"}


class OpenDocument(Document):
    sentinel_markup = True

    def __init__(self, filename: str, kind: str, data: bytes, parts: list[_Part],
                 meta: etree._Element | None) -> None:
        self.kind = kind
        self._data = data
        self._parts = {part.name: part.root for part in parts}
        if meta is not None:
            self._parts["meta.xml"] = meta
        self._meta = meta
        self._chunks: list[RunChunk] = []
        self._edited: set[str] = set()
        segments: list[str] = []
        for part in parts:
            looks = _looks(part.root)
            for text_root in part.text_roots:
                for paragraph in _paragraphs(text_root):
                    for chunk in paragraph_chunks(paragraph, looks):
                        if _translatable(chunk.text()):
                            segments.append(chunk.segment())
                            self._chunks.append(chunk)
                            self._edited.add(part.name)
        title = self._title()
        if title is not None:
            segments.append(title.segment())
            self._chunks.append(title)
            self._edited.add("meta.xml")
        if not segments:
            raise InvalidInput(f"{filename}: {_NO_TEXT[kind]}")
        # A string cell may carry its value in office:string-value as well as in its paragraphs; a stale copy of
        # the source text there would be what a spreadsheet application reads.
        self._valued_cells = [(cell, "".join(cell.itertext())) for cell in self._parts["content.xml"].iter(*_CELLS)
                              if cell.get(_STRING_VALUE) is not None and _is_text_cell(cell)]
        super().__init__(filename, segments)

    def _title(self) -> RunChunk | None:
        title = self._meta.find(f"{_q('office:meta')}/{_q('dc:title')}") if self._meta is not None else None
        if title is None or len(title) or not _translatable(title.text or ""):
            return None
        chunk = RunChunk()
        chunk.add(TextSlot(title), title, ())
        return chunk

    def _set_language(self, target: str | None) -> bool:
        """dc:language ← the target, where the package has meta.xml; whether it was set."""
        if self._meta is None or not target or not _LANGUAGE_TAG.fullmatch(target):
            return False
        office_meta = self._meta.find(_q("office:meta"))
        if office_meta is None:
            return False
        language = office_meta.find(_q("dc:language"))
        if language is None:
            language = etree.SubElement(office_meta, _q("dc:language"))
        language.text = target
        return True

    def _render(self, translations: list[str], target: str | None) -> RenderedDocument:
        for chunk, translation in zip(self._chunks, translations):
            chunk.fill(one_line(translation))
        for cell, before in self._valued_cells:
            if "".join(cell.itertext()) != before:
                cell.attrib.pop(_STRING_VALUE, None)
        edited = self._edited | ({"meta.xml"} if self._set_language(target) else set())
        replaced = {name: _serialise(self._parts[name]) for name in edited}
        return RenderedDocument(rewrite_zip(self._data, replaced),
                                output_filename(self.filename, f".{self.kind}", target), MEDIA_TYPES[self.kind],
                                _NOTES[self.kind])


def _read(data: bytes, filename: str, limits: LimitsConfig, kind: str) -> OpenDocument:
    check_zip(data, filename, limits, kind)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            names = set(zf.namelist())
            manifest = zf.read("META-INF/manifest.xml") if "META-INF/manifest.xml" in names else b""
            if b"encryption-data" in manifest:
                raise UnsupportedDocument(f"{filename}: the .{kind} is password-protected; save it without a "
                                          "password and upload it again")
            part_names = ["content.xml"] + (["styles.xml"] if kind == "odt" and "styles.xml" in names else [])
            parts = []
            for name in part_names:
                root = _parse(zf, name)
                parts.append(_Part(name, root, _text_roots(name, root, kind)))
            meta = _parse(zf, "meta.xml") if "meta.xml" in names else None
    # Whatever breaks in inflating or parsing an upload, the user can only re-save the file: one sentence for all.
    except (zipfile.BadZipFile, zlib.error, KeyError, ValueError, etree.XMLSyntaxError, EOFError, OSError) as exc:
        log.info("unreadable %s %r: %s: %s", kind, filename, type(exc).__name__, exc)
        raise UnsupportedDocument(f"{filename}: the .{kind} is damaged or not an OpenDocument file and cannot be "
                                  "read") from None
    return OpenDocument(filename, kind, data, parts, meta)


def read_odt(data: bytes, filename: str, limits: LimitsConfig) -> OpenDocument:
    return _read(data, filename, limits, "odt")


def read_ods(data: bytes, filename: str, limits: LimitsConfig) -> OpenDocument:
    return _read(data, filename, limits, "ods")


def read_odp(data: bytes, filename: str, limits: LimitsConfig) -> OpenDocument:
    return _read(data, filename, limits, "odp")
