"""Paragraphs of Mallard help pages (GNOME's help format), for the demo's paragraph data.

GNOME's help is translated with itstool: each language's page is the English page with every translatable block
replaced by its translation, so a page and its translation have the same blocks in the same order, and paragraphs
align by position. A page whose block count differs (an out-of-date translation) is skipped, not guessed at.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

MALLARD = "{http://projectmallard.org/1.0/}"
#: Elements whose text is one translation unit. `p` inside an `item` or a table cell is still one block.
_BLOCKS = {"title", "subtitle", "desc", "p"}
#: `info` holds credits, licences and links; only its `desc` (a page summary) is translated prose.
_SKIP = {"credit", "license", "revision", "link", "include", "media", "code", "screen", "comment", "figure"}
#: Inline groups whose children are typed apart: keyseq → "Ctrl+C", guiseq → "Settings ▸ Privacy".
_JOINERS = {"keyseq": "+", "guiseq": " ▸ "}


def _inline(element: ET.Element) -> str | None:
    """The visible text of a block with its inline markup flattened; None when part of it is filled in at render
    time (a link without text shows the title of the page it points to, which this reader does not have)."""
    name = element.tag.removeprefix(MALLARD)
    if name == "link" and not "".join(element.itertext()).strip():
        return None
    if name in _JOINERS:
        parts = [_inline(child) for child in element]
        if any(part is None for part in parts):
            return None
        return _JOINERS[name].join(part.strip() for part in parts if part)
    pieces = [element.text or ""]
    # ElementTree's parser drops XML comments and processing instructions: every child is an element. Mallard's
    # own <comment> (an editor's note) and <media> are not part of the text; their tails are.
    for child in element:
        if child.tag.removeprefix(MALLARD) not in ("comment", "media"):
            text = _inline(child)
            if text is None:
                return None
            pieces.append(text)
        pieces.append(child.tail or "")
    return "".join(pieces)


def page_blocks(path: Path) -> list[str | None]:
    """The page's translatable blocks in document order, whitespace collapsed; None for a block that cannot be
    read as plain text (it keeps its position, so the alignment with the translation holds)."""
    root = ET.parse(path).getroot()
    blocks: list[str | None] = []

    def walk(element: ET.Element, in_info: bool) -> None:
        name = element.tag.removeprefix(MALLARD)
        if name in _SKIP or not element.tag.startswith(MALLARD):
            return
        if name in _BLOCKS and (not in_info or name == "desc"):
            text = _inline(element)
            blocks.append(None if text is None else re.sub(r"\s+", " ", text).strip() or None)
            return
        for child in element:
            walk(child, in_info or name == "info")

    walk(root, False)
    return blocks


def aligned_paragraphs(english: Path, translated: Path) -> list[tuple[int, str, str]]:
    """(position, English, translation) for every block both pages have as text; [] when the pages do not have
    the same number of blocks, or a page is not well-formed XML."""
    try:
        en_blocks, other_blocks = page_blocks(english), page_blocks(translated)
    except ET.ParseError:
        return []
    if len(en_blocks) != len(other_blocks):
        return []
    return [(i, en, text) for i, (en, text) in enumerate(zip(en_blocks, other_blocks)) if en and text]


__all__ = ["page_blocks", "aligned_paragraphs"]
