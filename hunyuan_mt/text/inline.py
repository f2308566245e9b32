"""How a backbone sees a document's inline markup: the sentinels a reader put where a tag or a formatting run
begins or ends (`Click ⟦0⟧here⟦1⟧ to change`), as opposed to the sentinels of protected spans (`%s`, a URL, a
number), which the model must copy.

Three forms, chosen per backbone (`model.markup`):

- "sentinels": the segment as the reader wrote it. Any backbone; what a model without markup training gets.
- "spaced": the demo's. A formatted word glued to its sentinels loses its word-start mark in the tokenizer
  (`⟦0⟧here⟦1⟧` → `⟦0⟧ her e ⟦1⟧`, where the word alone is `▁her e`), and in the demo's first training data text
  glued to a sentinel was nearly always code, which it copies (BENCHMARKS.md; bench/inline_markup.py). So the model sees markup
  sentinels set apart from the words beside them, as it is trained on tagged segments of the HTML manuals
  (`demo/manuals.py`), and the source's own spacing around each is put back afterwards. Protected spans stay
  glued (`0x⟦1⟧`): the spacing is what tells the two kinds apart.
- "tags": the HY-MT1.5 card's formatted translation (Tencent-Hunyuan/HY-MT README, "Prompt Template for formatted
  translation"; technical report, Table 3): the text between markup sentinels goes as numbered pairs
  `<s1>…</s1><s2>…</s2>` and the answer comes back inside `<target>…</target>`. `prompts.build` gives such a row
  the card's template.

Either way the caller gets the reader's sentinels back in the reader's places, or a text that
`masking.split_at_sentinels` refuses; the document layer then places the markup in the whole sentence's
translation without it (`documents/alignment.py`), and uses what came back in order as a hint.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from .masking import MARKUP_TAG, SENTINEL, sentinel

FORMS = ("sentinels", "spaced", "tags")

_CJK = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef]")
_TAG = re.compile(r"<(/?)s(\d+)>")
_MARKUP_TAG = re.compile(MARKUP_TAG)
_TARGET = re.compile(r"^\s*<target>(.*?)(?:</target>\s*)?$", re.S)


def markup_indices(spans: list[str]) -> tuple[int, ...]:
    """Which sentinels of a masked segment stand for inline markup: those whose span is itself a sentinel (the
    masking takes a document reader's `⟦n⟧` as a span like any other) or a tag (`<b>`, `</a>` in a text sent
    with format=html)."""
    return tuple(i for i, span in enumerate(spans) if SENTINEL.fullmatch(span) or _MARKUP_TAG.fullmatch(span))


def _word(ch: str) -> bool:
    return ch.isalnum()


def space_markup(text: str, markup: Collection[int] | None = None) -> str:
    """`text` with a space between each markup sentinel (all of them when `markup` is None) and a letter or
    digit touching it. Punctuation stays where it is (`«⟦0⟧»`), and so do protected spans."""
    out: list[str] = []
    pos = 0
    for match in SENTINEL.finditer(text):
        if markup is not None and int(match.group(1)) not in markup:
            continue
        before = text[pos:match.start()]
        if before and _word(before[-1]):
            before += " "
        out.append(before)
        out.append(match.group(0))
        pos = match.end()
        if pos < len(text) and _word(text[pos]):
            out.append(" ")
    out.append(text[pos:])
    return "".join(out)


def unspace_markup(translated: str, source: str, markup: Collection[int]) -> str:
    """The model's `translated` with the source's spacing around each markup sentinel: where the source had no
    space on a side, none is left there; where it had one, there is one between the sentinel and a word, except
    beside Chinese or Japanese text, which has none between words."""
    glued: dict[int, tuple[bool | None, bool | None]] = {}
    for match in SENTINEL.finditer(source):
        index = int(match.group(1))
        if index in markup:
            start, end = match.start(), match.end()
            glued[index] = (_glued(source[max(start - 1, 0):start]), _glued(source[end:end + 1]))
    if not glued:
        return translated

    def fix(match: re.Match[str]) -> str:
        index = int(match.group(2))
        if index not in glued:
            return match.group(0)
        left, right = glued[index]
        start, end = match.start(), match.end()
        return (_side(match.group(1), left, translated[max(start - 1, 0):start]) + f"⟦{index}⟧"
                + _side(match.group(3), right, translated[end:end + 1]))

    return re.sub(r"([ \t]*)⟦(\d+)⟧([ \t]*)", fix, translated)


def _glued(neighbour: str) -> bool | None:
    """Whether the source glues a sentinel to this neighbouring character ("" at an end: glued), or None where it
    says nothing: beside Chinese or Japanese text, which glues everything."""
    if not neighbour:
        return True
    if _CJK.match(neighbour):
        return None
    return not neighbour.isspace()


def _side(space: str, glued: bool | None, neighbour: str) -> str:
    """The whitespace to keep on one side of a markup sentinel in the output, `space` being the model's."""
    if glued or (neighbour and _CJK.match(neighbour)):
        return ""
    if glued is False and not space and neighbour and _word(neighbour):
        return " "
    return space


