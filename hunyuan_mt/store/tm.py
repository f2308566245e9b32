"""Translation memory: a segment that a per-pair memory knows is answered from it, before the model.

Exact match after normalising case, whitespace and placeholders: both sides are masked the way the service masks
text (`masking.protect_pair`), so "Delete %s?" in memory answers "Delete {0}?" with the query's own `{0}` put back.
The user's entries (imports, corrections) live in the store's database, with who added them and when; the
shipped ones (the demo's memory, built from its training pairs; read-only) in `<src>2<tgt>.tsv.gz` files beside
the model. The user's win on a conflict. A pair is read the first time it is asked for, and from then on only its
new rows. Pivot routes look up the pair asked for (es→de), never a hop.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import logging
import marshal
import os
import re
import sys
import threading
import time
import weakref
import xml.etree.ElementTree as ElementTree
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..adapters.request import Pair
from ..errors import InvalidInput
from ..host.paths import cache_home
from ..text.masking import Protected, protect, protect_pair
from ..text.segment import UNSPACED_SENTENCES
from .memory import Correction, MemoryRows, Provenance

if TYPE_CHECKING:
    from ..config import Config
    from . import Store

log = logging.getLogger(__name__)
#: A pair's rows are asked for again at most this often (seconds): the segments of one request share a check (a
#: check is one indexed query: 0.23 ms on SQLite), and another process's write is seen within this time.
FRESH_S = 0.01
_SPACE = re.compile(r"\s+")


def memory_key(masked: str, fold: bool = True) -> str:
    """What two segments must share to be the same entry: runs of whitespace do not count, nor (`fold`) case."""
    key = _SPACE.sub(" ", masked).strip()
    return key.casefold() if fold else key


#: A segment's closing punctuation: what a near-exact answer takes from the query ("Open the file" → no stop).
_CLOSING = re.compile(r"[.!?;:…。！？；：]+$")
#: The same closing marks written the way the target's script writes them.
_FULL_WIDTH = {".": "。", "!": "！", "?": "？", ";": "；", ":": "："}
_HALF_WIDTH = {v: k for k, v in _FULL_WIDTH.items()}
#: Closing marks a near-exact look-up tries in place of the query's own (none first).
_CLOSINGS = ("", ".", "!", "?", ":", "…", "...", "。", "！", "？", "：")
#: Opening marks that belong to a closing one (Spanish): they go when the closing mark goes.
_OPENING = re.compile(r"^[¿¡]")
#: Languages that open an exclamation or a question with its own inverted mark.
INVERTED_MARKS = frozenset({"es"})
_OPENER = {"!": "¡", "?": "¿"}


def with_closing_of(target: str, query: str, language: str) -> str:
    """`target` ending in `query`'s closing punctuation instead of its own (none when the query has none), each mark
    in the target `language`'s width (Chinese and Japanese: full-width) and, where the language opens them too
    (`INVERTED_MARKS`), with the opening mark that goes with it: "Welcome" → "Bienvenido" asked as "Welcome!" is
    "¡Bienvenido!"."""
    body = _CLOSING.sub("", target.rstrip())
    closing = _CLOSING.search(query.rstrip())
    if closing is None:
        return _OPENING.sub("", body)  # "¿Dónde está?" asked as "Where is it": no question marks at all
    if language in INVERTED_MARKS:
        body = _opened(body, closing.group(0))
    table = _FULL_WIDTH if language in UNSPACED_SENTENCES else _HALF_WIDTH
    return body + "".join(table.get(ch, ch) for ch in closing.group(0))


def _opened(body: str, closing: str) -> str:
    """A Spanish sentence's start for its new `closing`: "¡" before an exclamation, "¿" before a question (unless
    the sentence opens one further in: "Si quiere, ¿guardar?"), neither before a statement."""
    opener = _OPENER.get(closing[0])
    rest = _OPENING.sub("", body)
    if opener is None or (opener in rest and not body.startswith(opener)):
        return rest
    return opener + rest


@dataclass(frozen=True)
class MemoryHit:
    """The memory's answer for a segment: its masked target, and when the entry was not the segment itself, what
    differed (`near`: "case", "closing punctuation", "numbers or placeholders"), which the answer is flagged with.
    The query's own numbers and placeholders go back into the target either way."""

    target: str
    near: str | None = None


