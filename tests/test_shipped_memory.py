"""The shipped translation memory (models/demo/memory) carries no catalogue artefacts: accelerator marks inside a
word ("Guardar co_mo", "An_wenden"), at its start ("_Save", "&Open", "~Save") or as a mnemonic suffix ("(_S)").
A word with `_`, `&` or `~` is allowed only when it is not a word of the language without it (an identifier
such as max_wal_size). And the 16 commonest UI labels come back clean in every direction from English."""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import Any

import pytest

from web_server import WEB_BACKEND

MEMORY = Path(__file__).resolve().parents[1] / "models" / "demo" / "memory"
FILES = sorted(MEMORY.glob("*.tsv.gz"))
# A word carrying one marker, at its start or between its letters: "_Save", "&Open", "co_mo", "An_wenden". It is a
# catalogue's accelerator when the word without the marker is a word of the language (wordfreq); an identifier
# such as max_wal_size or PAGE_WIDTH is not, and may stay; nor is a word right after a placeholder (⟦0⟧_check,
# "%d~messages" in the catalogue).
_MARKED = re.compile(r"(?<![\w&~*./⟧-])[^\W_]*[_&~][^\W_]+(?![\w&~*])")
_MNEMONIC = re.compile(r"[(（][_&~][A-Za-z0-9][)）]")
COMMON = ("Save as", "Apply", "Help", "Back", "Create Folder", "Open", "Close", "Cancel", "Delete", "Edit", "Print",
          "Quit", "Settings", "Undo", "Redo", "Copy")


def _marks(side: str, lang: str, other: str = "") -> list[str]:
    """The marks left in `side`. A German compound is seldom in wordfreq ("Druck_vorschau", "Ausgabes_chacht"):
    there a mark before a small letter counts too when the pair's `other` side has none (an identifier is
    copied to both sides; "ganze_Zahl" joins two words)."""
    from wordfreq import word_frequency

    found = _MNEMONIC.findall(side)
    if lang != "zh":
        for word in _MARKED.findall(side):
            joined = re.sub(r"[_&~]", "", word)
            if sum(ch.isalpha() for ch in joined) < 3 or joined.isupper():
                continue
            mark = re.search(r"[_&~]", word)
            assert mark is not None
            compound = lang == "de" and mark.group() not in other and word[mark.end()].islower() and \
                not any(ch.isdigit() for ch in word)
            if compound or word_frequency(joined.lower(), lang) >= 1e-6:
                found.append(word)
    return found


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_no_entry_carries_an_accelerator_mark(path: Path) -> None:
    src, tgt = path.name.split(".")[0].split("2")
    bad = []
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            source, _, target = line.rstrip("\n").partition("\t")
            found = _marks(source, src, target) + _marks(target, tgt, source)
            if found:
                bad.append((number, source, target, found))
    assert not bad, f"{len(bad)} entries, e.g. {bad[:5]}"


@pytest.mark.skipif(WEB_BACKEND != "demo", reason="the shipped memory belongs to the demo model")
@pytest.mark.parametrize("target", ["es", "de", "fr", "zh"])
def test_common_labels_come_back_without_a_mark(web_service: Any, target: str) -> None:
    results = web_service.translate_batch(list(COMMON), "en", target)
    marked = [(label, r.text) for label, r in zip(COMMON, results) if _marks(r.text, target) or "_" in r.text]
    assert not marked, marked
