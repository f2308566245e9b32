"""HTML (.html/.htm): text is translated in place; tags, attributes, comments, scripts and styles are kept.

The stdlib parser reports where each text node starts. Text nodes joined only by inline tags (`Hello <b>world</b>,
see <a href=...>the docs</a>.`) form one segment, so a sentence is translated whole: its tags travel as masking
sentinels (`⟦0⟧`) and are put back verbatim by `masking.restore`, however the translator treats them; the text
itself is sent unescaped and escaped again on the way back. The output is the original source with only those
spans replaced, so all other markup is copied byte for byte. Text inside script, style, code, pre, textarea and
elements marked translate="no" or class="notranslate" is left alone.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from html.parser import HTMLParser

from .. import masking
from ..config import LimitsConfig
from .base import Document, RenderedDocument, TextTemplate, needs_translation, output_filename
from .encoding import DecodedText, decode_text

_NOTE = "Tags, attributes, scripts, styles and code are kept; only the text was translated."

_KEEP_TAGS = {"script", "style", "code", "pre", "textarea", "kbd", "samp", "var", "template", "svg", "math"}
_VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
              "track", "wbr"}
# Tags that sit inside a sentence; any other tag ends the segment.
_INLINE_TAGS = {"a", "abbr", "b", "bdi", "bdo", "big", "cite", "data", "del", "dfn", "em", "font", "i", "img", "ins",
                "label", "mark", "q", "s", "small", "span", "strike", "strong", "sub", "sup", "time", "tt", "u",
                "br", "wbr"}
_META_CHARSET = re.compile(r"""(<meta\b[^>]*?\bcharset\s*=\s*["']?)[\w.:-]+""", re.I)


@dataclass
class _Item:
    """One parser event in source order: a text node (with its unescaped text) or a tag/comment/declaration."""

    start: int
    kind: str  # "text" | "inline" | "break"
    text: str = ""


class _Scanner(HTMLParser):
    def __init__(self, source: str) -> None:
        super().__init__(convert_charrefs=True)
        self._line_starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", source)]
        self.items: list[_Item] = []
        self._stack: list[tuple[str, bool]] = []  # (tag, keeps its content untranslated)

    def _offset(self) -> int:
        line, col = self.getpos()
        return self._line_starts[line - 1] + col

    def _keeping(self) -> bool:
        return any(keep for _, keep in self._stack)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        keep = (tag in _KEEP_TAGS or attributes.get("translate") == "no"
                or "notranslate" in (attributes.get("class") or "").split())
        inline = tag in _INLINE_TAGS and not keep
        self.items.append(_Item(self._offset(), "inline" if inline else "break"))
        if tag not in _VOID_TAGS:
            self._stack.append((tag, keep))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.items.append(_Item(self._offset(), "inline" if tag in _INLINE_TAGS else "break"))

    def handle_endtag(self, tag: str) -> None:
        keep_before = self._keeping()
        # Close up to the matching open tag; unmatched end tags (sloppy HTML) are ignored.
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i][0] == tag:
                del self._stack[i:]
                break
        inline = tag in _INLINE_TAGS and not keep_before
        self.items.append(_Item(self._offset(), "inline" if inline else "break"))

    def handle_data(self, data: str) -> None:
        self.items.append(_Item(self._offset(), "text" if not self._keeping() else "break", data))

    def _other(self, *_: object) -> None:
        self.items.append(_Item(self._offset(), "break"))

    handle_comment = handle_decl = handle_pi = unknown_decl = _other


class HtmlDocument(Document):
    kind = "html"
    sentinel_markup = True

    def __init__(self, filename: str, decoded: DecodedText) -> None:
        self._decoded = decoded
        self._source = decoded.text
        scanner = _Scanner(self._source)
        scanner.feed(self._source)
        scanner.close()
        self._template = TextTemplate(self._source)
        self._protected: list[masking.Protected] = []
        self._build(scanner.items)
        super().__init__(filename, self._template.segments)

    def _build(self, items: list[_Item]) -> None:
        source = self._source
        run: list[tuple[_Item, int]] = []  # the current sentence: text nodes and the inline tags between them
        for n, item in enumerate(items):
            end = items[n + 1].start if n + 1 < len(items) else len(source)
            if item.kind == "inline":
                if run:  # inline tags before the first text node stay outside the segment
                    run.append((item, end))
                continue
            if item.kind == "text" and html.unescape(source[item.start:end]) == item.text:
                run.append((item, end))
                continue
            # A block boundary, untranslated content, or a text node whose raw span is not what the parser saw.
            self._flush(run)
            run = []
        self._flush(run)

    def _flush(self, run: list[tuple[_Item, int]]) -> None:
        while run and run[-1][0].kind == "inline":
            run.pop()  # so are inline tags after the last one
        if not run or not needs_translation(" ".join(item.text for item, _ in run)):
            return
        pieces: list[str] = []
        spans: list[str] = []
        for item, end in run:
            if item.kind == "text":
                pieces.append(item.text)
            else:
                pieces.append(masking.sentinel(len(spans)))
                spans.append(self._source[item.start:end])
        # HTML collapses whitespace anyway; the translator gets one clean line with the tags as sentinels.
        segment = " ".join("".join(pieces).split())
        first, last = run[0][0], run[-1]
        raw_first = self._source[first.start:run[0][1]]
        start = first.start + len(raw_first) - len(raw_first.lstrip())
        raw_last = self._source[last[0].start:last[1]]
        end = last[1] - (len(raw_last) - len(raw_last.rstrip()))
        self._protected.append(masking.Protected(segment, spans))
        self._template.add(start, end, segment)

    def _render(self, translations: list[str], target: str | None) -> RenderedDocument:
        # Escape what the translator wrote, then put the original markup back between it.
        restored = [masking.restore(html.escape(t, quote=False), p) for t, p in zip(translations, self._protected)]
        # The output is UTF-8 whatever the upload was; a page that declares another charset would show mojibake.
        text = _META_CHARSET.sub(lambda m: m.group(1) + "utf-8", self._template.render(restored))
        return RenderedDocument(self._decoded.encode(text),
                                output_filename(self.filename, ".html", target), "text/html; charset=utf-8",
                                self._decoded.note(_NOTE))


def read_html(data: bytes, filename: str, limits: LimitsConfig) -> HtmlDocument:
    return HtmlDocument(filename, decode_text(data, filename))