@dataclass(frozen=True)
class FuzzyMatch:
    """A near entry: its masked source and target, and how alike the sources are (0..1, rapidfuzz's ratio)."""

    source: str
    target: str
    score: float


#: Words that pick the candidates of a fuzzy lookup (3+ letters or digits; sentinels' digits are too short).
_WORD = re.compile(r"[^\W_]{3,}")
#: The rarest query words whose entries are compared, and how many candidates at most.
_FUZZY_WORDS = 3
_FUZZY_CANDIDATES = 3000


@dataclass
class _Entries:
    """One pair's memory: keys as written ("Unknown error") and case-folded ("unknown error") → masked target."""

    exact: dict[str, str] = field(default_factory=dict)
    folded: dict[str, str] = field(default_factory=dict)
    #: Exact key → the entry's numbers and placeholders as written, for the user's entries.
    spans: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: For fuzzy lookups, built on first use: the keys as written, case-folded, and word → indices of the keys.
    _keys: list[str] | None = None
    _folded_keys: list[str] | None = None
    _words: dict[str, list[int]] | None = None
    #: A memory file's entries as read (`_shipped_entries`), which every TranslationMemory of the process reading
    #: that file uses: never changed in place (`writable` gives a copy to put the user's rows into).
    shared: bool = False

    def writable(self) -> "_Entries":
        """These entries, or a copy of them where they are shared."""
        if not self.shared:
            return self
        return _Entries(dict(self.exact), dict(self.folded), dict(self.spans))

    def put(self, source: str, target: str, spans: tuple[str, ...] | None = None) -> None:
        """`spans`: the entry's own numbers and placeholders, where known (the user's entries; the shipped ones are
        stored masked), so that a query with other ones is flagged near-exact."""
        key = memory_key(source, fold=False)
        self.exact[key] = target
        self.folded[memory_key(source)] = target
        if spans is not None:
            self.spans[key] = spans
        else:
            self.spans.pop(key, None)
        self._keys = self._folded_keys = self._words = None  # the fuzzy index is rebuilt when next asked

    def put_shipped(self, rows: Iterable[tuple[str, str]]) -> None:
        """`put` for the shipped entries of a memory file, read at start: the same entries, in a third of the
        time (each key normalized once, its case-folded form taken from it, the index dropped once); the
        warm-up reads every pair's file before the server says ready."""
        exact, folded, spans = self.exact, self.folded, self.spans
        for source, target in rows:
            key = " ".join(source.split())  # memory_key(source, fold=False): str.split's whitespace is \s's
            exact[key] = target
            folded[key.casefold()] = target
            if spans:
                spans.pop(key, None)
        self._keys = self._folded_keys = self._words = None

    @property
    def indexed(self) -> bool:
        return self._keys is not None

    def index(self, words: dict[str, list[int]] | None = None) -> None:
        """Build the fuzzy lookup's word index if it is not there (about 0.2 s at 50k entries: the warm-up does
        it, not a request). `words`: the index of these very entries, as a cache file kept it (`_read_shipped`)."""
        if self._keys is not None and self._folded_keys is not None and self._words is not None:
            return
        keys = list(self.exact)
        folded = [key.casefold() for key in keys]
        if words is None:
            words = {}
            for i, key in enumerate(folded):
                for word in set(_WORD.findall(key)):
                    words.setdefault(word, []).append(i)
        self._keys, self._folded_keys, self._words = keys, folded, words

    def nearest(self, source: str, threshold: float) -> FuzzyMatch | None:
        """The entry most like `source` at `threshold` or above. Only entries that share one of the query's
        rarest words are compared: 0.16 ms a lookup at 53k entries against 3.69 ms for all of them, with the same
        best score in 298 of 300 queries (`python -m bench.tm_fuzzy`)."""
        from rapidfuzz import fuzz, process

        self.index()
        assert self._keys is not None and self._folded_keys is not None and self._words is not None
        query = memory_key(source)
        found = sorted(set(_WORD.findall(query)), key=lambda w: len(self._words.get(w, ())))  # rarest first
        candidates: dict[int, None] = {}
        for word in found[:_FUZZY_WORDS]:
            candidates.update(dict.fromkeys(self._words.get(word, ())))
            if len(candidates) >= _FUZZY_CANDIDATES:
                break
        if not candidates:
            return None
        ids = list(candidates)
        best = process.extractOne(query, [self._folded_keys[i] for i in ids], scorer=fuzz.ratio,
                                  score_cutoff=threshold * 100)
        if best is None:
            return None
        key = self._keys[ids[best[2]]]
        return FuzzyMatch(key, self.exact[key], round(best[1] / 100, 3))

    def get(self, source: str) -> str | None:
        target = self.exact.get(memory_key(source, fold=False))
        if target is None:
            target = self._folded(memory_key(source), source)
        return target

    def _folded(self, key: str, source: str) -> str | None:
        """The case-folded entry `key`'s target, with a capital where `source` starts with one ("Unknown error"
        found as "unknown error")."""
        target = self.folded.get(key)
        if target is not None and source.lstrip()[:1].isupper() and target[:1].islower():
            target = target[0].upper() + target[1:]
        return target

    def hit(self, segment: Protected, language: str) -> MemoryHit | None:
        """The answer for `segment` (masked, with its spans) in the target `language`: exact, else near-exact (see
        MemoryHit)."""
        key = memory_key(segment.text, fold=False)
        target = self.exact.get(key)
        if target is not None:
            known = self.spans.get(key)
            differs = known is not None and tuple(segment.spans) != known
            return MemoryHit(target, "numbers or placeholders" if differs else None)
        target = self.get(segment.text)
        if target is not None:
            return MemoryHit(target, "case")
        close = self.near(segment.text, language)
        return None if close is None else MemoryHit(close, "closing punctuation")

    def near(self, source: str, language: str) -> str | None:
        """The target of the entry that differs from `source` only in case, whitespace or closing punctuation,
        given `source`'s closing mark as the target `language` writes it (`with_closing_of`). A 98 %
        fuzzy match that lacked only a final full stop was a mere suggestion before. A few dictionary look-ups
        (the query with each closing mark), no index of its own."""
        asked = memory_key(source)
        base = _CLOSING.sub("", asked).rstrip()
        if not any(ch.isalpha() for ch in base):
            return None
        for closing in _CLOSINGS:
            candidate = base + closing
            if candidate == asked:
                continue  # the exact look-up's own key
            target = self._folded(candidate, source)
            if target is not None:
                return with_closing_of(target, source, language)
        return None

    def __len__(self) -> int:
        return len(self.exact)


