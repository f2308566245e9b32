"""Formatted runs inside one paragraph, for the XML office formats (docx, pptx, xlsx rich text, OpenDocument).

A paragraph's text sits in several places of its XML tree, one per formatting run. The translator sees the
paragraph as one segment with a masking sentinel wherever the look changes (`Sales grew ⟦0⟧much faster⟦1⟧ than
planned.`), so a model that copies sentinels says itself where the bold words went. When the sentinels do not come
back complete and in order, the text is spread over the runs in proportion to their original lengths, cut at the
nearest word boundary. Each format says where its text lives (a `TextSlot`) and what counts as the same look.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from lxml import etree

from ..text import masking


@dataclass(eq=False)
class TextSlot:
    """Where a piece of text lives: an element's `.text` (`w:t`, `a:t`) or, in mixed content (OpenDocument), its
    `.tail`."""

    element: etree._Element
    tail: bool = False

    def get(self) -> str:
        return (self.element.tail if self.tail else self.element.text) or ""

    def set(self, text: str) -> None:
        if self.tail:
            self.element.tail = text
        else:
            self.element.text = text


#: How a format writes text into a slot (docx marks `xml:space="preserve"` when the text has outer spaces).
SetText = Callable[[TextSlot, str], None]


def _plain_set(slot: TextSlot, text: str) -> None:
    slot.set(text)


@dataclass
class RunChunk:
    """The text between two boundaries (tabs, line breaks) of one paragraph, its slots grouped by look."""

    set_text: SetText = _plain_set
    groups: list[list[TextSlot]] = field(default_factory=list)
    #: Per group: the slots' container element (held, so lxml keeps returning the same proxy) and their look.
    keys: list[tuple[object, object]] = field(default_factory=list)

    def add(self, slot: TextSlot, container: object, look: object) -> None:
        """Append a slot. Same container (paragraph, hyperlink, span) and same look: text may move freely between
        these slots, so they are one group."""
        if self.keys and self.keys[-1][0] is container and self.keys[-1][1] == look:
            self.groups[-1].append(slot)
        else:
            self.groups.append([slot])
            self.keys.append((container, look))

    @property
    def texts(self) -> list[str]:
        return ["".join(slot.get() for slot in group) for group in self.groups]

    def text(self) -> str:
        return "".join(self.texts)

    def segment(self) -> str:
        """The chunk's text with a sentinel where the formatting changes: `Sales grew ⟦0⟧much faster⟦1⟧ than…`."""
        pieces: list[str] = []
        for text in self.texts:
            if text:
                if pieces:
                    pieces.append(masking.sentinel(len(pieces) // 2))
                pieces.append(text)
        return " ".join("".join(pieces).split())

    def fill(self, translation: str) -> None:
        """Put a translation back into the slots: at the sentinels when they came back complete and in order,
        otherwise in proportion to the original lengths. The chunk's outer whitespace is kept."""
        texts = self.texts
        filled = [i for i, text in enumerate(texts) if text]
        whole = "".join(texts)
        lead = whole[:len(whole) - len(whole.lstrip())]
        trail = whole[len(whole.rstrip()):]
        pieces = masking.split_at_sentinels(translation, len(filled) - 1)
        if pieces is None:
            plain = re.sub(r"[ \t]{2,}", " ", masking.SENTINEL.sub("", translation)).strip()
            pieces = distribute([texts[i] for i in filled], lead + plain + trail)
        else:
            pieces[0] = lead + pieces[0]
            pieces[-1] = pieces[-1] + trail
        new_texts = [""] * len(texts)
        for i, piece in zip(filled, pieces):
            new_texts[i] = piece
        for group, text in zip(self.groups, new_texts):
            self.set_text(group[0], text)
            for slot in group[1:]:
                self.set_text(slot, "")


def _is_word_boundary(text: str, pos: int) -> bool:
    return pos <= 0 or pos >= len(text) or text[pos - 1].isspace() or text[pos].isspace()


def _snap(text: str, pos: int, space_left: bool, space_right: bool, window: int) -> int:
    """The cut nearest `pos` that keeps a space on the side where the original had it."""
    def ok(q: int) -> bool:
        if q <= 0 or q >= len(text):
            return True
        if space_left:
            return text[q - 1].isspace()
        if space_right:
            return text[q].isspace()
        return _is_word_boundary(text, q)

    for delta in range(window + 1):
        for q in (pos - delta, pos + delta):
            if 0 <= q <= len(text) and ok(q):
                return q
    return pos


def distribute(original: list[str], new_text: str) -> list[str]:
    """Split `new_text` over the groups in proportion to the `original` group lengths.

    A cut that fell between words in the original is moved to the nearest space of the new text, on the same side
    of the space; a cut inside a word (or a language without spaces) stays proportional.
    """
    if len(original) <= 1:
        return [new_text]
    total = sum(len(t) for t in original) or 1
    whole = "".join(original)
    window = max(4, len(new_text) // (2 * len(original)))
    cuts: list[int] = []
    done = 0
    for text in original[:-1]:
        done += len(text)
        pos = round(len(new_text) * done / total)
        if _is_word_boundary(whole, done):
            pos = _snap(new_text, pos, whole[done - 1].isspace(), whole[done:done + 1].isspace(), window)
        cuts.append(max(pos, cuts[-1] if cuts else 0))
    bounds = [0, *cuts, len(new_text)]
    return [new_text[a:b] for a, b in zip(bounds, bounds[1:])]


def one_line(translation: str) -> str:
    """A translation put back between two breaks: a line break inside a run would not show as one anyway."""
    return re.sub(r"\s*[\r\n]+\s*", " ", translation)
