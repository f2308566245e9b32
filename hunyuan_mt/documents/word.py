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
import re
import zipfile
from dataclasses import dataclass, field

import docx
from docx.document import Document as DocxDocument
from docx.opc.constants import CONTENT_TYPE as CT
from docx.opc.exceptions import PackageNotFoundError
from docx.opc.part import PartFactory, XmlPart
from docx.oxml.ns import qn
from docx.parts.hdrftr import FooterPart, HeaderPart
from lxml import etree

from .. import masking
from ..config import LimitsConfig
from ..errors import InputTooLarge, InvalidInput, UnsupportedDocument
from .base import Document, RenderedDocument, needs_translation, output_filename

log = logging.getLogger(__name__)

# python-docx 1.2 loads footnotes and endnotes as opaque blobs; registering them as XML parts (its own extension
# point) makes their paragraphs reachable and saves them back serialised from the edited tree.
_NOTE_TYPES = (CT.WML_FOOTNOTES, CT.WML_ENDNOTES)
for _content_type in _NOTE_TYPES:
    PartFactory.part_type_for.setdefault(_content_type, XmlPart)

DOCX_MEDIA_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
#: More zip members than any real document has; refused before anything is unpacked.
MAX_ZIP_MEMBERS = 10_000

_P, _T = qn("w:p"), qn("w:t")
_RPR = qn("w:rPr")
# Elements that end a segment: the translation cannot move them, so the text on each side is translated apart.
_BOUNDARIES = {qn("w:tab"), qn("w:br"), qn("w:cr"), qn("w:ptab"), qn("w:noBreakHyphen")}
# Subtrees whose text is not the paragraph's visible text (deleted revisions, field codes) or is another paragraph.
_SKIP = {qn("w:del"), qn("w:moveFrom"), qn("w:instrText"), qn("w:delText"), qn("w:txbxContent"), _P}
_IMAGES = (qn("w:drawing"), qn("w:pict"), qn("w:object"))
# Run properties that do not change how text looks; runs differing only in these are one formatting group.
_INVISIBLE = {qn("w:lang"), qn("w:noProof")}
_XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"