#: Who made a shipped entry, as an export says (TMX's creationid), and who made the export itself.
SHIPPED_CREATOR = "hunyuan-mt (shipped memory)"
EXPORTER = "hunyuan-mt"


@dataclass(frozen=True)
class ExportedEntry:
    """One entry of an export as written, with when it was made (unix time; None where unknown) and by whom (the
    store's `who`, else how it came: "import", "correction", "legacy"; `SHIPPED_CREATOR`)."""

    source: str
    target: str
    created: float | None
    creator: str


@dataclass(frozen=True)
class ImportResult:
    pair: str
    #: Sources the user's memory did not have.
    added: int
    #: Sources it had: their targets are now the imported ones (an import run twice adds nothing).
    replaced: int
    #: Entries left out: the two sides do not carry the same placeholders, or one side is empty.
    skipped: int
    entries: int


#: Memory files' entries by (path, mtime, size), kept while a TranslationMemory uses them: a process that builds
#: more than one service (the tests, a reload) reads each file once, not 40k rows a pair each time (~0.3 s).
_SHIPPED: "weakref.WeakValueDictionary[tuple[str, int, int], _Entries]" = weakref.WeakValueDictionary()
_SHIPPED_LOCK = threading.Lock()


def _shipped_entries(path: Path) -> _Entries:
    """The entries of the memory file `path` as read, shared (see `_Entries.shared`)."""
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    with _SHIPPED_LOCK:
        found = _SHIPPED.get(key)
        if found is None:
            found = _SHIPPED[key] = _read_shipped(path, stat)
    return found


