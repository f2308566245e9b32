"""What a request asks of the adapter layer: a language pair, and (from the registry) where its adapter lives."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UnsupportedLanguage
from ..text.languages import normalize_code

#: Longest pair name looked at; anything longer is refused before any parsing (hostile input).
_MAX_NAME = 24


@dataclass(frozen=True, order=True)
class Pair:
    """A translation direction. `key` ("en2es", "zh-Hant2en") is also the PEFT adapter name and the folder name."""

    src: str
    tgt: str

    @property
    def key(self) -> str:
        return f"{self.src}2{self.tgt}"

    def __str__(self) -> str:
        return self.key

    @classmethod
    def of(cls, src: str, tgt: str) -> Pair:
        """A pair from two caller-given codes, normalised (`zh-hant` → `zh-Hant`)."""
        return cls(normalize_code(src), normalize_code(tgt))

    @classmethod
    def parse(cls, name: str) -> Pair:
        """"zh-hant2EN" → Pair("zh-Hant", "en"). Pure string work; never touches the filesystem (invariant 7).

        Language codes hold no digits, so the single "2" separates them; anything else (paths, dots, extra
        separators) is refused with UnsupportedLanguage.
        """
        if not isinstance(name, str):
            raise UnsupportedLanguage("Pair name must be a string like 'en2es'.")
        shown = name[:_MAX_NAME] + ("…" if len(name) > _MAX_NAME else "")
        parts = name.strip().split("2")
        if len(name) > _MAX_NAME or len(parts) != 2 or not parts[0] or not parts[1]:
            raise UnsupportedLanguage(f"Malformed pair name {shown!r}: expected <src>2<tgt>, e.g. 'en2es'.")
        return cls(normalize_code(parts[0]), normalize_code(parts[1]))


@dataclass(frozen=True)
class AdapterRequest:
    """What a load needs. Equality and hash use the pair only: two requests for one pair are the same request."""

    pair: Pair
    path: Path = field(compare=False, hash=False)

    @property
    def key(self) -> str:
        return self.pair.key
