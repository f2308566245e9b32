"""SubRip subtitles (.srt): the text of each cue is translated; indices and timings are kept exactly."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

import srt

from ..config import LimitsConfig
from ..errors import InvalidInput
from .base import Document, RenderedDocument, needs_translation, output_filename
from .encoding import DecodedText, decode_text

_NOTE = "Subtitle numbers and timings are kept exactly."

_DIALOGUE = re.compile(r"^\s*(?:<[^>]+>)*\s*[-–—]")


@dataclass
class _Cue:
    """Where a cue's translated lines come from: one segment per line (dialogue) or one for the whole cue."""

    lines: list[str]
    #: Segment index per line, or a single index for the joined cue; None where a line is kept as it is.
    segments: list[int | None]
    joined: bool


def _timestamp(delta: timedelta) -> str:
    return srt.timedelta_to_srt_timestamp(delta)


def _block_number(text: str, offset: int) -> int:
    """1-based number of the blank-line-separated block that starts at or after `offset`."""
    return len([b for b in re.split(r"\n\s*\n", text[:offset]) if b.strip()]) + 1


def parse_subtitles(text: str, filename: str) -> list[srt.Subtitle]:
    """Parse with the srt library; a broken block or timing is an InvalidInput that names the block."""
    normalized = text.replace("\r\n", "\n").replace("\r", "\n")
    try:
        subtitles = list(srt.parse(normalized))
    except srt.SRTParseError as exc:
        block = _block_number(normalized, exc.expected_start)
        head = " / ".join(line.strip() for line in exc.unmatched_content.strip().splitlines()[:2])
        raise InvalidInput(f"{filename}: subtitle block {block} is not valid SRT (it reads {head[:120]!r}); each "
                           "block needs an index line, then 'HH:MM:SS,mmm --> HH:MM:SS,mmm', then its text") from None
    if not subtitles:
        raise InvalidInput(f"{filename}: no subtitles found")
    for number, sub in enumerate(subtitles, 1):
        if sub.end < sub.start:
            raise InvalidInput(f"{filename}: subtitle block {number} (index {sub.index}) ends at "
                               f"{_timestamp(sub.end)}, before it starts at {_timestamp(sub.start)}")
    return subtitles


def _rewrap(text: str, lines: int) -> str:
    """Break a translated cue back into as many lines as the original had (at most two), at the middle space."""
    if lines < 2 or " " not in text:
        return text
    middle = len(text) // 2
    spaces = [i for i, ch in enumerate(text) if ch == " "]
    cut = min(spaces, key=lambda i: abs(i - middle))
    return text[:cut] + "\n" + text[cut + 1:]


class SubtitleDocument(Document):
    kind = "srt"

    def __init__(self, filename: str, decoded: DecodedText) -> None:
        self._decoded = decoded
        self._subtitles = parse_subtitles(decoded.text, filename)
        self._eol = "\r\n" if "\r\n" in decoded.text else "\n"
        segments: list[str] = []
        self._cues: list[_Cue] = []
        for sub in self._subtitles:
            lines = sub.content.split("\n")
            if len(lines) > 1 and all(_DIALOGUE.match(line) for line in lines):
                # Two speakers in one cue: joining their lines would merge two utterances into one sentence.
                ids: list[int | None] = []
                for line in lines:
                    if needs_translation(line):
                        segments.append(line.strip())
                        ids.append(len(segments) - 1)
                    else:
                        ids.append(None)
                self._cues.append(_Cue(lines, ids, joined=False))
                continue
            joined = " ".join(line.strip() for line in lines if line.strip())
            if needs_translation(joined):
                segments.append(joined)
                self._cues.append(_Cue(lines, [len(segments) - 1], joined=True))
            else:
                self._cues.append(_Cue(lines, [None], joined=True))
        super().__init__(filename, segments)

    def _render(self, translations: list[str], target: str | None) -> RenderedDocument:
        out: list[srt.Subtitle] = []
        for sub, cue in zip(self._subtitles, self._cues):
            if cue.joined:
                index = cue.segments[0]
                content = sub.content if index is None else _rewrap(" ".join(translations[index].split()),
                                                                    len(cue.lines))
            else:
                content = "\n".join(line if index is None else " ".join(translations[index].split())
                                    for line, index in zip(cue.lines, cue.segments))
            out.append(srt.Subtitle(sub.index, sub.start, sub.end, content, sub.proprietary))
        # reindex=False: the indices are the file's own, even when they skip or start at 0.
        text = srt.compose(out, reindex=False, eol=self._eol)
        return RenderedDocument(self._decoded.encode(text), output_filename(self.filename, ".srt", target),
                                "application/x-subrip; charset=utf-8", self._decoded.note(_NOTE))


def read_subtitles(data: bytes, filename: str, limits: LimitsConfig) -> SubtitleDocument:
    return SubtitleDocument(filename, decode_text(data, filename))
