"""Paragraphs of manual pages and their translations, for the demo's paragraph data.

Debian's translated manual pages (`manpages-es`, `-de`, `-fr` from manpages-l10n, `manpages-zh`) are made with
po4a: the English page with each paragraph replaced by its translation, plus a closing section that credits the
translators. groff, the format's own formatter, renders both; with a line length no paragraph reaches, every
paragraph is one line, so the two renderings align section by section and line by line. Where a translation was
made from another version of the English page the counts differ, and the section (or the page) is skipped, not
guessed at. An option list is a cheap check on the rest: a line that starts with an option (`-a`, `--all`) must
start with the same option in the translation.
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

#: groff: man macros, UTF-8 output from UTF-8 input (-k), no hyphenation, a line length no paragraph reaches, and
#: grotty without bold, underline or overstrike sequences.
GROFF = ("groff", "-k", "-Tutf8", "-man", "-rLL=20000n", "-rHY=0", "-P-cbou")
#: An option tag and its text on one line ("-f     list all entries"): the tag is kept apart.
_TAGGED = re.compile(r"(\S(?:.*?\S)?)\s{2,}(\S.*)")
_OPTION = re.compile(r"-{1,2}[A-Za-z0-9]")

Section = tuple[str, list[str]]


def available() -> bool:
    return shutil.which(GROFF[0]) is not None


def render(page: Path, man_root: Path, timeout: float = 30.0) -> list[Section]:
    """A page's sections as (heading, lines) after groff; the running header and footer are dropped. `man_root`
    is where `.so` includes (one page pointing at another) are resolved."""
    raw = gzip.decompress(page.read_bytes()) if page.suffix == ".gz" else page.read_bytes()
    try:
        done = subprocess.run(GROFF, input=raw, capture_output=True, cwd=man_root, timeout=timeout)
    except subprocess.TimeoutExpired:
        return []
    lines = [line.rstrip() for line in done.stdout.decode("utf-8", "replace").splitlines() if line.strip()]
    sections: list[Section] = []
    for line in lines[1:-1]:
        if not line.startswith(" "):
            sections.append((line, []))
        elif sections:
            sections[-1][1].append(line.strip())      # inner runs of spaces still set a tag apart
    return sections


def _untagged(en: str, text: str) -> tuple[str, str] | None:
    """The pair without an option tag both lines start with; None when the English line starts with an option
    the translation does not (the section is out of step)."""
    en_match, text_match = _TAGGED.fullmatch(en), _TAGGED.fullmatch(text)
    if en_match and text_match and en_match.group(1) == text_match.group(1):
        en, text = en_match.group(2), text_match.group(2)
    elif _OPTION.match(en) and en.split()[0] != text.split()[0]:
        return None
    return " ".join(en.split()), " ".join(text.split())


def aligned_lines(english: list[Section], translated: list[Section]) -> Iterator[tuple[int, str, str]]:
    """(position, English line, translated line) for every section whose line counts agree. The translation's
    extra closing section (its translators) is ignored; any other difference in the section count skips the page."""
    if len(translated) == len(english) + 1:
        translated = translated[:-1]
    if len(translated) != len(english):
        return
    position = 0
    for (_, en_lines), (_, lines) in zip(english, translated):
        pairs = [_untagged(en, text) for en, text in zip(en_lines, lines)] if len(en_lines) == len(lines) else [None]
        if all(pair is not None for pair in pairs):
            for en, text in pairs:
                yield position, en, text
                position += 1
        else:
            position += len(en_lines)


def translated_pages(man_root: Path, locale: str) -> Iterator[tuple[Path, Path]]:
    """(English page, translated page) for every translated page whose English page is present; links (another
    name for a page) are skipped: the page they point at is read under its own name."""
    for page in sorted((man_root / locale).glob("man*/*")):
        english = man_root / page.relative_to(man_root / locale)
        if not page.is_symlink() and english.is_file() and not english.is_symlink():
            yield english, page