#: Memory files of at least this many rows are kept read, with their fuzzy index, in the cache folder
#: (`_read_shipped`); smaller ones are read in less time than the cache file would take to write.
CACHED_ROWS = 10_000
#: Cache files kept (the most recently written): one per memory file, so a folder of old models' is pruned.
_CACHE_KEEP = 64
#: Changes when what a cache file holds, or how its keys and index are made, changes.
_CACHE_FORMAT = ("entries+index 1", _WORD.pattern)


def _cache_file(path: Path, stat: os.stat_result) -> Path:
    key = hashlib.sha256(repr((str(path.resolve()), stat.st_mtime_ns, stat.st_size, _CACHE_FORMAT,
                               sys.version_info[:2])).encode()).hexdigest()[:24]  # marshal's format is Python's
    return cache_home() / "memory" / f"{path.name.split('.')[0]}-{key}.marshal.z"


def _read_shipped(path: Path, stat: os.stat_result) -> _Entries:
    """A memory file's entries, shared, with the fuzzy look-up's index built. A server's warm-up read the demo's 8
    files and indexed them in ~4.9 s of its start (2 AMD EPYC cores, under a profiler), before every start; the
    first start on a machine keeps the result in the cache folder, and later starts read that in a third of the
    time (the largest file, 54k rows: 0.60 s against 0.18 s). A cache file that cannot be read is read again from
    the memory file; one that cannot be written is logged and left."""
    cached = _cache_file(path, stat)
    try:
        exact, folded, words = marshal.loads(zlib.decompress(cached.read_bytes()))
        entries = _Entries(exact, folded, shared=True)
        entries.index(words)
        return entries
    except FileNotFoundError:
        pass
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign file: the memory file says the same
        log.warning("translation memory: cache %s unreadable (%s); reading %s again", cached, exc, path.name)
    entries = _Entries(shared=True)
    # Stored masked: as trained, sentinels already numbered in the source's order.
    entries.put_shipped((source, target) for source, target in tsv_rows(path) if source.strip() and target.strip())
    if len(entries) >= CACHED_ROWS:
        entries.index()
        _write_cache(cached, (entries.exact, entries.folded, entries._words))
    return entries


def _write_cache(cached: Path, value: object) -> None:
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_name(f".{cached.name}.{os.getpid()}.{threading.get_ident()}")
        partial.write_bytes(zlib.compress(marshal.dumps(value), 1))
        os.replace(partial, cached)  # whole or absent: replicas starting together each write their own copy
        older = sorted(cached.parent.glob("*.marshal.z"), key=lambda p: p.stat().st_mtime, reverse=True)
        for stale in older[_CACHE_KEEP:]:
            stale.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("translation memory: could not keep %s (%s); the next start reads the file again", cached, exc)


