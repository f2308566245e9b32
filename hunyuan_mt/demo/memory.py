"""The demo's translation memory: the human UI translations among its training pairs, one file per direction.

Only the gettext catalogues' strings and the CLDR names go in: dictionary glosses (FreeDict, CC-CEDICT) name one
sense of a word out of several, which an exact-match answer would state with false confidence. The held-out test
strings are never in the training pairs, so the evaluation stays honest. Entries are stored masked, as trained
(`⟦0⟧` where the source had a placeholder), which the memory matches as placeholders.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from .corpus import Corpus

#: Training-pair origins that go into the memory.
MEMORY_ORIGINS = ("gettext", "babel")


def write_memory(corpus: Corpus, folder: Path) -> dict[str, int]:
    """Write `<direction>.tsv.gz` per direction into `folder`; entries per direction."""
    folder.mkdir(parents=True, exist_ok=True)
    counts = {}
    # A source's most common translation first when the corpus was just built; else the training pairs' order.
    for direction, rows in sorted((corpus.preferred or corpus.train).items()):
        chosen: dict[str, str] = {}
        for s, t, origin in rows:
            if origin in MEMORY_ORIGINS and "\t" not in s + t:
                chosen.setdefault(s, t)
        kept = sorted(chosen.items())
        # mtime=0: the same corpus gives the same bytes, so a rebuild that changed nothing changes no file.
        with open(folder / f"{direction}.tsv.gz", "wb") as raw, \
                gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as handle:
            handle.write("".join(f"{s}\t{t}\n" for s, t in kept).encode("utf-8"))
        counts[direction] = len(kept)
    return counts
