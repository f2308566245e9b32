"""Excel workbooks (.xlsx): the text cells of every worksheet, and cell comments, translated in place.

Only cells that hold text are touched. Formulas, numbers, dates, booleans and error values keep their value and
type; sheet names stay as they are because formulas, defined names and charts refer to them. A cell whose text is
nothing but do-not-translate spans (a URL, an e-mail address, a path: `masking.protect` finds none of its words) is
data, not prose, and is left alone. A cell is cut at its line breaks; a rich-text cell (runs of different fonts)
is one segment per line with a sentinel where the font changes (`runs.RunChunk`, as for Word runs), so a bold
word follows its translation.

openpyxl is the library that reads and writes .xlsx as a workbook model (cells, types, styles, rich text with
`rich_text=True`) without a spreadsheet application. Its round trip is not lossless. Measured on the fixture
(tests/data/office/gdk-pixbuf.xlsx, written by LibreOffice) and on LibreOffice-written files with a chart, a
picture, a comment, a table, data validation, conditional formatting, a hyperlink and a text box:

- kept: cell values and types, styles and number formats, merged cells, column widths and row heights, sheet
  views, defined names, data validation, conditional formatting, hyperlinks, tables, charts, pictures (through
  Pillow, which python-pptx already requires), comments, page setup, headers and footers;
- changed, harmless: strings are written inline instead of in the shared-string table; formulas lose their cached
  results and the workbook is marked to recalculate on open (LibreOffice shows the fixture's SUM again); comment
  boxes get openpyxl's default size; a header or footer code followed by text gains a space (`&12&A` → `&12 &A`);
  application extensions (LibreOffice's `extLst` in workbook.xml) are dropped;
- lost: drawing shapes (the text box, with its text, is gone from the saved drawing). From openpyxl's reader, not
  measured: SmartArt, form controls, slicers, threaded comments (Excel keeps a plain-note copy, which stays) and
  the macros of a macro-enabled workbook renamed .xlsx are lost too. The rendered note says so when the upload has
  drawing shapes or SmartArt.

Not translated: chart titles, header and footer text, data-validation prompts and sheet names.
"""

from __future__ import annotations

import io
import logging
import zipfile
from dataclasses import dataclass
from xml.etree.ElementTree import ParseError

import openpyxl
from lxml import etree
from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE, Cell
from openpyxl.cell.rich_text import CellRichText, TextBlock
from openpyxl.cell.text import InlineFont
from openpyxl.utils.exceptions import InvalidFileException
from openpyxl.workbook.workbook import Workbook

from ..text import masking
from ..config import LimitsConfig
from ..errors import InvalidInput, UnsupportedDocument
from .archive import check_zip
from .base import Document, RenderedDocument, check_xml_caps, needs_translation, output_filename
from .runs import RunChunk, TextSlot, one_line

log = logging.getLogger(__name__)

XLSX_MEDIA_TYPE = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
_NOTE = ("Text cells and comments were translated; formulas, numbers, dates and sheet names are kept, and formulas "
         "are recalculated when the file is opened.")
_XDR = "{http://schemas.openxmlformats.org/drawingml/2006/spreadsheetDrawing}"
_ANCHORS = {f"{_XDR}twoCellAnchor", f"{_XDR}oneCellAnchor", f"{_XDR}absoluteAnchor"}
_GRAPHIC_DATA = "{http://schemas.openxmlformats.org/drawingml/2006/main}graphicData"
_CHART_URI = "http://schemas.openxmlformats.org/drawingml/2006/chart"


@dataclass
class _Text:
    """A cell's or comment's text as RunChunks: one chunk per line, one slot per (font block, line).

    RunChunk fills text slots of XML elements; a rich-text block is not one, so each block's lines are lent a bare
    element to hold their text while the chunks are filled, and `value()` builds the cell value back from them.
    """

    fonts: list[InlineFont | None]
    lines: list[list[etree._Element]]
    chunks: list[RunChunk]
    rich: bool

    @classmethod
    def of(cls, value: str | CellRichText) -> _Text:
        rich = isinstance(value, CellRichText)
        blocks = [(b.font, b.text) if isinstance(b, TextBlock) else (None, str(b)) for b in value] if rich \
            else [(None, value)]
        fonts: list[InlineFont | None] = []
        lines: list[list[etree._Element]] = []
        chunks = [RunChunk()]
        for font, text in blocks:
            holders: list[etree._Element] = []
            for i, line in enumerate(text.split("\n")):
                if i:
                    chunks.append(RunChunk())  # a line break is a boundary, as in the other office formats
                holder = etree.Element("t")
                holder.text = line
                holders.append(holder)
                chunks[-1].add(TextSlot(holder), None, font)
            fonts.append(font)
            lines.append(holders)
        return cls(fonts, lines, chunks, rich)

    def value(self) -> str | CellRichText:
        texts = ["\n".join(holder.text or "" for holder in holders) for holders in self.lines]
        if not self.rich:
            return texts[0]
        # A run the translation left empty has nothing to show; it is dropped rather than written as an empty run.
        blocks = [TextBlock(font, text) if font is not None else text
                  for font, text in zip(self.fonts, texts) if text] or [""]
        return CellRichText(blocks)


