"""Paragraphs of HTML manuals and their translations, for the demo's paragraph data.

Debian Reference and GIMP's help are DocBook documents translated with po4a / xml2po: each language's document is
the English one with every paragraph, list item, table cell and title replaced by its translation, and then
rendered to HTML by the same stylesheets. So a page and its translation have the same blocks in the same order,
and the blocks align by position. A page whose block count differs (a translation of another version) is skipped,
not guessed at.

Translators leave what they have not done yet in English, whole or in part ("Abbildung 8.41. Example for layer
mode"): a block that is the English text, or mostly English phrases copied from it, is not a translation and is
dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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
    from lxml import html

    root = html.parse(str(path)).getroot()
    if root is None:
        return []
    blocks: list[str] = []
    for element in root.iter(*_BLOCKS):
        if any(parent.tag in _VERBATIM for parent in element.iterancestors()):
            continue
        if element.tag in _CONTAINERS and any(True for _ in element.iterdescendants("p")):
            continue
        blocks.append(" ".join(element.text_content().split()))
    return blocks


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
