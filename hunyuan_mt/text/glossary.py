"""Glossaries: per-pair term lists (`source term → target term`) enforced on the way through.

A term found in the source (whole words, any case) is protected like a do-not-translate span: the model sees a
sentinel, and `masking.restore` puts the target term in its place, so the term comes out exactly as the glossary
says, whatever the model would have made of it. DeepL's glossaries are the anchor (one list per language pair,
inline or stored by id); LibreTranslate has none.

- inline: `{"Save": "Guardar"}`, `[["Save", "Guardar"]]`, or text with one term per line as `Save = Guardar`,
  `Save<TAB>Guardar` or `Save → Guardar` (blank lines and `#` comments ignored);
- stored: `<glossary.dir>/<id>.<src>2<tgt>.tsv`, one `source<TAB>target` per line, named by its id.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInput
from .languages import normalize_code
from .masking import Protected, sentinel

if TYPE_CHECKING:
    from ..store import GlossaryRows

#: Longest term accepted, in characters (either side).
MAX_TERM_CHARS = 200
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_LINE = re.compile(r"^(.+?)\s*(?:\t|=|→|->)\s*(.+)$")
_SENTINEL_SPLIT = re.compile(r"(⟦\d+⟧)")


@dataclass(frozen=True)
class Glossary:
    """Terms of one list, longest source first (so "Save as" wins over "Save"). Picklable: it travels to Ray
    replicas as it is."""

    terms: tuple[tuple[str, str], ...]
    name: str = "inline"

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.terms, key=lambda t: (-len(t[0]), t[0].casefold())))
        object.__setattr__(self, "terms", ordered)
        object.__setattr__(self, "_pattern", _pattern([s for s, _ in ordered]) if ordered else None)
        # A match, case-folded → its term: built once here, not on every text `apply` sees.
        object.__setattr__(self, "_by_key", {s.casefold(): (s, t) for s, t in ordered})

    def __len__(self) -> int:
        return len(self.terms)

    def apply(self, masked: Protected, visible: bool = False) -> Protected:
        """`masked` with every term occurrence outside its sentinels turned into one more sentinel that restores
        as the target term ("SAVE" → "GUARDAR", "Save" at a sentence start → "Guardar" for a term "save").
        `visible` writes the target term itself in its place instead: the model sees it and can make the words
        around it agree ("Save the archivo" → "Guardar el archivo", where a sentinel gave "Guardar la archivo");
        the caller checks the output with `targets` and falls back to sentinels where the term did not survive."""
        pattern: re.Pattern[str] | None = getattr(self, "_pattern")
        if pattern is None:
            return masked
        by_key: dict[str, tuple[str, str]] = getattr(self, "_by_key")
        spans = list(masked.spans)
        out: list[str] = []
        for part in _SENTINEL_SPLIT.split(masked.text):
            if _SENTINEL_SPLIT.fullmatch(part):
                out.append(part)
                continue

            def swap(match: re.Match[str]) -> str:
                term = _same_case(match.group(0), *by_key[match.group(0).casefold()])
                if visible:
                    return term
                spans.append(term)
                return sentinel(len(spans) - 1)

            out.append(pattern.sub(swap, part))
        return Protected("".join(out), spans)

    def _found(self, masked: Protected) -> list[tuple[str, str]]:
        """(source term, target term) of every occurrence of a term in `masked` (outside its sentinels), in order."""
        pattern: re.Pattern[str] | None = getattr(self, "_pattern")
        if pattern is None:
            return []
        by_key: dict[str, tuple[str, str]] = getattr(self, "_by_key")
        return [by_key[m.group(0).casefold()] for part in _SENTINEL_SPLIT.split(masked.text)
                if not _SENTINEL_SPLIT.fullmatch(part) for m in pattern.finditer(part)]

    def pairs(self, masked: Protected) -> tuple[tuple[str, str], ...]:
        """Each term found in `masked`, once, in order of first occurrence: what a terminology prompt lists."""
        return tuple(dict.fromkeys(self._found(masked)))

    def targets(self, masked: Protected) -> list[str]:
        """The target term of every occurrence of a term in `masked` (outside its sentinels), in order."""
        return [target for _, target in self._found(masked)]


def has_terms(text: str, targets: list[str]) -> bool:
    """Whether `text` holds each of `targets` as often as listed (any case)."""
    folded = text.casefold()
    need: dict[str, int] = {}
    for term in targets:
        need[term.casefold()] = need.get(term.casefold(), 0) + 1
    return all(folded.count(term) >= count for term, count in need.items())


def _pattern(sources: list[str]) -> re.Pattern[str]:
    # Whole words for terms that start or end with a word character; CJK text has no spaces to bound a word, so
    # a term of CJK characters matches anywhere.
    parts = []
    for term in sources:
        body = re.escape(term)
        if term[0].isalnum() and not _cjk(term[0]):
            body = r"(?<!\w)" + body
        if term[-1].isalnum() and not _cjk(term[-1]):
            body = body + r"(?!\w)"
        parts.append(body)
    return re.compile("|".join(parts), re.IGNORECASE)


def _cjk(ch: str) -> bool:
    return "\u2e80" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af" or "\uf900" <= ch <= "\ufaff"


def _same_case(found: str, source: str, target: str) -> str:
    """The target term in the case the text used the source term: in capitals when it was written in capitals;
    capitalised when the text capitalised it (a sentence start); lower-cased when the text did not capitalise a
    term that the glossary wrote capitalised on both sides (a label: "Save → Guardar"). A capital the target has
    on its own (German nouns: "file → Datei") stays."""
    if len(found) > 1 and found.isupper() and not target.isupper():
        return target.upper()
    if found[:1].isupper() and target[:1].islower():
        return target[0].upper() + target[1:]
    if found[:1].islower() and source[:1].isupper() and target[:1].isupper() and not target[1:2].isupper():
        return target[0].lower() + target[1:]
    return target


def parse_terms(value: Any, max_terms: int, name: str = "inline") -> Glossary:
    """An inline glossary from a mapping, a list of [source, target] pairs, or text (one term per line)."""
    pairs: list[tuple[Any, Any]] = []
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, list):
        for item in value:
            if not (isinstance(item, (list, tuple)) and len(item) == 2):
                raise InvalidInput("Invalid glossary: a list must hold [source term, target term] pairs.")
            pairs.append((item[0], item[1]))
    elif isinstance(value, str):
        for number, line in enumerate(value.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            match = _LINE.match(line)
            if match is None:
                raise InvalidInput(f"Invalid glossary: line {number} ({line[:40]!r}) is not 'source = target' "
                                   "(or source<TAB>target).")
            pairs.append((match.group(1), match.group(2)))
    else:
        raise InvalidInput("Invalid glossary: give terms (an object, a list of pairs or lines) or a stored id.")
    terms: dict[str, tuple[str, str]] = {}
    for source, target in pairs:
        if not (isinstance(source, str) and isinstance(target, str)) or not source.strip() or not target.strip():
            raise InvalidInput("Invalid glossary: every term needs a non-empty source and target.")
        source, target = source.strip(), target.strip()
        if max(len(source), len(target)) > MAX_TERM_CHARS:
            raise InvalidInput(f"Invalid glossary: the term {source[:30]!r} is longer than {MAX_TERM_CHARS} "
                               "characters.")
        terms[source.casefold()] = (source, target)  # the last definition of a term wins
    if not terms:
        raise InvalidInput("Invalid glossary: it has no terms.")
    if len(terms) > max_terms:
        raise InvalidInput(f"Invalid glossary: {len(terms)} terms, over the limit of {max_terms} (glossary.max_terms).")
    return Glossary(tuple(terms.values()), name)


class GlossaryStore:
    """Stored glossaries, in the store's database (`GlossaryRows`). The files `<folder>/<id>.<src>2<tgt>.tsv` are
    imported into it once per version: a file edited since counts at its next use. Lists stored over the admin API
    (`put`) live in the database only. Parsed lists are cached by when they were stored."""

    def __init__(self, folder: Path, max_terms: int, rows: GlossaryRows) -> None:
        self.folder = folder
        self.max_terms = max_terms
        self.rows = rows
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], tuple[float, Glossary]] = {}

    def _import(self, path: Path) -> None:
        """A glossary file into the store when it is new or changed since it was imported."""
        stem, _, pair = path.name[:-4].rpartition(".")
        if not (stem and _ID.match(stem) and "2" in pair) or self.rows.imports.done(path):
            return
        glossary = parse_terms(path.read_text(encoding="utf-8"), self.max_terms, f"{stem}.{pair}")
        self.rows.put(stem, pair, list(glossary.terms), "file")
        self.rows.imports.mark(path)

    def _import_folder(self) -> None:
        for path in sorted(self.folder.glob("*.tsv")) if self.folder.is_dir() else []:
            self._import(path)

    def available(self) -> dict[str, list[str]]:
        """id → the pairs it has, e.g. {"ui-terms": ["en2es", "en2de"]}."""
        self._import_folder()
        return self.rows.available()

    def put(self, glossary_id: str, pair: str, value: Any, who: str | None = None) -> Glossary:
        """Store (or replace) the list `glossary_id` for `pair` (a pair key) from terms as a request gives them."""
        if not isinstance(glossary_id, str) or not _ID.match(glossary_id):
            raise InvalidInput(f"Invalid glossary id {str(glossary_id)[:40]!r}: letters, digits, '.', '_' and '-'.")
        glossary = parse_terms(value, self.max_terms, f"{glossary_id}.{pair}")
        self.rows.put(glossary_id, pair, list(glossary.terms), "api", who)
        return glossary

    def get(self, glossary_id: str, src: str, tgt: str) -> Glossary:
        """The stored list `glossary_id` for src→tgt (normalized codes; src may be "auto")."""
        if not _ID.match(glossary_id):
            raise InvalidInput(f"Invalid glossary id {glossary_id[:40]!r}: letters, digits, '.', '_' and '-'.")
        if src != "auto":
            path = self.folder / f"{glossary_id}.{src}2{tgt}.tsv"
            if path.is_file():  # the usual case for a file: one stat and one query
                self._import(path)
            found = self._read(glossary_id, f"{src}2{tgt}")
            if found is not None:
                return found
        pairs = self.available().get(glossary_id)
        if not pairs:
            known = ", ".join(sorted(self.available())) or "none"
            raise InvalidInput(f"Unknown glossary {glossary_id!r}; stored glossaries: {known}.")
        if src == "auto":
            candidates = [p for p in pairs if p.endswith(f"2{tgt}")]
            if len(candidates) != 1:
                raise InvalidInput(f"Glossary {glossary_id!r} has no single list into {tgt}: give the source "
                                   "language explicitly.")
            pair = candidates[0]
        else:
            pair = f"{src}2{tgt}"
            if pair not in pairs:
                raise InvalidInput(f"Glossary {glossary_id!r} has no {src}→{tgt} list (it has: {', '.join(pairs)}).")
        found = self._read(glossary_id, pair)
        if found is None:
            raise InvalidInput(f"Unknown glossary {glossary_id!r} for {pair}.")
        return found

    def _read(self, glossary_id: str, pair: str) -> Glossary | None:
        stored = self.rows.get(glossary_id, pair)
        if stored is None:
            return None
        terms, updated = stored
        with self._lock:
            cached = self._cache.get((glossary_id, pair))
            if cached is not None and cached[0] == updated:
                return cached[1]
        glossary = Glossary(tuple(terms), f"{glossary_id}.{pair}")
        with self._lock:
            self._cache[(glossary_id, pair)] = (updated, glossary)
        return glossary

    def resolve(self, value: Any, source: str, target: str) -> Glossary | None:
        """What a request's `glossary` field names: None (none), a stored id, or inline terms. `source` and
        `target` are the request's codes as given ("auto", "EN", "zh-Hans" …)."""
        if value is None or (isinstance(value, str) and not value.strip()) or value == {} or value == []:
            return None
        if isinstance(value, str) and _ID.match(value.strip()) and "\n" not in value:
            src = "auto" if source.strip().lower() == "auto" else normalize_code(source)
            return self.get(value.strip(), src, normalize_code(target))
        return parse_terms(value, self.max_terms)
