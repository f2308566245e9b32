"""Sentence splitting (pysbd) that keeps the exact layout for reassembly.

A text becomes an alternating list of *gaps* (whitespace, line and paragraph breaks, exactly as given) and
*segments* (sentences to translate). `Segmented.render(translations)` puts translations back between the original
gaps, so the output keeps the input's paragraphs and spacing. Whitespace-only input has no segments at all.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Callable

import pysbd

from .languages import ZH_GROUP

#: A sentence longer than this is cut at whitespace, so one run-on line cannot exceed the model's context.
MAX_SEGMENT_CHARS = 1000

_SEGMENTERS: dict[str, tuple[pysbd.Segmenter, threading.Lock]] = {}
_SEGMENTERS_LOCK = threading.Lock()
_LINES = re.compile(r"([^\n]*)(\n|$)")


def pysbd_language(code: str) -> str:
    """pysbd's rule set for a table code: its own where pysbd has one, zh for the Chinese group, else en."""
    if code in ZH_GROUP:
        return "zh"
    return code if code in pysbd.languages.LANGUAGE_CODES else "en"


def _segmenter(code: str) -> tuple[pysbd.Segmenter, threading.Lock]:
    lang = pysbd_language(code)
    with _SEGMENTERS_LOCK:
        entry = _SEGMENTERS.get(lang)
        if entry is None:
            # A pysbd Segmenter keeps the text being split on itself, so each one gets its own lock.
            entry = (pysbd.Segmenter(language=lang, clean=False), threading.Lock())
            _SEGMENTERS[lang] = entry
    return entry


@dataclass
class Segmented:
    """Alternating layout pieces; `is_segment[i]` says whether `parts[i]` is translated."""

    parts: list[str] = field(default_factory=list)
    is_segment: list[bool] = field(default_factory=list)

    @property
    def segments(self) -> list[str]:
        return [p for p, s in zip(self.parts, self.is_segment) if s]

    def render(self, translations: list[str], source: str | None = None, target: str | None = None) -> str:
        """The original layout with each segment replaced by its translation, in order. Given the two languages,
        the gap between two sentences of a line follows the target's habit where the source's differs: Chinese
        puts no space after "。" (en→zh gave "导出为PDF。 文件"), English needs one ("Export to PDF.The file")."""
        wanted = sum(self.is_segment)
        if len(translations) != wanted:
            raise ValueError(f"render: expected {wanted} translations, got {len(translations)}")
        respace = source is not None and target is not None and \
            (source in UNSPACED_SENTENCES) != (target in UNSPACED_SENTENCES)
        it = iter(translations)
        out: list[str] = []
        last = len(self.parts) - 1
        for i, (part, seg) in enumerate(zip(self.parts, self.is_segment)):
            if seg:
                if respace and i > 0 and self.is_segment[i - 1]:  # "。" then the next sentence, no gap between
                    out.append(_sentence_gap("", out[-1], str(target)))
                out.append(next(it))
            elif respace and 0 < i < last and self.is_segment[i - 1] and self.is_segment[i + 1] and \
                    not part.strip():
                out.append(_sentence_gap(part, out[-1], str(target)))
            else:
                out.append(part)
        return "".join(out)

    def _gap(self, text: str) -> None:
        if not text:
            return
        if self.parts and not self.is_segment[-1]:
            self.parts[-1] += text
        else:
            self.parts.append(text)
            self.is_segment.append(False)

    def _segment(self, text: str) -> None:
        self.parts.append(text)
        self.is_segment.append(True)


#: Languages whose sentences follow each other with no space between them.
UNSPACED_SENTENCES = frozenset({"zh", "zh-Hant", "yue", "ja"})
_SENTENCE_END = re.compile(r"[.!?;:…。！？；：]['\"”’)\]）」』]*$")


def _sentence_gap(gap: str, before: str, target: str) -> str:
    """The blank between two sentences of one line, in the target's habit (`Segmented.render`)."""
    if "\n" in gap:
        return gap
    if target in UNSPACED_SENTENCES:
        return ""
    return gap or (" " if _SENTENCE_END.search(before) else "")


# A sentence end followed by more text somewhere in the line; without one the line is a single sentence and
# pysbd (about a millisecond per call) is skipped.
_INNER_END = re.compile(r"[.!?;:…。！？；]['\"”’)\]]*\s*[^\s.!?;:…。！？；]")


# A dot that starts a word (".lzma", ".netrc", "./configure" after a space) is never a sentence end; pysbd
# splits there. It is hidden from pysbd (same length, so the offsets hold) and the pieces are cut from the line.
_WORD_DOT = re.compile(r"(?:(?<=\s)|(?<=^)|(?<=[(\[\"'“‘]))\.(?=[\w/])")
# A piece with fewer letters than this ("OK.", "y/N?"), or one in brackets ("(y/N)", "[Y/n]"), is too short to
# translate alone: it goes with the sentence before it (or after it, at the start of a line).
_MIN_LETTERS = 3
_LETTERS = re.compile(r"[^\W\d_]")
_BRACKETED = re.compile(r"^[(\[][^()\[\]]*[)\]][.!?:]?$")


