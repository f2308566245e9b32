"""What every format module shares: the `Document` interface, the rendered result and the segment rules."""

from __future__ import annotations

import re
import unicodedata
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Sequence

from ..errors import InputTooLarge, InvalidInput
from ..text.masking import char_class
from ..config import LimitsConfig


@dataclass(frozen=True)
class RenderedDocument:
    """A translated document ready to download."""

    data: bytes
    filename: str
    media_type: str
    #: One sentence for the user about what was kept or changed (e.g. "PDF text layer → .docx"); may be empty.
    note: str = ""


def plural(count: int, what: str) -> str:
    """`3 segments`, `1 segment`: a count in a document's note."""
    return f"{count} {what}{'s' if count > 1 else ''}"


def needs_translation(text: str) -> bool:
    """True when `text` holds at least one letter; numbers, punctuation, symbols and whitespace are kept as they are."""
    return any(unicodedata.category(ch).startswith("L") for ch in text)


def split_outer_whitespace(text: str) -> tuple[str, str, str]:
    """`"  Hello \\n"` → ("  ", "Hello", " \\n"): the translator sees the core, the layout keeps the rest."""
    core = text.strip()
    if not core:
        return text, "", ""
    start = text.index(core)
    return text[:start], core, text[start + len(core):]


def trim_span(text: str, start: int, end: int) -> tuple[int, int]:
    """Narrow text[start:end] to its non-whitespace core, so the whitespace around a segment stays in the template."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def output_filename(filename: str, ext: str, target: str | None) -> str:
    """`report.pdf` → `report.es.docx` (or `report.translated.docx` without a target); never a path."""
    stem = PurePath(filename.replace("\\", "/")).stem or "document"
    return f"{stem}.{target or 'translated'}{ext}"


#: Combining marks in a row that a text may carry: 30 is Unicode's stream-safe limit (UAX #15), which no language
#: needs to exceed. "a" followed by 4,999 accents was cut into five segments, the model made one "á" of the first
#: 1,000 characters, and the answer came back 4,001 characters long (tests/test_hostile_input.py).
MAX_MARK_RUN = 30


_MARKS = char_class({cp for cp in range(0x20000) if unicodedata.combining(chr(cp))})
_MARK_RUN = re.compile(f"{_MARKS}{{{MAX_MARK_RUN + 1},}}")


def check_mark_runs(text: str, where: str) -> None:
    """Refuse a text with more than MAX_MARK_RUN combining marks in a row (InvalidInput, 400)."""
    found = _MARK_RUN.search(text)
    if found is not None:
        raise InvalidInput(f"{where}: {len(found.group(0))} combining marks in a row at character {found.start()}; "
                           f"the limit is {MAX_MARK_RUN} (Unicode's stream-safe text)")


def check_segment_limits(filename: str, segments: Sequence[str], limits: LimitsConfig) -> None:
    """Refuse documents over the segment or character limits, quoting both numbers, and a segment with a run of
    combining marks past MAX_MARK_RUN."""
    if len(segments) > limits.max_segments:
        raise InputTooLarge(f"{filename}: {len(segments)} segments to translate, the limit is {limits.max_segments}")
    chars = sum(len(s) for s in segments)
    if chars > limits.max_doc_chars:
        raise InputTooLarge(f"{filename}: {chars} characters to translate, the limit is {limits.max_doc_chars}")
    for segment in segments:
        check_mark_runs(segment, filename)


#: Attributes one XML element may carry. lxml copies and looks up attributes one at a time, each against the ones
#: already there: 40,000 on one XLIFF element held every other client for 18-24 s (bench/hostile.py; 20,000 took 3.4 s to
#: read here).
MAX_ATTRIBUTES = 256


def check_xml_caps(root: Any, where: str) -> None:
    """Refuse an lxml tree past the caps a reader's later steps are linear under: attributes per element (nesting
    depth is libxml2's own cap, 256 levels without huge_tree: a parse error, 400). Counts each attribute once."""
    for element in root.iter():
        count = len(element.attrib)
        if count > MAX_ATTRIBUTES:
            raise InputTooLarge(f"{where}: an element carries {count} attributes (line {element.sourceline}); the "
                                f"limit is {MAX_ATTRIBUTES}")