class TranslationMemory:
    """Thread-safe. `lookup`/`match` is what the service asks for each segment; `add` is what imports do,
    `correct` what a correction does.

    The user's entries live in the store (`MemoryRows`: SQLite or PostgreSQL), the shipped ones in files beside
    the model. Each look-up asks the store whether the pair has rows newer than those read (one indexed query), so
    an import by the CLI, or a correction sent to another replica, answers at once here too."""

    def __init__(self, rows: MemoryRows, shipped_dir: Path | None = None, enabled: bool = True,
                 legacy_dir: Path | None = None) -> None:
        self.rows = rows
        self.shipped_dir = shipped_dir
        self.enabled = enabled
        self._lock = threading.Lock()
        self._pairs: dict[str, _Entries] = {}
        #: Per pair read: the user's rows as written (masked key → (source, target)) and the store's stamp then.
        self._user: dict[str, dict[str, tuple[str, str]]] = {}
        self._stamp: dict[str, tuple[int, int]] = {}
        self._checked: dict[str, float] = {}
        #: Segments answered, and of those near-exactly (/status's "tm").
        self.hits = 0
        self.near_hits = 0
        if legacy_dir is not None:
            self.import_legacy(legacy_dir)

    # ------------------------------------------------------------------ reading

    def _shipped_files(self, pair: str) -> list[Path]:
        if self.shipped_dir is None:
            return []
        return [p for p in (self.shipped_dir / f"{pair}.tsv.gz", self.shipped_dir / f"{pair}.tsv") if p.is_file()]

    def _entries(self, pair: str) -> _Entries:
        now = time.monotonic()
        with self._lock:
            loaded = self._pairs.get(pair)
            if loaded is not None and now - self._checked.get(pair, -1.0) < FRESH_S:
                return loaded
            self._checked[pair] = now
        stamp = self.rows.stamp(pair)
        with self._lock:
            if loaded is not None and self._stamp.get(pair) == stamp:
                return loaded
            known = self._stamp.get(pair)
        if loaded is not None and known is not None:
            # Rows added since (by anyone): put in on top, unless a row committed behind a newer id was missed.
            fresh = self.rows.since(pair, known[0])
            if known[1] + len(fresh) == stamp[1]:
                with self._lock:
                    if self._pairs.get(pair) is loaded and self._stamp.get(pair) == known:
                        self._pairs[pair] = loaded.writable()
                        self._put_user(self._pairs[pair], [(s, t) for _, s, t in fresh],
                                       self._user.setdefault(pair, {}))
                        self._stamp[pair] = (max([known[0], *(i for i, _, _ in fresh)]), stamp[1])
                    return self._pairs[pair]
        shipped = [_shipped_entries(path) for path in self._shipped_files(pair)]
        fresh = self.rows.since(pair)
        if len(shipped) == 1 and not fresh:
            entries = shipped[0]  # the file's entries alone: shared until a row of the user's comes
        else:
            entries = _Entries()
            for part in shipped:
                entries.exact.update(part.exact)
                entries.folded.update(part.folded)
        user: dict[str, tuple[str, str]] = {}
        self._put_user(entries, [(s, t) for _, s, t in fresh], user)
        if entries:
            log.info("translation memory: %d entries for %s", len(entries), pair)
        if loaded is not None and loaded.indexed:
            entries.index()  # the old one served fuzzy look-ups: the new one is ready for them too
        with self._lock:
            if self._pairs.get(pair) is loaded:  # the first read, or the re-read of what is in use
                self._pairs[pair], self._user[pair] = entries, user
                self._stamp[pair] = (max([0, *(i for i, _, _ in fresh)]), len(fresh))
            return self._pairs[pair]

    @staticmethod
    def _put_user(entries: _Entries, rows: list[tuple[str, str]], user: dict[str, tuple[str, str]]) -> None:
        """The user's rows into `entries`, masked as the service masks text, and into `user` as written (a later
        row wins)."""
        for source, target in rows:
            masked = protect_pair(source, target)
            if masked is not None and masked[0].strip() and masked[1].strip():
                entries.put(masked[0], masked[1], tuple(protect(source).spans))
                user[memory_key(masked[0], fold=False)] = (source, target)

    def lookup(self, src: str, tgt: str, segment: Protected) -> str | None:
        """The memory's target for `segment` (masked, its sentinels numbered like the segment's), or None."""
        if not self.enabled:
            return None
        target = self._entries(f"{src}2{tgt}").get(segment.text)
        if target is not None:
            with self._lock:
                self.hits += 1
        return target

    def match(self, src: str, tgt: str, segment: Protected) -> MemoryHit | None:
        """The memory's answer for `segment` (masked, its sentinels numbered like the segment's): an exact entry,
        else one that differs only in case, closing punctuation, numbers or placeholders, flagged (MemoryHit.near;
        the caller puts the query's own spans back). None when neither."""
        if not self.enabled:
            return None
        found = self._entries(f"{src}2{tgt}").hit(segment, tgt)
        if found is not None:
            with self._lock:
                self.hits += 1
                self.near_hits += found.near is not None
        return found

    def suggest(self, src: str, tgt: str, segment: Protected, threshold: float) -> FuzzyMatch | None:
        """The nearest entry to `segment` (masked) at `threshold` or above, or None (also when disabled)."""
        if not self.enabled or threshold <= 0:
            return None
        entries = self._entries(f"{src}2{tgt}")
        with self._lock:
            return entries.nearest(segment.text, threshold)

    def preload(self, pairs: list[str], fuzzy: bool = False) -> None:
        """Read these pairs' entries now (at start), and with `fuzzy` build their fuzzy lookup's index too."""
        for pair in pairs:
            if self.enabled:
                entries = self._entries(pair)
                if fuzzy:
                    with self._lock:
                        entries.index()

    def stats(self) -> dict[str, int]:
        """Entries per pair read so far."""
        with self._lock:
            return {pair: len(entries) for pair, entries in self._pairs.items() if entries}

    # ------------------------------------------------------------------ exporting

    def export_entries(self, pair: Pair | str) -> list[ExportedEntry]:
        """A pair's entries as written, for an export, with who made each and when: the user's (raw, with the
        store's record of them) over the shipped ones (the memory file's date, `SHIPPED_CREATOR`). A shipped entry
        is stored masked, so one that held placeholders (`⟦0⟧` in place of `%s`) is left out: its spans are lost."""
        key = (pair if isinstance(pair, Pair) else Pair.parse(pair)).key
        rows: dict[str, ExportedEntry] = {}
        for path in self._shipped_files(key):
            written = path.stat().st_mtime
            for source, target in tsv_rows(path):
                if "⟦" not in source + target and source.strip() and target.strip():
                    rows[memory_key(source, fold=False)] = ExportedEntry(source, target, written, SHIPPED_CREATOR)
        self._entries(key)
        with self._lock:
            user = list(self._user.get(key, {}).values())
        made = self.rows.provenance(key) if user else {}
        for source, target in user:
            created, creator = made.get((source, target), (None, "import"))
            rows[memory_key(source, fold=False)] = ExportedEntry(source, target, created, creator)
        return list(rows.values())

    def export_rows(self, pair: Pair | str) -> list[tuple[str, str]]:
        """`export_entries` as (source, target) pairs."""
        return [(entry.source, entry.target) for entry in self.export_entries(pair)]

    # ------------------------------------------------------------------ adding

    def add(self, pair: Pair | str, rows: list[tuple[str, str]],
            provenance: Provenance = Provenance()) -> ImportResult:
        """Add `rows` to the user's memory for `pair`: a source it already has (as the memory matches it: same
        case, whitespace and placeholders) gets the imported target, so importing a file twice changes nothing. A
        pair given as text is parsed like every pair name (`Pair.parse`). InvalidInput when no row can be used."""
        key = (pair if isinstance(pair, Pair) else Pair.parse(pair)).key
        kept: dict[str, tuple[str, str]] = {}  # masked key → (source, target)
        skipped = 0
        for source, target in rows:
            source, target = " ".join(source.split()), " ".join(target.split())  # no tabs or line breaks
            masked = protect_pair(source, target) if source and target else None
            if masked is None:
                skipped += 1
                continue
            kept[memory_key(masked[0], fold=False)] = (source, target)
        if not kept:
            raise InvalidInput(f"No entry to import for {key}: the file has no rows" if not rows else
                               f"No entry to import for {key}: none of its {len(rows)} rows has the same "
                               "placeholders on both sides and text on each.")
        self._entries(key)
        with self._lock:
            existing = self._user.get(key, {})
            changed = {k: row for k, row in kept.items() if existing.get(k) != row}
            added = sum(1 for k in kept if k not in existing)
        if changed:
            self.rows.add(key, list(changed.values()), provenance)
        entries = self._reread(key)
        return ImportResult(key, added, len(kept) - added, skipped, len(entries))

    def correct(self, correction: Correction, provenance: Provenance) -> int:
        """Record a correction; from now on it answers its source (exact and fuzzy), here and on every process
        that shares the store. Returns its id."""
        found = self.rows.correct(correction, provenance)
        self._reread(correction.pair)
        return found

    def _reread(self, pair: str) -> _Entries:
        """The pair with this process's own write in: read now, whenever it was last checked."""
        with self._lock:
            self._checked.pop(pair, None)
        return self._entries(pair)

    def import_legacy(self, folder: Path) -> list[ImportResult]:
        """A `tm/` folder of `<src>2<tgt>.tsv` files (where earlier versions kept the user's memory), imported
        into the store once per file version: a file changed since is imported again (a source it repeats gets
        its target)."""
        results = []
        for path in sorted(folder.glob("*2*.tsv")) + sorted(folder.glob("*2*.tsv.gz")):
            pair = path.name.split(".")[0]
            try:
                Pair.parse(pair)
                if self.rows.imports.done(path):
                    continue
            except (InvalidInput, OSError):
                continue
            rows = list(tsv_rows(path))
            try:
                results.append(self.add(pair, rows, Provenance("legacy", "file")))
            except InvalidInput:
                pass
            self.rows.imports.mark(path)
            log.info("translation memory: %s imported into the store (%d rows)", path, len(rows))
        return results


