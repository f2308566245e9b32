"""PowerPoint presentations (.pptx): the text of every slide (text boxes, placeholders, shapes inside groups, table
cells) and of every slide's speaker notes, translated in place.

python-pptx opens and saves the package. It keeps every part it does not model (media, charts, embedded workbooks,
custom XML) byte for byte and writes the XML parts back as parsed: on the fixture, a round trip with the source
text put back changes no part's content but `[Content_Types].xml`, rebuilt from the parts present. The text is
changed at the level of the `a:t` elements, as in Word documents (`word.py`), so paragraph and run formatting,
hyperlinks, bullets and everything that is not text stay where they are. The slides and notes are walked as XML
rather than through python-pptx's shape objects: one walk over all `a:p` reaches group members, graphic-frame
tables and the notes text wherever LibreOffice or PowerPoint stored it (LibreOffice writes notes as a plain text
box, not the notes placeholder python-pptx's `notes_text_frame` looks for).

A paragraph is cut at line breaks (`a:br`) and at fields (`a:fld`: slide numbers and dates the viewer fills in,
not text to translate). Runs that look alike (`a:rPr` without the proofing attributes such as `lang`) are one
group; where the look changes the segment carries a sentinel (`runs.RunChunk`).

Kept as they are, untranslated: slide masters and layouts (their text is the template's "Click to add title"
prompts, which a filled-in slide does not show), chart and SmartArt text (stored in their own parts), comments, alt
text, and the notes master. A translated text box keeps its size, so a longer translation can overflow it.
"""

from __future__ import annotations

import copy
import io
import logging
import zipfile

import pptx
from lxml import etree
from pptx.exc import PythonPptxError
from pptx.oxml.ns import qn
from pptx.presentation import Presentation as PptxPresentation

from ..config import LimitsConfig
from ..errors import InvalidInput, UnsupportedDocument
from .archive import check_zip
from .base import Document, RenderedDocument, needs_translation, output_filename, plural
from .runs import RunChunk, TextSlot, one_line

log = logging.getLogger(__name__)

PPTX_MEDIA_TYPE = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
_P, _R, _T, _RPR = qn("a:p"), qn("a:r"), qn("a:t"), qn("a:rPr")
# Elements of a paragraph that end a segment: the translation cannot move them.
_BOUNDARIES = {qn("a:br"), qn("a:fld")}
# Run attributes that do not change how text looks (language, spell-check and edit marks).
_INVISIBLE = {"lang", "altLang", "dirty", "err", "noProof", "smtClean", "smtId", "bmk"}
# Graphic frames whose text lives in a part of its own, which this module does not translate.
_OWN_PART_GRAPHICS = {"http://schemas.openxmlformats.org/drawingml/2006/chart": "chart",
                      "http://schemas.openxmlformats.org/drawingml/2006/diagram": "SmartArt diagram"}
_NOTE = ("Slide text, tables and speaker notes were translated; run formatting is kept, placed at the matching "
         "position of the translation where a sentence mixes formats.")


def _look(run: etree._Element) -> bytes:
    """The run's formatting, without the attributes that do not show."""
    rpr = run.find(_RPR)
    if rpr is None:
        return b""
    rpr = copy.deepcopy(rpr)
    for name in _INVISIBLE & set(rpr.attrib):
        del rpr.attrib[name]
    return etree.tostring(rpr) if len(rpr) or rpr.attrib else b""


def paragraph_chunks(p: etree._Element) -> list[RunChunk]:
    """The paragraph's text between boundaries, its runs grouped by look. DrawingML paragraphs are flat: runs,
    breaks and fields are direct children of `a:p`."""
    chunks = [RunChunk()]
    for child in p:
        if child.tag == _R:
            t = child.find(_T)
            if t is not None:
                chunks[-1].add(TextSlot(t), p, _look(child))
        elif child.tag in _BOUNDARIES:
            chunks.append(RunChunk())
    return [c for c in chunks if c.groups]


def _text_roots(presentation: PptxPresentation) -> list[etree._Element]:
    """Each slide, then its notes, in order. `has_notes_slide` is asked first: `notes_slide` would create one."""
    roots: list[etree._Element] = []
    for slide in presentation.slides:
        roots.append(slide.element)
        if slide.has_notes_slide:
            roots.append(slide.notes_slide.element)
    return roots


def _untranslated_graphics(roots: list[etree._Element]) -> dict[str, int]:
    """How many charts and SmartArt diagrams the slides hold (their text stays in the source language)."""
    counts: dict[str, int] = {}
    for root in roots:
        for data in root.iter(qn("a:graphicData")):
            what = _OWN_PART_GRAPHICS.get(data.get("uri", ""))
            if what:
                counts[what] = counts.get(what, 0) + 1
    return counts


class PresentationDocument(Document):
    kind = "pptx"
    sentinel_markup = True

    def __init__(self, filename: str, presentation: PptxPresentation) -> None:
        self._presentation = presentation
        self._chunks: list[RunChunk] = []
        roots = _text_roots(presentation)
        segments: list[str] = []
        for root in roots:
            for p in root.iter(_P):
                for chunk in paragraph_chunks(p):
                    if needs_translation(chunk.text()):
                        segments.append(chunk.segment())
                        self._chunks.append(chunk)
        self._graphics = _untranslated_graphics(roots)
        if not segments:
            if any(True for root in roots for _ in root.iter(qn("p:pic"))):
                raise InvalidInput(f"{filename}: the presentation holds only images, no text to translate "
                                   "(text inside images needs OCR first)")
            raise InvalidInput(f"{filename}: the presentation has no text to translate")
        super().__init__(filename, segments)

    def _render(self, translations: list[str], target: str | None) -> RenderedDocument:
        for chunk, translation in zip(self._chunks, translations):
            chunk.fill(one_line(translation))
        out = io.BytesIO()
        self._presentation.save(out)
        note = _NOTE
        if self._graphics:
            kept = " and ".join(plural(n, what) for what, n in self._graphics.items())
            note += f" The text of {kept} was not translated."
        return RenderedDocument(out.getvalue(), output_filename(self.filename, ".pptx", target), PPTX_MEDIA_TYPE,
                                note)


def read_presentation(data: bytes, filename: str, limits: LimitsConfig) -> PresentationDocument:
    check_zip(data, filename, limits, "pptx")
    try:
        return PresentationDocument(filename, pptx.Presentation(io.BytesIO(data)))
    # Untrusted input reaches the zip, OPC and XML layers, and python-pptx resolves relationships while the slides
    # are walked; any failure there means a damaged file, and the caller needs that sentence, not a parser's
    # internals.
    except (PythonPptxError, zipfile.BadZipFile, KeyError, ValueError, AttributeError, etree.XMLSyntaxError,
            EOFError, OSError) as exc:
        log.info("unreadable pptx %r: %s: %s", filename, type(exc).__name__, exc)
        raise UnsupportedDocument(f"{filename}: the .pptx is damaged or not a PowerPoint presentation and cannot "
                                  "be read") from None
