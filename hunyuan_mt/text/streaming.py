"""A translation as it grows: what the service's `translate_stream` shows while a text's rows decode.

The engine tells a ticket's listener each row's tokens after every step (ticket.py); `TextStream` keeps the latest
ids per segment and wakes its reader, which builds the text on its own thread. What it shows is always a prefix in
reading order: the segments before the first unfinished one whole (the translation memory's at once, since they
need no model), then that one's tokens so far. A tokenizer's decoding of more tokens extends its decoding of fewer
(SentencePiece pieces append; byte-level BPE may leave a character half-written, which is held back), so each text
extends the last. A do-not-translate marker the model is still writing is held back too; complete markers show as
the text they stand for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from . import masking

#: Put where the shown text ends, so the layout's whitespace after it is cut with everything that follows.
_CUT = "\x00"


class TextStream:
    """Partial outputs of one text's last hop, fed by the engine's thread and read by one consumer."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._cv = threading.Condition()
        self._job: Any = None
        self._rows: dict[int, tuple[list[int], bool]] = {}
        self._version = 0
        self._closed = False

    def listen(self, job: Any, index: int, ids: list[int], done: bool) -> None:
        """`job`'s segment `index` has generated `ids` (finished when `done`). Index -1 announces the job: its
        memory segments can show before any row decodes. A new job (the glossary's sentinel retry) starts over."""
        with self._cv:
            if job is not self._job:
                self._job, self._rows = job, {}
            if index >= 0:
                self._rows[index] = (ids, done)
            self._version += 1
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def snapshots(self) -> Iterator[str]:
        """Each new text to show, until `close`. Waits on the engine; never busy-polls."""
        seen, shown = -1, ""
        while True:
            with self._cv:
                while self._version == seen and not self._closed:
                    self._cv.wait()
                if self._version == seen:
                    return
                seen, job, rows = self._version, self._job, dict(self._rows)
            if job is None:
                continue
            text = partial_text(job, rows, self._decode)
            if text != shown:
                shown = text
                yield text


def partial_text(job: Any, rows: dict[int, tuple[list[int], bool]], decode: Callable[[list[int]], str]) -> str:
    """The text of `job` so far: see the module docstring. `job` is the service's _Job (layout, protected
    segments, the segments the model translates, the memory's answers)."""
    todo = set(job.todo)
    texts: list[str] = []
    for i, current in enumerate(job.current):
        protected = job.protected[i] if job.protected else None
        if i not in todo:
            texts.append(job.memory[i] if i in job.memory else
                         masking.restore(current, protected) if protected is not None else current)
            continue
        ids, done = rows.get(i, ([], False))
        out = decode(ids) if ids else ""
        if done:
            texts.append(masking.restore(out, protected) if protected is not None else out)
            continue
        out = out.rstrip("\ufffd")  # a character whose bytes are not all generated yet
        texts.append((masking.restore_prefix(out, protected) if protected is not None else out) + _CUT)
        break
    texts += [""] * (len(job.current) - len(texts))
    return job.render(texts).split(_CUT, 1)[0]