def _translatable(chunk: RunChunk) -> bool:
    text = chunk.text()
    return needs_translation(text) and masking.protect(text).has_words


def _clean(translation: str) -> str:
    """One line, without the control characters XML (and so openpyxl) refuses."""
    return ILLEGAL_CHARACTERS_RE.sub("", one_line(translation))


def _cells(workbook: Workbook) -> list[Cell]:
    """Every cell that holds a value or a comment, sheet by sheet in reading order.

    The worksheet's `_cells` is read because the public iterators create an empty cell at every gap of the used
    range, which would bloat a sparse sheet (and its saved file).
    """
    return [cell for sheet in workbook.worksheets for _, cell in sorted(sheet._cells.items())]


def _lost_shapes(data: bytes) -> int:
    """How many drawing objects openpyxl will drop: everything anchored in a drawing but pictures and charts."""
    lost = 0
    # An upload's entities and DTDs are never expanded or fetched; a parser per call, as lxml parsers are not
    # shared between threads.
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for name in zf.namelist():
            if not (name.startswith("xl/drawings/") and name.endswith(".xml") and "/_rels/" not in name):
                continue
            try:
                root = etree.fromstring(zf.read(name), parser)
            except etree.XMLSyntaxError:
                continue  # openpyxl refuses it too, or never reads it
            check_xml_caps(root, name)
            for anchor in root:
                if anchor.tag not in _ANCHORS:
                    continue
                kept = anchor.find(f"{_XDR}pic") is not None or any(
                    graphic.get("uri") == _CHART_URI for graphic in anchor.iter(_GRAPHIC_DATA))
                lost += not kept
    return lost


class SpreadsheetDocument(Document):
    kind = "xlsx"
    sentinel_markup = True

    def __init__(self, filename: str, workbook: Workbook, lost_shapes: int = 0) -> None:
        self._workbook = workbook
        self._lost_shapes = lost_shapes
        #: (cell, its text, whether the text is the cell's comment): what `_render` writes back.
        self._texts: list[tuple[Cell, _Text, bool]] = []
        self._chunks: list[RunChunk] = []
        segments: list[str] = []
        for cell in _cells(workbook):
            if cell.data_type == "s" and isinstance(cell.value, (str, CellRichText)):
                self._collect(cell, _Text.of(cell.value), False, segments)
            if cell.comment is not None and cell.comment.text:
                self._collect(cell, _Text.of(cell.comment.text), True, segments)
        if not segments:
            raise InvalidInput(f"{filename}: the workbook has no text to translate (only numbers, dates, formulas "
                               "or links)")
        super().__init__(filename, segments)

    def _collect(self, cell: Cell, text: _Text, comment: bool, segments: list[str]) -> None:
        chunks = [chunk for chunk in text.chunks if _translatable(chunk)]
        if chunks:
            self._texts.append((cell, text, comment))
            self._chunks.extend(chunks)
            segments.extend(chunk.segment() for chunk in chunks)

    def _render(self, translations: list[str], target: str | None) -> RenderedDocument:
        for chunk, translation in zip(self._chunks, translations):
            chunk.fill(_clean(translation))
        for cell, text, comment in self._texts:
            if comment:
                cell.comment.text = text.value()
            else:
                cell.value = text.value()
                # openpyxl reads a string starting with "=" as a formula and "#N/A" as an error: a translated text
                # stays text.
                cell.data_type = "s"
        out = io.BytesIO()
        self._workbook.save(out)
        note = _NOTE
        if self._lost_shapes:
            note += (f" {self._lost_shapes} drawing shape{'s' if self._lost_shapes > 1 else ''} (text boxes, "
                     "arrows, SmartArt) could not be kept: the library that writes .xlsx files does not read them.")
        return RenderedDocument(out.getvalue(), output_filename(self.filename, ".xlsx", target), XLSX_MEDIA_TYPE,
                                note)


def read_spreadsheet(data: bytes, filename: str, limits: LimitsConfig) -> SpreadsheetDocument:
    check_zip(data, filename, limits, "xlsx")
    try:
        workbook = openpyxl.load_workbook(io.BytesIO(data), rich_text=True)
        lost_shapes = _lost_shapes(data)
    # Untrusted input reaches the zip and XML layers and openpyxl's typed descriptors (which raise TypeError or
    # ValueError on a bad attribute); any failure there means a damaged file, and the caller needs that sentence.
    except (InvalidFileException, zipfile.BadZipFile, KeyError, ValueError, TypeError, AttributeError, IndexError,
            etree.XMLSyntaxError, ParseError, EOFError, OSError) as exc:
        log.info("unreadable xlsx %r: %s: %s", filename, type(exc).__name__, exc)
        raise UnsupportedDocument(f"{filename}: the .xlsx is damaged or not an Excel workbook and cannot be read") \
            from None
    return SpreadsheetDocument(filename, workbook, lost_shapes)
