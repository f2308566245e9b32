"""Paragraphs of HTML manuals and their translations, for the demo's paragraph data.

Debian Reference and GIMP's help are DocBook documents translated with po4a / xml2po: each language's document is
the English one with every paragraph, list item, table cell and title replaced by its translation, and then
rendered to HTML by the same stylesheets. So a page and its translation have the same blocks in the same order,
and the blocks align by position. A page whose block count differs (a translation of another version) is skipped,
not guessed at.

The same blocks with their inline markup (links, emphasis, GUI labels, inline code) give the tagged segments that
teach the demo to translate formatted words (`page_tagged_blocks`): each block goes through the server's own HTML
reader, so a training segment carries its sentinels exactly as an uploaded page's would, and the markup sentinels
are spaced as the demo's backbone sees them (`inline.space_markup`). A block pairs with its translation only when
both hold the same inline elements in the same order (tag and class), so the words between two sentinels are the
translation of the words between the same two in English.

Translators leave what they have not done yet in English, whole or in part ("Abbildung 8.41. Example for layer
mode"): a block that is the English text, or mostly English phrases copied from it, is not a translation and is
dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..text.masking import SENTINEL, WORD

#: Elements whose text is one block. A list item, definition term or table cell that holds paragraphs is not a
#: block of its own: its paragraphs are.
_BLOCKS = ("p", "li", "dt", "td", "th", "h1", "h2", "h3", "h4", "h5", "title", "caption")
_CONTAINERS = {"li", "dt", "td", "th"}
#: Blocks inside these are code or program output, which translators leave as they are.
_VERBATIM = {"pre", "script", "style", "code"}
#: A copied phrase: this many alphabetic English words in a row, found in the same order in the translation.
_COPIED_RUN = 4
_WORD = re.compile(r"[A-Za-z]+")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


@dataclass(frozen=True)
class Manual:
    """A translated HTML manual inside its Debian packages: where the English pages are and, for a language,
    where that language's page of the same name is."""

    name: str
    english: str     # glob under the unpacked root, e.g. "usr/share/debian-reference/*.en.html"
    english_suffix: str
    translated: str  # the page of the same name: "{stem}" and "{locale}" are filled in
    locales: dict[str, str]

    def pages(self, root: Path, lang: str) -> Iterator[tuple[str, Path, Path]]:
        """(page name, English page, translated page) for every English page that has a translation."""
        locale = self.locales.get(lang)
        if locale is None:
            return
        for english in sorted(root.glob(self.english)):
            stem = english.name.removesuffix(self.english_suffix)
            other = root / self.translated.format(stem=stem, locale=locale)
            if other.is_file():
                yield stem, english, other


MANUALS = (
    Manual("debian-reference", "usr/share/debian-reference/*.en.html", ".en.html",
           "usr/share/debian-reference/{stem}.{locale}.html", {"es": "es", "de": "de", "fr": "fr", "zh": "zh-cn"}),
    Manual("gimp-help", "usr/share/gimp/2.0/help/en/*.html", ".html",
           "usr/share/gimp/2.0/help/{locale}/{stem}.html", {"es": "es", "de": "de", "fr": "fr", "zh": "zh_CN"}),
)


def page_blocks(path: Path) -> list[str]:
    """The page's blocks in document order, inline markup flattened and whitespace collapsed ("" for an empty
    block: it keeps its position)."""
    return [" ".join(element.text_content().split()) for element in _block_elements(path)]


def _block_elements(path: Path) -> Iterator:
    """The page's block elements in document order (what `page_blocks` and `page_tagged_blocks` read)."""
    from lxml import html

    root = html.parse(str(path)).getroot()
    if root is None:
        return
    for element in root.iter(*_BLOCKS):
        if any(parent.tag in _VERBATIM for parent in element.iterancestors()):
            continue
        if element.tag in _CONTAINERS and any(True for _ in element.iterdescendants("p")):
            continue
        yield element


