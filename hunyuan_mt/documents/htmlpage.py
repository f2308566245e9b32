"""HTML (.html/.htm): text is translated in place; tags, attributes, comments, scripts and styles are kept.

The stdlib parser reports where each text node starts. Text nodes joined only by inline tags (`Hello <b>world</b>,
see <a href=...>the docs</a>.`) form one segment, so a sentence is translated whole: its tags travel as masking
sentinels (`⟦0⟧`) and are put back verbatim by `masking.restore`, however the translator treats them; the text
itself is sent unescaped and escaped again on the way back. The output is the original source with only those
spans replaced, so all other markup is copied byte for byte. Text inside script, style, code, pre, textarea and
elements marked translate="no" or class="notranslate" is left alone.

The words a reader meets outside the text are translated too: `alt`, `title`, `placeholder` and `aria-label`
values, each a segment of its own (inside a sentence's inline tag as well: the tag travels as a sentinel, and its
attribute is put back translated). The root element's `lang` becomes the target language. `href`, `src` and every
other attribute stay as they are.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from dataclasses import dataclass
from html.parser import HTMLParser

from ..text import masking
from ..config import LimitsConfig
from ..errors import InputTooLarge
from .base import Document, RenderedDocument, TextTemplate, needs_translation, output_filename
from .encoding import DecodedText, decode_text

_NOTE = "Tags, attributes, scripts, styles and code are kept; only the text was translated."

_KEEP_TAGS = {"script", "style", "code", "pre", "textarea", "kbd", "samp", "var", "template", "svg", "math"}
# Kept elements that sit inside a sentence ("Call <code>f()</code> to save."): the whole element is one sentinel of
# the sentence around it, so the sentence is translated whole and the code comes back as it was.
INLINE_KEEP_TAGS = {"code", "kbd", "samp", "var"}
_VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
              "track", "wbr"}
# Tags that sit inside a sentence; any other tag ends the segment.
INLINE_TAGS = {"a", "abbr", "b", "bdi", "bdo", "big", "cite", "data", "del", "dfn", "em", "font", "i", "img", "ins",
                "label", "mark", "q", "s", "small", "span", "strike", "strong", "sub", "sup", "time", "tt", "u",
                "br", "wbr"}
_META_CHARSET = re.compile(r"""(<meta\b[^>]*?\bcharset\s*=\s*["']?)[\w.:-]+""", re.I)
# Attributes whose values a reader sees or hears: translated. Quoted or bare values, as HTML allows.
_TEXT_ATTRIBUTE = re.compile(r"""\s(alt|title|placeholder|aria-label)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'=<>`]+))""",
                             re.I)
_ROOT_LANG = re.compile(r"""(<html\b[^>]*?\s(?:xml:)?lang\s*=\s*["']?)([A-Za-z]{2,3}(?:[-_][A-Za-z0-9]+)*)""",
                        re.I)


#: Elements open at once, at most. Browsers' tree builders stop nesting far below what a page needs to be (Blink
#: and WebKit at 512); past this a document is refused, where each tag used to rescan the open ones (20,000 nested
#: tags took 14.7 s to read here; 8.2 s through the server, bench/hostile.py).
MAX_DEPTH = 1024


@dataclass
class _Item:
    """One parser event in source order: a text node (with its unescaped text) or a tag/comment/declaration."""

    start: int
    kind: str  # "text" | "inline" | "break"
    text: str = ""
    #: A start tag's translatable attribute values: (start, end) of the raw value in the source, unescaped value.
    attributes: tuple[tuple[int, int, str], ...] = ()


class _Scanner(HTMLParser):
    """Every tag and text node as an `_Item`, in constant time each: the open elements are a stack with counts of
    each tag and of the kept ones beside it, so no event looks through the stack (an end tag whose element is not
    open is known at once; one that closes several pops each once)."""

    def __init__(self, source: str, filename: str = "document.html") -> None:
        super().__init__(convert_charrefs=True)
        self._line_starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", source)]
        self._filename = filename
        self.items: list[_Item] = []
        self._stack: list[tuple[str, bool]] = []  # (tag, keeps its content untranslated)
        self._open: Counter[str] = Counter()      # open elements by tag
        self._kept = 0                            # open elements that keep their content
        #: Depth in the stack of an inline element kept whole (one item for all of it), or None.
        self._silent_from: int | None = None

    def _push(self, tag: str, keep: bool) -> None:
        if len(self._stack) >= MAX_DEPTH:
            raise InputTooLarge(f"{self._filename}: elements nested more than {MAX_DEPTH} deep (line "
                                f"{self.getpos()[0]}); the limit is {MAX_DEPTH}")
        self._stack.append((tag, keep))
        self._open[tag] += 1
        self._kept += keep

    def _close(self, tag: str) -> None:
        """Close the innermost open `tag` and every element opened inside it; an end tag with no open element
        (sloppy HTML) is ignored."""
        if not self._open[tag]:
            return
        while self._stack:
            name, keep = self._stack.pop()
            self._open[name] -= 1
            self._kept -= keep
            if name == tag:
                return

    def _offset(self) -> int:
        line, col = self.getpos()
        return self._line_starts[line - 1] + col

    def _keeping(self) -> bool:
        return self._kept > 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._silent_from is not None:
            if tag not in _VOID_TAGS:
                self._push(tag, True)
            return
        attributes = dict(attrs)
        keep = (tag in _KEEP_TAGS or attributes.get("translate") == "no"
                or "notranslate" in (attributes.get("class") or "").split())
        start = self._offset()
        if keep and not self._keeping() and tag not in _VOID_TAGS and (
                tag in INLINE_KEEP_TAGS or tag in INLINE_TAGS):
            # The element, its content and its end tag are one item: an inline sentinel, copied whole.
            self.items.append(_Item(start, "inline"))
            self._silent_from = len(self._stack)
            self._push(tag, True)
            return
        inline = tag in INLINE_TAGS and not keep
        shown = () if keep or self._keeping() else self._text_attributes(start)
        self.items.append(_Item(start, "inline" if inline else "break", attributes=shown))
        if tag not in _VOID_TAGS:
            self._push(tag, keep)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._silent_from is not None:
            return
        start = self._offset()
        shown = () if self._keeping() else self._text_attributes(start)
        self.items.append(_Item(start, "inline" if tag in INLINE_TAGS else "break", attributes=shown))

    def _text_attributes(self, start: int) -> tuple[tuple[int, int, str], ...]:
        raw = self.get_starttag_text() or ""
        found = []
        for match in _TEXT_ATTRIBUTE.finditer(raw):
            group = next(g for g in (2, 3, 4) if match.group(g) is not None)
            value = html.unescape(match.group(group))
            if needs_translation(value):
                found.append((start + match.start(group), start + match.end(group), value))
        return tuple(found)

    def handle_endtag(self, tag: str) -> None:
        keep_before = self._keeping()
        self._close(tag)
        if self._silent_from is not None:
            if len(self._stack) <= self._silent_from:
                self._silent_from = None  # the inline element kept whole has ended: its item covers it
            return
        inline = tag in INLINE_TAGS and not keep_before
        self.items.append(_Item(self._offset(), "inline" if inline else "break"))

    def handle_data(self, data: str) -> None:
        if self._silent_from is not None:
            return
        self.items.append(_Item(self._offset(), "text" if not self._keeping() else "break", data))

    def _other(self, *_: object) -> None:
        if self._silent_from is None:
            self.items.append(_Item(self._offset(), "break"))

    handle_comment = handle_decl = handle_pi = unknown_decl = _other


class HtmlDocument(Document):
    kind = "html"
    sentinel_markup = True

    def __init__(self, filename: str, decoded: DecodedText) -> None:
        self._decoded = decoded
        self._source = decoded.text
        scanner = _Scanner(self._source, filename)
        scanner.feed(self._source)
        scanner.close()
        self._template = TextTemplate(self._source)
        self._protected: list[masking.Protected | None] = []  # per template segment; None for an attribute value
        # Attribute values inside an inline tag that is a sentinel of a sentence: (template segment, span index,
        # start and end in the span, index in _inner); their texts are segments after the template's.
        self._in_spans: list[tuple[int, int, int, int, int]] = []
        self._inner: list[str] = []
        self._build(scanner.items)
        super().__init__(filename, self._template.segments + self._inner)

    def _build(self, items: list[_Item]) -> None:
        source = self._source
        run: list[tuple[_Item, int]] = []  # the current sentence: text nodes and the inline tags between them
        for n, item in enumerate(items):
            end = items[n + 1].start if n + 1 < len(items) else len(source)
            if item.kind == "inline":
                if run:  # inline tags before the first text node stay outside the segment
                    run.append((item, end))
                else:
                    self._add_attributes(item)
                continue
            if item.kind == "text" and html.unescape(source[item.start:end]) == item.text:
                run.append((item, end))
                continue
            # A block boundary, untranslated content, or a text node whose raw span is not what the parser saw.
            self._flush(run)
            run = []
            self._add_attributes(item)
        self._flush(run)

    def _add_attributes(self, item: _Item) -> None:
        """A tag outside every sentence: its attribute values are segments of the template."""
        for start, end, value in item.attributes:
            self._template.add(start, end, value)
            self._protected.append(None)

    def _flush(self, run: list[tuple[_Item, int]]) -> None:
        after: list[_Item] = []
        while run and run[-1][0].kind == "inline":
            after.insert(0, run.pop()[0])  # so are inline tags after the last one
        if not run or not needs_translation(" ".join(item.text for item, _ in run)):
            for item, _ in run:
                if item.kind == "inline":
                    self._add_attributes(item)
            for item in after:
                self._add_attributes(item)
            return
        index = len(self._template.segments)
        pieces: list[str] = []
        spans: list[str] = []
        for item, end in run:
            if item.kind == "text":
                pieces.append(item.text)
            else:
                for start, stop, value in item.attributes:  # translated inside the span at render time
                    self._in_spans.append((index, len(spans), start - item.start, stop - item.start,
                                           len(self._inner)))
                    self._inner.append(value)
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
        for item in after:
            self._add_attributes(item)

    def _render(self, translations: list[str], target: str | None) -> RenderedDocument:
        count = len(self._template.segments)
        inner = [html.escape(t, quote=True) for t in translations[count:]]
        spans = {i: list(p.spans) for i, p in enumerate(self._protected) if p is not None}
        # Attribute values inside a sentence's inline tags, last first so the earlier offsets stay valid.
        for segment, span, start, end, value in sorted(self._in_spans, key=lambda e: (e[0], e[1], -e[2])):
            spans[segment][span] = spans[segment][span][:start] + inner[value] + spans[segment][span][end:]
        # Escape what the translator wrote, then put the original markup back between it; an attribute value is
        # escaped for its quotes too.
        restored = [html.escape(t, quote=True) if p is None else
                    masking.restore(html.escape(t, quote=False), masking.Protected(p.text, spans[i]))
                    for i, (t, p) in enumerate(zip(translations[:count], self._protected))]
        # The output is UTF-8 whatever the upload was; a page that declares another charset would show mojibake.
        text = _META_CHARSET.sub(lambda m: m.group(1) + "utf-8", self._template.render(restored))
        if target:
            text = _ROOT_LANG.sub(lambda m: m.group(1) + target, text, count=1)
        return RenderedDocument(self._decoded.encode(text),
                                output_filename(self.filename, ".html", target), "text/html; charset=utf-8",
                                self._decoded.note(_NOTE))


def read_html(data: bytes, filename: str, limits: LimitsConfig) -> HtmlDocument:
    return HtmlDocument(filename, decode_text(data, filename))
