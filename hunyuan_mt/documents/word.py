"""Word documents (.docx): paragraphs, headings, table cells, headers, footers and footnotes, translated in place.

python-docx opens and saves the package; the text is changed at the level of the `w:t` elements so that paragraph
styles, run formatting (bold, italic, fonts, colours, hyperlinks) and everything that is not text (images, fields,
tabs, breaks) stay where they are. A paragraph is cut at tabs and line breaks into separate segments. Runs that
look the same are merged into one group; where the look changes, the segment carries a masking sentinel
(`Sales grew ⟦0⟧much faster⟦1⟧ than planned.`), so a model that copies sentinels (as the service's masking asks of
it) says itself where the bold words went. When the sentinels do not come back complete and in order, the text is
spread over the groups in proportion to their original lengths, cut at the nearest word boundary.
"""

from __future__ import annotations

import copy
import io
import logging
import zipfile

import docx
from docx.document import Document as DocxDocument
from docx.opc.constants import CONTENT_TYPE as CT
from docx.opc.exceptions import PackageNotFoundError
from docx.opc.part import PartFactory, XmlPart
from docx.oxml.ns import qn
from docx.parts.hdrftr import FooterPart, HeaderPart
from docx.text.run import Run
from lxml import etree

from ..config import LimitsConfig
from ..errors import InvalidInput, UnsupportedDocument
from .archive import check_zip
from .base import ORIGIN_MODEL, Document, RenderedDocument, needs_translation, output_filename
from .runs import RunChunk, TextSlot, one_line

log = logging.getLogger(__name__)

# python-docx 1.2 loads footnotes and endnotes as opaque blobs; registering them as XML parts (its own extension
# point) makes their paragraphs reachable and saves them back serialised from the edited tree.
_NOTE_TYPES = (CT.WML_FOOTNOTES, CT.WML_ENDNOTES)
for _content_type in _NOTE_TYPES:
    PartFactory.part_type_for.setdefault(_content_type, XmlPart)

DOCX_MEDIA_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
_P, _T, _R = qn("w:p"), qn("w:t"), qn("w:r")
#: The comment a segment to review gets (`quality.docx_comments`).
_REVIEW_COMMENT = ("Machine translation to check: low confidence (below quality.review_below), left as the source, "
                   "or its formatting placed without certainty.")
_RPR = qn("w:rPr")
# Elements that end a segment: the translation cannot move them, so the text on each side is translated apart.
_BOUNDARIES = {qn("w:tab"), qn("w:br"), qn("w:cr"), qn("w:ptab"), qn("w:noBreakHyphen")}
# Subtrees whose text is not the paragraph's visible text (deleted revisions, field codes) or is another paragraph.
_SKIP = {qn("w:del"), qn("w:moveFrom"), qn("w:instrText"), qn("w:delText"), qn("w:txbxContent"), _P}
_IMAGES = (qn("w:drawing"), qn("w:pict"), qn("w:object"))
# Run properties that do not change how text looks; runs differing only in these are one formatting group.
_INVISIBLE = {qn("w:lang"), qn("w:noProof")}
_XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"


def _format_key(run: etree._Element) -> bytes:
    """The run's formatting, without the properties that do not show (proofing language, no-proof marks)."""
    rpr = run.find(_RPR)
    if rpr is None:
        return b""
    rpr = copy.deepcopy(rpr)
    for child in list(rpr):
        if child.tag in _INVISIBLE:
            rpr.remove(child)
    return etree.tostring(rpr) if len(rpr) or rpr.attrib else b""


def _chunk() -> RunChunk:
    return RunChunk(set_text=_set_text)


def _add(chunk: RunChunk, t: etree._Element) -> None:
    run = t.getparent()
    container = run.getparent() if run is not None else None
    chunk.add(TextSlot(t), container, _format_key(run) if run is not None else b"")


