"""Plain text (.txt): one segment per paragraph, blank lines and indentation kept."""

from __future__ import annotations

import re

from ..config import LimitsConfig
from .base import Document, RenderedDocument, TextTemplate, needs_translation, output_filename, trim_span
from .encoding import DecodedText, decode_text

_BLANK_LINES = re.compile(r"(?:\r\n|\r|\n)(?:[ \t]*(?:\r\n|\r|\n))+")
_LIST_MARKER = re.compile(r"^\s*(?:[-*•·‣◦+]|\d{1,3}[.)]|[a-zA-Z][.)])\s")
# Lines at least this long that wrap into the next line are taken as hard-wrapped prose.
_WRAPPED_LINE = 40


def _is_wrapped_prose(lines: list[str]) -> bool:
    """Hard-wrapped prose is translated as one sentence stream; lists, verse and addresses line by line."""
    if any(_LIST_MARKER.match(line) for line in lines):
        return False
    return all(len(line.strip()) >= _WRAPPED_LINE for line in lines[:-1])


def build_paragraph_template(text: str) -> TextTemplate:
    template = TextTemplate(text)
    pos = 0
    bounds = [(m.start(), m.end()) for m in _BLANK_LINES.finditer(text)] + [(len(text), len(text))]
    for sep_start, sep_end in bounds:
        _add_paragraph(template, text, pos, sep_start)
        pos = sep_end
    return template


def _add_paragraph(template: TextTemplate, text: str, start: int, end: int) -> None:
    lines = [(m.start(), m.end()) for m in re.finditer(r"[^\r\n]+", text[start:end])]
    lines = [(start + a, start + b) for a, b in lines if text[start + a:start + b].strip()]
    if not lines:
        return
    if len(lines) > 1 and _is_wrapped_prose([text[a:b] for a, b in lines]):
        a, b = trim_span(text, lines[0][0], lines[-1][1])
        joined = " ".join(text[x:y].strip() for x, y in lines)
        if needs_translation(joined):
            template.add(a, b, joined)
        return
    for line_start, line_end in lines:
        a, b = trim_span(text, line_start, line_end)
        if needs_translation(text[a:b]):
            template.add(a, b, text[a:b])


class TextDocument(Document):
    kind = "txt"

    def __init__(self, filename: str, decoded: DecodedText) -> None:
        self._decoded = decoded
        self._template = build_paragraph_template(decoded.text)
        super().__init__(filename, self._template.segments)

    def _render(self, translations: list[str], target: str | None) -> RenderedDocument:
        return RenderedDocument(self._decoded.encode(self._template.render(translations)),
                                output_filename(self.filename, ".txt", target), "text/plain; charset=utf-8",
                                self._decoded.note())


def read_text(data: bytes, filename: str, limits: LimitsConfig) -> TextDocument:
    return TextDocument(filename, decode_text(data, filename))
