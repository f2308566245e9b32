"""Markdown (.md): the text of paragraphs, headings, list items and table cells is translated in place.

markdown-it-py parses; the output is the original source with only those text spans replaced (found through the
parser's line maps), so every bit of markdown syntax, code blocks, inline HTML blocks and front matter stays byte for
byte. Inline code and link targets travel inside their sentence, where the service's masking keeps them verbatim;
inline runs that are nothing but code, links or HTML are not sent at all.
"""

from __future__ import annotations

import re

from markdown_it import MarkdownIt
from markdown_it.token import Token

from ..text import masking
from ..config import LimitsConfig
from .base import Document, RenderedDocument, TextTemplate, needs_translation, output_filename, trim_span
from .encoding import DecodedText, decode_text

_NOTE = "Markdown syntax, code, HTML and front matter are kept as they were."

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")
_FRONT_MATTER_FENCES = {"---": ("---", "..."), "+++": ("+++",)}
# A translation that starts like this would turn a paragraph into a heading, list, quote or rule.
_BLOCK_MARKER = re.compile(r"^(?:#{1,6}(?:\s|$)|[-+*]\s|\d{1,9}[.)]\s|>|=+\s*$|-+\s*$|`{3,}|~{3,})")
_ALERT = re.compile(r"^\[![A-Za-z]+\]\s*$")
_TRANSLATED_PARENTS = {"paragraph_open", "heading_open", "th_open", "td_open"}
# Inline markup a model would mangle ("**Web page**" came back "**We página*"): emphasis, strikethrough and link
# syntax become sentinels. Escapes, code spans and autolinks/HTML are matched only to be skipped (code and URLs are
# the service's masking's business).
_INLINE = re.compile(r"\\.|`+[^`]*?`+|<[^<>\s]+>|\*\*|__|~~|\*|_|!?\[|"
                     r"\]\((?:[^()\s]|\([^()\s]*\))*(?:\s+(?:\"[^\"]*\"|'[^']*'))?\)")
_KIND = {"**": "strong", "__": "strong", "~~": "s", "*": "em", "_": "em", "[": "link", "](": "link"}
_INLINE_PARSER = MarkdownIt("commonmark").enable(["strikethrough"])


def mask_inline(text: str) -> masking.Protected | None:
    """`text` with its emphasis, strikethrough and link markers as sentinels ⟦0⟧ … in order, and the markers; None
    when it has none, or when they cannot be told apart from literal characters with certainty (the parser and
    the scan disagree: reference links, images, a literal "[1]"): then it goes as it is."""
    tokens = _INLINE_PARSER.parseInline(text)[0].children or []
    expected: dict[str, int] = {}
    for token in tokens:
        if token.type == "image" or (token.type == "link_open" and token.markup == "autolink"):
            return None
        for kind in ("strong", "em", "s", "link"):
            if token.type in (f"{kind}_open", f"{kind}_close"):
                expected[kind] = expected.get(kind, 0) + 1
    if not expected:
        return None
    spans: list[tuple[int, int]] = []
    found: dict[str, int] = {}
    for m in _INLINE.finditer(text):
        marker = m.group(0)
        key = "](" if marker.startswith("](") else marker
        if key not in _KIND:
            if key == "![":
                return None
            continue  # an escape, a code span or an autolink: not ours
        if key == "_" and 0 < m.start() and m.end() < len(text) and text[m.start() - 1].isalnum() \
                and text[m.end()].isalnum():
            continue  # snake_case: an underscore inside a word is never emphasis
        found[_KIND[key]] = found.get(_KIND[key], 0) + 1
        spans.append((m.start(), m.end()))
    if found != expected:
        return None
    pieces, markers, pos = [], [], 0
    for start, end in spans:
        pieces.append(text[pos:start])
        markers.append(text[start:end])
        pos = end
    pieces.append(text[pos:])
    return masking.Protected(masking.join_pieces(pieces), markers)


def _line_spans(source: str) -> list[tuple[int, int]]:
    """(start, end) of each line's content without its line break, numbered as markdown-it numbers lines."""
    spans = []
    for m in _LINE.finditer(source):
        text = m.group(0)
        spans.append((m.start(), m.start() + len(text.rstrip("\r\n"))))
    return spans


def _front_matter_lines(lines: list[str]) -> int:
    """Number of leading lines that form YAML (---) or TOML (+++) front matter; 0 when there is none."""
    if not lines or lines[0].strip() not in _FRONT_MATTER_FENCES:
        return 0
    closers = _FRONT_MATTER_FENCES[lines[0].strip()]
    for i in range(1, len(lines)):
        if lines[i].strip() in closers:
            return i + 1
    return 0


def _prose_of(inline: Token) -> str:
    """The plain text of an inline run, without code spans, HTML and bare autolinks."""
    out: list[str] = []
    in_autolink = False
    for child in inline.children or []:
        if child.type == "link_open" and child.markup == "autolink":
            in_autolink = True
        elif child.type == "link_close" and in_autolink:
            in_autolink = False
        elif child.type == "text" and not in_autolink:
            out.append(child.content)
        elif child.type == "image":
            out.append(_prose_of(child))
    return " ".join(out)