def check_zip(data: bytes, filename: str, limits: LimitsConfig) -> None:
    """Refuse zip bombs from the central directory's declared sizes, before any member is decompressed.

    zipfile never yields more than a member's declared size (a member that inflates further fails its CRC check),
    so the declared total bounds what parsing can unpack.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            infos = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        raise UnsupportedDocument(f"{filename}: the .docx is damaged (not a readable zip archive)") from None
    if len(infos) > MAX_ZIP_MEMBERS:
        raise InputTooLarge(f"{filename}: the archive holds {len(infos)} files, the limit is {MAX_ZIP_MEMBERS}")
    total = sum(info.file_size for info in infos)
    if total > limits.max_unzipped_bytes:
        raise InputTooLarge(f"{filename}: unpacks to {total} bytes, the limit is {limits.max_unzipped_bytes} bytes")
    names = {info.filename for info in infos}
    if "word/document.xml" not in names:
        raise UnsupportedDocument(f"{filename}: not a Word document: the archive has no word/document.xml "
                                  f"({_zip_kind(names)})")


def _zip_kind(names: set[str]) -> str:
    if "xl/workbook.xml" in names:
        return "it is an Excel workbook"
    if "ppt/presentation.xml" in names:
        return "it is a PowerPoint presentation"
    if "mimetype" in names and "content.xml" in names:
        return "it is an OpenDocument file; save it as .docx"
    return "it is some other zip archive"


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


@dataclass
class _Chunk:
    """The text between two boundaries of one paragraph: `w:t` elements grouped by identical formatting."""

    groups: list[list[etree._Element]] = field(default_factory=list)
    #: Per group: the runs' container element (held, so lxml keeps returning the same proxy) and their look.
    keys: list[tuple[etree._Element | None, bytes]] = field(default_factory=list)

    def add(self, t: etree._Element) -> None:
        run = t.getparent()
        container = run.getparent() if run is not None else None
        look = _format_key(run) if run is not None else b""
        # Same container (paragraph, hyperlink, ...) and same look: text may move freely between these runs.
        if self.keys and self.keys[-1][0] is container and self.keys[-1][1] == look:
            self.groups[-1].append(t)
        else:
            self.groups.append([t])
            self.keys.append((container, look))

    @property
    def texts(self) -> list[str]:
        return ["".join(t.text or "" for t in group) for group in self.groups]

    def segment(self) -> str:
        """The chunk's text with a sentinel where the formatting changes: `Sales grew ⟦0⟧much faster⟦1⟧ than…`."""
        pieces: list[str] = []
        for text in self.texts:
            if text:
                if pieces:
                    pieces.append(masking.sentinel(len(pieces) // 2))
                pieces.append(text)
        return " ".join("".join(pieces).split())

    def fill(self, translation: str) -> None:
        """Put a translation back into the runs: at the sentinels when they came back complete and in order,
        otherwise in proportion to the original lengths."""
        texts = self.texts
        filled = [i for i, text in enumerate(texts) if text]
        whole = "".join(texts)
        lead = whole[:len(whole) - len(whole.lstrip())]
        trail = whole[len(whole.rstrip()):]
        pieces = masking.split_at_sentinels(translation, len(filled) - 1)
        if pieces is None:
            plain = re.sub(r"[ \t]{2,}", " ", masking.SENTINEL.sub("", translation)).strip()
            pieces = distribute([texts[i] for i in filled], lead + plain + trail)
        else:
            pieces[0] = lead + pieces[0]
            pieces[-1] = pieces[-1] + trail
        new_texts = [""] * len(texts)
        for i, piece in zip(filled, pieces):
            new_texts[i] = piece
        for group, text in zip(self.groups, new_texts):
            _set_text(group[0], text)
            for t in group[1:]:
                _set_text(t, "")


def _walk(element: etree._Element, chunks: list[_Chunk]) -> None:
    for child in element:
        tag = child.tag
        if tag in _SKIP:
            continue
        if tag == _T:
            chunks[-1].add(child)
        elif tag in _BOUNDARIES:
            chunks.append(_Chunk())
        else:
            _walk(child, chunks)


def paragraph_chunks(p: etree._Element) -> list[_Chunk]:
    chunks = [_Chunk()]
    _walk(p, chunks)
    return [c for c in chunks if c.groups]


def _is_word_boundary(text: str, pos: int) -> bool:
    return pos <= 0 or pos >= len(text) or text[pos - 1].isspace() or text[pos].isspace()


def _snap(text: str, pos: int, space_left: bool, space_right: bool, window: int) -> int:
    """The cut nearest `pos` that keeps a space on the side where the original had it."""
    def ok(q: int) -> bool:
        if q <= 0 or q >= len(text):
            return True
        if space_left:
            return text[q - 1].isspace()
        if space_right:
            return text[q].isspace()
        return _is_word_boundary(text, q)

    for delta in range(window + 1):
        for q in (pos - delta, pos + delta):
            if 0 <= q <= len(text) and ok(q):
                return q
    return pos


def distribute(original: list[str], new_text: str) -> list[str]:
    """Split `new_text` over the groups in proportion to the `original` group lengths.

    A cut that fell between words in the original is moved to the nearest space of the new text, on the same side
    of the space; a cut inside a word (or a language without spaces) stays proportional.
    """
    if len(original) <= 1:
        return [new_text]
    total = sum(len(t) for t in original) or 1
    whole = "".join(original)
    window = max(4, len(new_text) // (2 * len(original)))
    cuts: list[int] = []
    done = 0
    for text in original[:-1]:
        done += len(text)
        pos = round(len(new_text) * done / total)
        if _is_word_boundary(whole, done):
            pos = _snap(new_text, pos, whole[done - 1].isspace(), whole[done:done + 1].isspace(), window)
        cuts.append(max(pos, cuts[-1] if cuts else 0))
    bounds = [0, *cuts, len(new_text)]
    return [new_text[a:b] for a, b in zip(bounds, bounds[1:])]


def _set_text(t: etree._Element, text: str) -> None:
    t.text = text
    if text != text.strip():
        t.set(_XML_SPACE, "preserve")


class WordDocument(Document):
    kind = "docx"
    sentinel_markup = True

    def __init__(self, filename: str, document: DocxDocument) -> None:
        self._document = document
        self._chunks: list[_Chunk] = []
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
        for chunk, translation in zip(self._chunks, translations):
            # A chunk lies between two breaks; a line break inside a w:t would not show as one anyway.
            chunk.fill(re.sub(r"\s*[\r\n]+\s*", " ", translation))
        out = io.BytesIO()
        self._document.save(out)
        return RenderedDocument(out.getvalue(), output_filename(self.filename, ".docx", target), DOCX_MEDIA_TYPE,
                                "Paragraph styles and run formatting are kept; where a sentence mixes formats, the "
                                "formatting is placed at the matching position of the translation.")


def read_word(data: bytes, filename: str, limits: LimitsConfig) -> WordDocument:
    check_zip(data, filename, limits)
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