def open_memory(cfg: Config, store: Store) -> TranslationMemory:
    """The configured memory over `store` (a legacy `tm.dir` imported once)."""
    legacy = cfg.tm.resolved_dir
    return TranslationMemory(store.memory, cfg.tm.resolved_shipped, cfg.tm.enabled,
                             legacy if legacy.is_dir() else None)


def tsv_rows(path: Path) -> Iterator[tuple[str, str]]:
    """(source, target) of each `source<TAB>target` line of a memory file, plain or gzipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:  # type: ignore[operator]
        for line in handle:
            source, sep, target = line.rstrip("\n").partition("\t")
            if sep:
                yield source, target


def tmx_date(when: float) -> str:
    """A unix time as TMX writes dates: ISO 8601 basic format, UTC (`20261207T031500Z`)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))


def tmx_bytes(entries: list[ExportedEntry], src: str, tgt: str, now: float | None = None) -> bytes:
    """`entries` as a TMX 1.4 document, written by translate-toolkit's TMX store (the library Pootle and Weblate's
    tooling use), which the import reads back (`read_rows`). The header says when the export was made and by
    what (`creationdate`, `creationid`), each unit when its entry was made and by whom: CAT tools sort and filter
    a memory by them."""
    from translate.storage import tmx

    store = tmx.tmxfile(sourcelanguage=src, targetlanguage=tgt)
    header = store.document.getroot().find("header")
    if header is not None:
        header.set("creationdate", tmx_date(time.time() if now is None else now))
        header.set("creationid", EXPORTER)
    for entry in entries:
        unit = store.addsourceunit(entry.source, src)
        unit.settarget(entry.target, tgt, append=True)
        if entry.created is not None:
            unit.xmlelement.set("creationdate", tmx_date(entry.created))
        unit.xmlelement.set("creationid", entry.creator)
    return bytes(store)