class MarkdownDocument(Document):
    kind = "md"
    sentinel_markup = True

    def __init__(self, filename: str, decoded: DecodedText) -> None:
        self._decoded = decoded
        source = decoded.text
        self._template = TextTemplate(source)
        #: Segment index → what its translation must be escaped against ("cell" or "block").
        self._escapes: dict[int, str] = {}
        #: Segment index → its inline markers, masked as sentinels in the segment.
        self._markup: dict[int, masking.Protected] = {}
        self._build(source)
        super().__init__(filename, self._template.segments)

    def _build(self, source: str) -> None:
        spans = _line_spans(source)
        lines = [source[a:b] for a, b in spans]
        skip = _front_matter_lines(lines)
        # Blank the front matter for the parser but keep the line count, so its line maps still fit `spans`.
        parse_source = "\n" * skip + "\n".join(lines[skip:])
        tokens = MarkdownIt("commonmark").enable(["table", "strikethrough"]).parse(parse_source)
        cursor = {i: a for i, (a, _) in enumerate(spans)}
        parent = ""
        for token in tokens:
            if token.type.endswith("_open"):
                parent = token.type
            if token.type != "inline" or parent not in _TRANSLATED_PARENTS or not token.map:
                continue
            if not needs_translation(_prose_of(token)):
                continue
            in_cell = parent in ("th_open", "td_open")
            located = self._locate(source, spans, cursor, token, in_cell)
            if located is None:
                continue  # the parser normalised this text beyond recognition: keep the original rather than guess
            if len(located) > 1 and _ALERT.match(source[located[0][0]:located[0][1]]):
                located = located[1:]  # a GitHub alert marker must stay alone on its line
            hard_break = any(c.type == "hardbreak" for c in token.children or [])
            if hard_break:
                pieces = located
            else:
                pieces = [(located[0][0], located[-1][1])]
            for n, (a, b) in enumerate(pieces):
                if hard_break:
                    a, b = trim_span(source, a, b)
                    text = source[a:b]
                elif in_cell:
                    text = token.content  # the parser already dropped the escapes of "\\|"
                else:
                    text = " ".join(source[x:y].strip() for x, y in located) if len(located) > 1 else source[a:b]
                if not needs_translation(text) or a >= b or not self._template.fits(a):
                    continue
                masked = mask_inline(text)
                index = self._template.add(a, b, masked.text if masked else text)
                if masked is not None:
                    self._markup[index] = masked
                if in_cell:
                    self._escapes[index] = "cell"
                elif n == 0:
                    self._escapes[index] = "block"

    @staticmethod
    def _locate(source: str, spans: list[tuple[int, int]], cursor: dict[int, int], token: Token,
                in_cell: bool) -> list[tuple[int, int]] | None:
        """Absolute (start, end) of each content line of `token` in the source, or None when one is not found."""
        first = token.map[0]
        found: list[tuple[int, int]] = []
        for i, content in enumerate(token.content.split("\n")):
            line_no = first + i
            if line_no >= len(spans):
                return None
            start, end = cursor[line_no], spans[line_no][1]
            candidates = [content, content.replace("|", "\\|")] if in_cell else [content]
            pos = -1
            for candidate in candidates:
                # Table cells share a line: search left to right; elsewhere the content is the line's tail.
                pos = source.find(candidate, start, end) if in_cell else source.rfind(candidate, start, end)
                if pos >= 0:
                    content = candidate
                    break
            if pos < 0:
                return None
            found.append((pos, pos + len(content)))
            cursor[line_no] = pos + len(content)
        return found

    def _escape(self, index: int, text: str) -> str:
        # Each span is one source line's worth of text: a line break from the translator would end the paragraph
        # or the list item, or start a new block.
        text = re.sub(r"\s*\n\s*", " ", text)
        kind = self._escapes.get(index)
        if kind == "cell":
            return re.sub(r"(?<!\\)\|", r"\\|", text)
        if kind == "block" and _BLOCK_MARKER.match(text) and not _BLOCK_MARKER.match(self.segments[index]):
            return "\\" + text
        return text

    def _unmask(self, index: int, text: str) -> str:
        """The markers back in place of the sentinels; emphasis hugs its words ("** texto **" would not be bold)."""
        masked = self._markup.get(index)
        if masked is None:
            return text
        pieces = masking.split_at_sentinels(text, len(masked.spans))
        if pieces is None:
            return masking.restore(text, masked)
        for k, marker in enumerate(masked.spans):
            before, after = pieces[k], pieces[k + 1]
            if marker == "[" or (not marker.startswith("](") and _opens(masked.spans, k)):
                # "texto ⟦0⟧ negrita" → "texto **negrita": the space moves in front of the marker.
                if after[:1].isspace():
                    pieces[k + 1] = after.lstrip()
                    if before and not before[-1:].isspace() and before[-1] not in _OPENING:
                        pieces[k] = before + " "
            elif before[-1:].isspace():
                pieces[k] = before.rstrip()
                if after and not after[:1].isspace() and after[0] not in _CLOSING:
                    pieces[k + 1] = " " + after
        out = [pieces[0]]
        for marker, piece in zip(masked.spans, pieces[1:]):
            out += [marker, piece]
        return "".join(out)

    def _render(self, translations: list[str], target: str | None) -> RenderedDocument:
        escaped = [self._escape(i, self._unmask(i, t)) for i, t in enumerate(translations)]
        return RenderedDocument(self._decoded.encode(self._template.render(escaped)),
                                output_filename(self.filename, ".md", target), "text/markdown; charset=utf-8",
                                self._decoded.note(_NOTE))


#: Punctuation that takes no space after it (before an opening marker) or before it (after a closing one).
_OPENING = "([{«“‘¿¡"
_CLOSING = ".,;:!?)]}»”’…"


def _opens(markers: list[str], k: int) -> bool:
    """Whether emphasis marker k opens (an even count of the same marker before it) or closes."""
    return markers[:k].count(markers[k]) % 2 == 0


def read_markdown(data: bytes, filename: str, limits: LimitsConfig) -> MarkdownDocument:
    return MarkdownDocument(filename, decode_text(data, filename))