def check_not_empty(filename: str, segments: Sequence[str], what: str = "text") -> None:
    if not segments:
        raise InvalidInput(f"{filename}: no {what} to translate was found")


#: Where a segment's translation came from: the translation memory (exact, or near-exact: case, closing
#: punctuation, numbers or placeholders differed) or the model.
ORIGIN_MEMORY, ORIGIN_MEMORY_NEAR, ORIGIN_MODEL = "memory", "memory-near", "model"
#: The model's, with a confidence at or above `quality.review_below` (every sentence of the segment): the formats
#: that mark what needs review (XLIFF's state, PO's fuzzy flag) leave it unmarked. Below it, ORIGIN_MODEL.
ORIGIN_MODEL_SURE = "model-confident"


class Document(ABC):
    """A parsed upload: the `segments` to translate, in order, and how to put translations back."""

    #: Short format name ("txt", "md", "srt", "docx", "pdf", "html").
    kind: str = ""
    #: Whether segments carry ⟦0⟧ … ⟦n-1⟧ for inline markup (tags, formatting runs) that must come back in order:
    #: the markup is then placed in the translation of the segment without it (`reader.translate_keeping_markup`).
    sentinel_markup: bool = False

    def __init__(self, filename: str, segments: list[str]) -> None:
        self.filename = filename
        #: Stripped, non-empty texts that hold letters; never code blocks, timings or markup.
        self.segments = segments
        #: Segment text → where its translation came from (ORIGINS), where the translator said: the formats with a
        #: place for it (XLIFF's state-qualifier, a PO comment) write it; unknown segments count as the model's.
        self.origins: dict[str, str] = {}
        #: Whether a format whose only place for it is a comment (docx) comments the segments to review
        #: (ORIGIN_MODEL: the model's, below quality.review_below; `quality.docx_comments`).
        self.review_comments = False

    def layout(self) -> Any:
        """What writing the translation needs of the file besides the translations, where that is small enough to
        send to another process and write from without reading the file again (a PDF: its paragraphs and page
        breaks, `reader.render_layout`); None: writing reads the file again (`parsers.ParsedDocument`)."""
        return None

    def render(self, translations: Sequence[str], target: str | None = None) -> RenderedDocument:
        """The translated document; `translations[i]` replaces `segments[i]`."""
        if len(translations) != len(self.segments):
            raise ValueError(f"{self.filename}: got {len(translations)} translations for {len(self.segments)} segments")
        return self._render([t.strip() for t in translations], target)

    @abstractmethod
    def _render(self, translations: list[str], target: str | None) -> RenderedDocument: ...


class TextTemplate:
    """A source text with some spans marked for replacement; the text formats render through this.

    Spans are (start, end) offsets into the source; everything outside them is copied byte for byte, which is how
    markup, code and layout survive a translation untouched.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self._spans: list[tuple[int, int, int]] = []  # (start, end, segment index)
        self.segments: list[str] = []

    def fits(self, start: int) -> bool:
        """Whether a span starting at `start` comes after every span added so far."""
        return not self._spans or start >= self._spans[-1][1]

    def add(self, start: int, end: int, segment: str) -> int:
        """Mark source[start:end] to be replaced by the translation of `segment`; returns the segment index."""
        if self._spans and start < self._spans[-1][1]:
            raise ValueError("spans must be added in order and must not overlap")
        self.segments.append(segment)
        self._spans.append((start, end, len(self.segments) - 1))
        return len(self.segments) - 1

    def render(self, replacements: Sequence[str]) -> str:
        out: list[str] = []
        pos = 0
        for start, end, index in self._spans:
            out.append(self.source[pos:start])
            out.append(replacements[index])
            pos = end
        out.append(self.source[pos:])
        return "".join(out)