def _too_short(piece: str) -> bool:
    return len(_LETTERS.findall(piece)) < _MIN_LETTERS or bool(_BRACKETED.match(piece))


def _merge_short(located: list[tuple[int, int]], body: str) -> list[tuple[int, int]]:
    """Join each piece too short to translate alone to its neighbour (the one before, else the one after)."""
    out: list[tuple[int, int]] = []
    carry: int | None = None  # start of a short piece at the front, waiting for the next one
    for a, b in located:
        if carry is not None:
            a, carry = carry, None
        if _too_short(body[a:b]):
            if out:
                out[-1] = (out[-1][0], b)
                continue
            if len(located) > 1:
                carry = a
                continue
        out.append((a, b))
    if carry is not None:  # only short pieces: keep what there is
        out.append((carry, located[-1][1]))
    return out


def _sentences(line: str, code: str) -> list[str]:
    if not _INNER_END.search(line):
        return [line]
    segmenter, lock = _segmenter(code)
    with lock:
        found = segmenter.segment(line)
    return [s.strip() for s in found if s.strip()]


def _cut_long(sentence: str, limit: int, fits: Callable[[str], bool] | None = None) -> list[str]:
    """Cut an over-long sentence at the last whitespace before `limit` (or hard at `limit` without any), then each
    piece the model cannot take (`fits` false) at its best boundary (see `_fit`)."""
    out: list[str] = []
    rest = sentence
    while len(rest) > limit:
        cut = rest.rfind(" ", 0, limit)
        cut = cut if cut > 0 else limit
        out.append(rest[:cut])
        rest = rest[cut:]
    out.append(rest)
    if fits is None:
        return out
    return [piece for part in out for piece in _fit(part, fits)]


# Where a sentence that is too long for the model is best cut, best first: after a clause, after a comma, at a
# space. Each cut is the boundary of that kind nearest the middle, so the halves are even.
_BOUNDARIES = (re.compile(r"[;:]\s+"), re.compile(r",\s*"), re.compile(r"\s+"))


def _fit(part: str, fits: Callable[[str], bool]) -> list[str]:
    """`part` cut until every piece fits. A piece with no boundary left (a checksum, a base64 key) comes back as
    it is: the caller passes it through untranslated."""
    if fits(part.strip()):
        return [part]
    for boundary in _BOUNDARIES:
        cuts = [m.end() for m in boundary.finditer(part.strip()) if 0 < m.end() < len(part.strip())]
        if cuts:
            offset = len(part) - len(part.lstrip())
            middle = len(part) / 2
            cut = offset + min(cuts, key=lambda c: abs(offset + c - middle))
            return _fit(part[:cut], fits) + _fit(part[cut:], fits)
    return [part]


def split_text(text: str, lang: str, *, sentences: bool = True, max_segment_chars: int = MAX_SEGMENT_CHARS,
               fits: Callable[[str], bool] | None = None) -> Segmented:
    """Split `text` into segments and the whitespace between them. `sentences=False` keeps one segment per line.
    `fits(segment)` says whether the model can take a segment; one it cannot is cut further (see `_fit`)."""
    out = Segmented()
    for match in _LINES.finditer(text):
        line, newline = match.group(1), match.group(2)
        if not line and not newline:
            continue
        body = line.strip()
        if not body:
            out._gap(line + newline)
            continue
        start = line.index(body)
        out._gap(line[:start])
        guarded = _WORD_DOT.sub("_", body)  # same length: offsets in it are offsets in body
        pieces = _sentences(guarded, lang) if sentences else [guarded]
        cursor = 0
        located: list[tuple[int, int]] = []
        for piece in pieces:
            pos = guarded.find(piece, cursor)
            if pos < 0:  # pysbd changed the text (rare); keep the line whole rather than lose characters
                located = [(0, len(body))]
                break
            located.append((pos, pos + len(piece)))
            cursor = pos + len(piece)
        if len(located) > 1:
            located = _merge_short(located, body)
        prev = 0
        for i, (a, b) in enumerate(located):
            out._gap(body[prev:a])
            end = len(body) if i == len(located) - 1 else b  # trailing characters pysbd dropped stay with the last
            chunk = body[a:end]
            for part in _cut_long(chunk, max_segment_chars, fits):
                core = part.strip()
                if not core:
                    out._gap(part)
                    continue
                lead = part.index(core)
                out._gap(part[:lead])
                out._segment(core)
                out._gap(part[lead + len(core):])
            prev = end
        out._gap(line[start + len(body):] + newline)
    return out


def join(segmented: Segmented, translations: list[str]) -> str:
    return segmented.render(translations)
