"""PDF (.pdf): the text layer is read with pypdf and the translation is written as a Word document (.docx).

A PDF's layout cannot be rewritten with other text in it, so the result is one .docx paragraph per text paragraph,
with a page break where the PDF had one; the note says so. Paragraphs come from pypdf's layout mode, which keeps
vertical gaps as blank lines; lines inside a paragraph are joined and words hyphenated at line ends put back together.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Sequence

import docx
from docx.enum.text import WD_BREAK
from docx.oxml import OxmlElement
from docx.text.paragraph import Paragraph
from pypdf import PasswordType, PdfReader
from pypdf.errors import DependencyError, FileNotDecryptedError, PyPdfError

from ..config import LimitsConfig
from ..errors import InputTooLarge, UnsupportedDocument
from .base import Document, RenderedDocument, needs_translation, output_filename
from .word import DOCX_MEDIA_TYPE

log = logging.getLogger(__name__)

_SENTENCE_END = re.compile(r"[.!?:;。！？：；…»\"”)]\s*$")
# A line shorter than this share of its block's longest line, ending a sentence, ends its paragraph.
_SHORT_LINE = 0.75


def _damaged(filename: str) -> UnsupportedDocument:
    return UnsupportedDocument(f"{filename}: the PDF is damaged and cannot be read")


def _page_text(page: object) -> str:
    try:
        return page.extract_text(extraction_mode="layout")  # type: ignore[attr-defined]
    except (PyPdfError, ValueError, KeyError, TypeError, ZeroDivisionError, IndexError) as exc:
        # Layout mode is the fussier of the two; plain mode still gets the words, without the blank lines.
        log.info("layout extraction failed (%s: %s); using plain mode", type(exc).__name__, exc)
        return page.extract_text()  # type: ignore[attr-defined]


def _join_lines(lines: list[str]) -> str:
    out = lines[0]
    for line in lines[1:]:
        if re.search(r"\w-$", out) and line[:1].islower():
            out = out[:-1] + line  # "transla-" + "tion"
        else:
            out = f"{out} {line}"
    return out


def paragraphs_of(text: str) -> list[str]:
    """Blank lines separate paragraphs; inside a block, a short line that ends a sentence ends one too."""
    paragraphs: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        lines = [" ".join(line.split()) for line in block.splitlines()]
        lines = [line for line in lines if line]
        if not lines:
            continue
        longest = max(len(line) for line in lines)
        current: list[str] = []
        for line in lines:
            current.append(line)
            if _SENTENCE_END.search(line) and len(line) < _SHORT_LINE * longest:
                paragraphs.append(_join_lines(current))
                current = []
        if current:
            paragraphs.append(_join_lines(current))
    return paragraphs


class PdfDocument(Document):
    kind = "pdf"

    def __init__(self, filename: str, pages: list[list[str]]) -> None:
        #: Per page, per paragraph: the segment index, or the text itself when it has nothing to translate.
        self._pages: list[list[int | str]] = []
        segments: list[str] = []
        for paragraphs in pages:
            slots: list[int | str] = []
            for paragraph in paragraphs:
                if needs_translation(paragraph):
                    segments.append(paragraph)
                    slots.append(len(segments) - 1)
                else:
                    slots.append(paragraph)
            self._pages.append(slots)
        super().__init__(filename, segments)

    def layout(self) -> PdfLayout:
        return self._pages

    def _render(self, translations: list[str], target: str | None) -> RenderedDocument:
        return write_pdf_translation(self.filename, self._pages, translations, target)


#: Per page, per paragraph: the index of its segment, or its text where it had nothing to translate. All that
#: writing a PDF's translation needs: the .docx is written from it, never from the PDF.
PdfLayout = list[list[int | str]]


def write_pdf_translation(filename: str, pages: PdfLayout, translations: Sequence[str],
                          target: str | None) -> RenderedDocument:
    """The translation as a .docx: one paragraph per paragraph, a page break per page."""
    out = docx.Document()
    body = out.element.body
    # Each paragraph goes in before the section properties, found once: python-docx's add_paragraph looks for them
    # past every paragraph already written, and `out.paragraphs[-1]` (for the page break) lists them all, which
    # made a 5,000-page PDF's writing take 200 s here; this way it takes ~3 s.
    end = body.sectPr
    kept = [slots for slots in pages if slots]
    for number, slots in enumerate(kept):
        paragraph = None
        for slot in slots:
            element = OxmlElement("w:p")
            if end is not None:
                end.addprevious(element)
            else:
                body.append(element)
            paragraph = Paragraph(element, out._body)
            paragraph.add_run(translations[slot] if isinstance(slot, int) else slot)
        if number < len(kept) - 1 and paragraph is not None:
            paragraph.add_run().add_break(WD_BREAK.PAGE)
    buf = io.BytesIO()
    out.save(buf)
    return RenderedDocument(buf.getvalue(), output_filename(filename, ".docx", target), DOCX_MEDIA_TYPE,
                            "The PDF's text layer was translated into a Word document (.docx), one paragraph per "
                            "paragraph and a page break per page; the PDF's layout, fonts and images are not kept.")


def read_pdf(data: bytes, filename: str, limits: LimitsConfig) -> PdfDocument:
    try:
        try:
            reader = PdfReader(io.BytesIO(data))
        except (DependencyError, NotImplementedError) as exc:
            # pypdf reads the /Encrypt dictionary in its constructor and raises NotImplementedError for a security
            # handler or filter it does not know (was a 500), DependencyError for a cipher it has no library for.
            log.info("pdf %r: encryption pypdf cannot open: %s: %s", filename, type(exc).__name__, str(exc)[:200])
            raise UnsupportedDocument(f"{filename}: the PDF is encrypted in a way this server cannot open; save it "
                                      "without protection and upload it again") from None
        if reader.is_encrypted:
            # Many PDFs are encrypted only against editing, with an empty password for reading.
            try:
                opened = reader.decrypt("")
            except (DependencyError, NotImplementedError):
                opened = PasswordType.NOT_DECRYPTED
            if opened == PasswordType.NOT_DECRYPTED:
                raise UnsupportedDocument(f"{filename}: the PDF is password-protected; remove the password "
                                          "(print or export it without protection) and upload it again")
        count = len(reader.pages)
        if count > limits.max_segments:
            raise InputTooLarge(f"{filename}: {count} pages, the limit is {limits.max_segments}")
        pages = [paragraphs_of(_page_text(page)) for page in reader.pages]
    except (DependencyError, NotImplementedError) as exc:
        # The same refusals raised later, reading a page of a PDF whose encryption opened only in part.
        log.info("pdf %r: encryption pypdf cannot open: %s: %s", filename, type(exc).__name__, str(exc)[:200])
        raise UnsupportedDocument(f"{filename}: the PDF is encrypted in a way this server cannot open; save it "
                                  "without protection and upload it again") from None
    except FileNotDecryptedError:
        raise UnsupportedDocument(f"{filename}: the PDF is password-protected; remove the password and upload it "
                                  "again") from None
    except (PyPdfError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as exc:
        # Untrusted bytes reach pypdf's object parser; whatever breaks there, the file is what is wrong.
        log.info("unreadable pdf %r: %s: %s", filename, type(exc).__name__, exc)
        raise _damaged(filename) from None
    document = PdfDocument(filename, pages)
    if not document.segments:
        raise UnsupportedDocument(f"{filename}: the PDF has no text layer (it is probably a scanned image); run OCR "
                                  "on it first, e.g. with ocrmypdf, and upload the result")
    return document