def read_rows(data: bytes, filename: str, src: str, tgt: str) -> list[tuple[str, str]]:
    """(source, target) rows of an uploaded memory: TSV (`source<TAB>target`) or TMX (the `src` and `tgt`
    variants of each translation unit)."""
    if filename.lower().endswith(".tmx") or data.lstrip()[:1] == b"<":
        return _tmx_rows(data, src, tgt)  # the XML declares its own encoding
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InvalidInput(f"{filename}: not UTF-8 text; save the memory as UTF-8 (or TMX) and import it again.") \
            from None
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        source, sep, target = line.partition("\t")
        if not sep:
            raise InvalidInput(f"{filename}: line {number} has no tab between the source and the target.")
        rows.append((source.strip(), target.strip()))
    return rows


_INTERNAL_SUBSET = re.compile(rb"<!DOCTYPE[^>\[]*\[")


def _tmx_rows(data: bytes, src: str, tgt: str) -> list[tuple[str, str]]:
    # No entity expansion games: entities and a DOCTYPE's internal subset are refused. A bare `<!DOCTYPE tmx SYSTEM
    # "tmx14.dtd">` is what TMX writers put (translate-toolkit's export here, OmegaT, Trados); the parser never
    # fetches it.
    if b"<!ENTITY" in data or _INTERNAL_SUBSET.search(data[:4096]):
        raise InvalidInput("TMX files with entities or a DOCTYPE internal subset are not accepted.")
    try:
        root = ElementTree.parse(io.BytesIO(data)).getroot()
    except ElementTree.ParseError as exc:
        raise InvalidInput(f"Not a readable TMX file: {exc}.") from None
    lang_attr = "{http://www.w3.org/XML/1998/namespace}lang"
    rows = []
    for unit in root.iter("tu"):
        variants: dict[str, str] = {}
        for variant in unit.iter("tuv"):
            lang = (variant.get(lang_attr) or variant.get("lang") or "").lower()
            seg = variant.find("seg")
            if seg is not None:
                variants[lang.split("-")[0].split("_")[0]] = "".join(seg.itertext())
        if src in variants and tgt in variants:
            rows.append((variants[src], variants[tgt]))
    return rows
