"""HTML (.html/.htm): text nodes are translated in place; tags, attributes, comments, scripts and styles are kept.

The stdlib parser reports where each text node starts; the output is the original source with only those text
spans replaced (re-escaped), so markup is copied byte for byte. Text inside script, style, code, pre, textarea and
elements marked translate="no" or class="notranslate" is left alone.
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser

from ..config import LimitsConfig
from .base import Document, RenderedDocument, TextTemplate, needs_translation, output_filename
from .encoding import DecodedText, decode_text

_KEEP_TAGS = {"script", "style", "code", "pre", "textarea", "kbd", "samp", "var", "template", "svg", "math"}
_VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
              "track", "wbr"}


class _TextNodes(HTMLParser):
    """Collects (start offset, unescaped text) of every text node outside kept elements, plus event offsets."""

    def __init__(self, source: str) -> None:
        super().__init__(convert_charrefs=True)
        self._line_starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", source)]
        self.nodes: list[tuple[int, str, bool]] = []  # (offset, text, translatable)
        self.events: list[int] = []
        self._stack: list[tuple[str, bool]] = []  # (tag, keeps its content untranslated)

    def _offset(self) -> int:
        line, col = self.getpos()
        return self._line_starts[line - 1] + col

    def _keeping(self) -> bool:
        return any(keep for _, keep in self._stack)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.events.append(self._offset())
        if tag in _VOID_TAGS:
            return
        attributes = dict(attrs)
        classes = (attributes.get("class") or "").split()
        keep = tag in _KEEP_TAGS or attributes.get("translate") == "no" or "notranslate" in classes
        self._stack.append((tag, keep))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.events.append(self._offset())

    def handle_endtag(self, tag: str) -> None:
        self.events.append(self._offset())
        # Close up to the matching open tag; unmatched end tags (sloppy HTML) are ignored.
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i][0] == tag:
                del self._stack[i:]
                break

    def handle_data(self, data: str) -> None:
        self.nodes.append((self._offset(), data, not self._keeping()))

    def _event(self, *_: object) -> None:
        self.events.append(self._offset())

    handle_comment = handle_decl = handle_pi = unknown_decl = _event


class HtmlDocument(Document):
    kind = "html"

    def __init__(self, filename: str, decoded: DecodedText) -> None:
        self._decoded = decoded
        source = decoded.text
        parser = _TextNodes(source)
        parser.feed(source)
        parser.close()
        self._template = TextTemplate(source)
        events = sorted(set(parser.events))
        for start, text, translatable in parser.nodes:
            if not translatable or not needs_translation(text):
                continue
            end = next((e for e in events if e > start), len(source))
            raw = source[start:end]
            if html.unescape(raw) != text:
                continue  # the raw span is not what the parser saw: keep it rather than risk the markup
            lead = len(raw) - len(raw.lstrip())
            core = raw.strip()
            self._template.add(start + lead, start + lead + len(core), " ".join(html.unescape(core).split()))
        super().__init__(filename, self._template.segments)

    def _render(self, translations: list[str], target: str | None) -> RenderedDocument:
        escaped = [html.escape(t, quote=False) for t in translations]
        return RenderedDocument(self._decoded.encode(self._template.render(escaped)),
                                output_filename(self.filename, ".html", target), "text/html; charset=utf-8",
                                self._decoded.note)


def read_html(data: bytes, filename: str, limits: LimitsConfig) -> HtmlDocument:
    return HtmlDocument(filename, decode_text(data, filename))