def page_tagged_blocks(path: Path) -> list[tuple[tuple[tuple[str, str], ...], str] | None]:
    """Per block of `page_blocks` (the same positions): its inline elements' (tag, class) in document order and
    its text as the HTML reader segments it, markup sentinels spaced; None for a block without a formatted word
    (an inline element, not code, around two letters or more), with other than inline elements, or that the reader
    does not give as one segment."""
    from lxml import etree

    from ..documents.encoding import decode_text
    from ..documents.htmlpage import INLINE_KEEP_TAGS, INLINE_TAGS, HtmlDocument
    from ..text.inline import space_markup

    blocks: list[tuple[tuple[tuple[str, str], ...], str] | None] = []
    for element in _block_elements(path):
        shape: list[tuple[str, str]] = []
        inline, formatted = True, False
        kept: set = set()  # inline code elements: each is one sentinel, whatever is inside
        for child in element.iterdescendants():
            if not isinstance(child.tag, str):
                continue
            if child.getparent() in kept:
                kept.add(child)
                continue
            if child.tag in INLINE_KEEP_TAGS:
                kept.add(child)
            if child.tag not in INLINE_TAGS and child.tag not in INLINE_KEEP_TAGS:
                inline = False
                break
            shape.append((child.tag, child.get("class") or ""))
            # An element whose words are language (a link, emphasis, a GUI label), not inline code.
            formatted = formatted or (child not in kept and bool(WORD.search(child.text_content())))
        if not inline or not formatted:
            blocks.append(None)
            continue
        raw = etree.tostring(element, encoding="unicode", with_tail=False).encode("utf-8")
        segments = HtmlDocument("block.html", decode_text(raw, "block.html")).segments
        blocks.append((tuple(shape), space_markup(" ".join(segments[0].split()))) if len(segments) == 1 else None)
    return blocks


def aligned_tagged_blocks(english: list, translated: list) -> Iterator[tuple[int, str, str]]:
    """(position, English, translation) of two pages' `page_tagged_blocks` whose inline elements agree and that
    hold a formatted word (`page_tagged_blocks`), with as many sentinels each; nothing when the pages' block counts
    differ. Untranslated and mostly untranslated blocks are left out."""
    if len(english) != len(translated):
        return
    for position, (en, text) in enumerate(zip(english, translated)):
        if (en is None or text is None or en[0] != text[0] or en[1] == text[1]
                or len(SENTINEL.findall(en[1])) != len(SENTINEL.findall(text[1]))):
            continue  # a translation that moved markup out of the block's edges is not the same markup
        plain_en, plain = SENTINEL.sub(" ", en[1]), SENTINEL.sub(" ", text[1])
        if not mostly_copied(plain_en, plain):
            yield position, en[1], text[1]


def mostly_copied(en: str, text: str) -> bool:
    """Whether more than half of the translation is English phrases copied from the source: runs of
    `_COPIED_RUN` or more of the source's words, in the same order. The translation is counted in its words and,
    for Chinese, its characters."""
    source = [w.lower() for w in _WORD.findall(en)]
    target = [w.lower() for w in _WORD.findall(text)]
    units = len(target) + len(_CJK.findall(text))
    if not units or len(source) < _COPIED_RUN:
        return False
    runs = {tuple(source[i:i + _COPIED_RUN]) for i in range(len(source) - _COPIED_RUN + 1)}
    copied = [False] * len(target)
    for i in range(len(target) - _COPIED_RUN + 1):
        if tuple(target[i:i + _COPIED_RUN]) in runs:
            copied[i:i + _COPIED_RUN] = [True] * _COPIED_RUN
    return sum(copied) * 2 > units


def aligned_blocks(english: list[str], translated: list[str]) -> Iterator[tuple[int, str, str]]:
    """(position, English block, translated block) of two renderings of one page; nothing when their block counts
    differ. Empty, untranslated and mostly untranslated blocks are left out."""
    if len(english) != len(translated):
        return
    for position, (en, text) in enumerate(zip(english, translated)):
        if en and text and en != text and not mostly_copied(en, text):
            yield position, en, text