def _walk(element: etree._Element, chunks: list[RunChunk]) -> None:
    for child in element:
        tag = child.tag
        if tag in _SKIP:
            continue
        if tag == _T:
            _add(chunks[-1], child)
        elif tag in _BOUNDARIES:
            chunks.append(_chunk())
        else:
            _walk(child, chunks)


def paragraph_chunks(p: etree._Element) -> list[RunChunk]:
    chunks = [_chunk()]
    _walk(p, chunks)
    return [c for c in chunks if c.groups]


def _set_text(slot: TextSlot, text: str) -> None:
    slot.set(text)
    if text != text.strip():
        slot.element.set(_XML_SPACE, "preserve")


class WordDocument(Document):
    kind = "docx"
    sentinel_markup = True

    def __init__(self, filename: str, document: DocxDocument) -> None:
        self._document = document
        self._chunks: list[RunChunk] = []
        segments: list[str] = []
        for root in self._roots():
            for p in root.iter(_P):
                for chunk in paragraph_chunks(p):
                    if needs_translation("".join(chunk.texts)):
                        segments.append(chunk.segment())
                        self._chunks.append(chunk)
        if not segments:
            body = document.element.body
            if any(True for tag in _IMAGES for _ in body.iter(tag)):
                raise InvalidInput(f"{filename}: the document holds only images, no text to translate "
                                   "(text inside images needs OCR first)")
            raise InvalidInput(f"{filename}: the document has no text to translate")
        super().__init__(filename, segments)

    def _roots(self) -> list[etree._Element]:
        """The body first, then every header, footer, footnote and endnote part (each once, however many sections
        share it)."""
        roots = [self._document.element.body]
        for part in self._document.part.package.iter_parts():
            if isinstance(part, (HeaderPart, FooterPart)) or (
                    isinstance(part, XmlPart) and part.content_type in _NOTE_TYPES):
                roots.append(part.element)
        return roots

    def _render(self, translations: list[str], target: str | None) -> RenderedDocument:
        body = self._document.element.body
        for chunk, translation, segment in zip(self._chunks, translations, self.segments):
            chunk.fill(one_line(translation))
            if self.review_comments and self.origins.get(segment) == ORIGIN_MODEL:
                self._comment(chunk, body)
        out = io.BytesIO()
        self._document.save(out)
        return RenderedDocument(out.getvalue(), output_filename(self.filename, ".docx", target), DOCX_MEDIA_TYPE,
                                "Paragraph styles and run formatting are kept; where a sentence mixes formats, the "
                                "formatting is placed at the matching position of the translation.")


    def _comment(self, chunk: RunChunk, body: etree._Element) -> None:
        """A Word comment over the segment's runs: Word's nearest thing to XLIFF's needs-review state. Only in the
        body (python-docx anchors comments there), and only where the text sits in runs of one paragraph."""
        runs = [slot.element.getparent() for group in chunk.groups for slot in group]
        if not runs or any(r is None or r.tag != _R for r in runs):
            return
        paragraphs = {r.getparent() for r in runs}  # the elements themselves: lxml keeps one proxy per live node
        if len(paragraphs) != 1 or not any(ancestor is body for ancestor in runs[0].getparent().iterancestors()):
            return
        # A run needs only its story part from its parent, which the document gives.
        self._document.add_comment([Run(runs[0], self._document), Run(runs[-1], self._document)],
                                   text=_REVIEW_COMMENT, author="Hunyuan-MT", initials="MT")


def read_word(data: bytes, filename: str, limits: LimitsConfig) -> WordDocument:
    check_zip(data, filename, limits, "docx")
    try:
        document = docx.Document(io.BytesIO(data))
    # Untrusted input reaches the zip, OPC and XML layers; any failure there means a damaged file, and the caller
    # needs that sentence rather than a parser's internals.
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError, etree.XMLSyntaxError, EOFError,
            OSError) as exc:
        log.info("unreadable docx %r: %s: %s", filename, type(exc).__name__, exc)
        raise UnsupportedDocument(f"{filename}: the .docx is damaged or not a Word document and cannot be read") \
            from None
    return WordDocument(filename, document)