def to_tags(text: str, markup: Collection[int]) -> str:
    """The card's formatted form: the pieces between markup sentinels as `<s1>…</s1><s2>…</s2>…`, every piece in
    a pair of its own (empty ones too, so the count tells where each boundary was). Protected spans stay
    sentinels inside the pieces."""
    pieces = _pieces(text, markup)
    return "".join(f"<s{n}>{piece}</s{n}>" for n, piece in enumerate(pieces, start=1))


def from_tags(output: str, text: str, markup: Collection[int]) -> str:
    """The model's answer to a `to_tags` prompt back in sentinel form: `<target>` taken off, each `<sN>` pair's
    text in order with the markup sentinels of `text` between them. When the pairs did not all come back once and
    in order, the answer's text without its tags (the markup sentinels are missing, so the document layer places
    them itself, `documents/alignment.py`)."""
    match = _TARGET.match(output)
    body = match.group(1) if match else output
    boundaries = [int(m.group(1)) for m in SENTINEL.finditer(text) if int(m.group(1)) in markup]
    found = list(_TAG.finditer(body))
    wanted = [(close, str(n)) for n in range(1, len(boundaries) + 2) for close in ("", "/")]
    if [(m.group(1), m.group(2)) for m in found] != wanted:
        return _TAG.sub("", body).strip()
    pieces = [body[found[2 * k].end():found[2 * k + 1].start()] for k in range(len(boundaries) + 1)]
    out = [pieces[0]]
    for index, piece in zip(boundaries, pieces[1:]):
        out += [sentinel(index), piece]
    return "".join(out)


def to_model(text: str, markup: Collection[int], form: str) -> str:
    """`text` (a masked segment) as a backbone of `form` is shown it."""
    if not markup or form == "sentinels":
        return text
    if form == "spaced":
        return space_markup(text, markup)
    if form == "tags":
        return to_tags(text, markup)
    raise ValueError(f"markup form {form!r}: one of {', '.join(FORMS)}")


def from_model(output: str, text: str, markup: Collection[int], form: str) -> str:
    """The model's `output` for `text` shown in `form`, back in the reader's sentinel form."""
    if not markup or form == "sentinels":
        return output
    if form == "spaced":
        return unspace_markup(output, text, markup)
    if form == "tags":
        return from_tags(output, text, markup)
    raise ValueError(f"markup form {form!r}: one of {', '.join(FORMS)}")


def _pieces(text: str, markup: Collection[int]) -> list[str]:
    pieces: list[str] = []
    pos = 0
    for match in SENTINEL.finditer(text):
        if int(match.group(1)) in markup:
            pieces.append(text[pos:match.start()])
            pos = match.end()
    pieces.append(text[pos:])
    return pieces
