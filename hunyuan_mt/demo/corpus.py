"""From raw source entries to the demo corpus: clean, filter, mask, deduplicate, hold out, write.

The held-out split is chosen by English source string, among UI strings that all four languages translate, and no
training pair of any direction contains a held-out English string or a held-out reference. So the es→de pivot test
(Spanish and German translations of held-out strings) is unseen by es2en and en2de alike.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..masking import protect, protect_pair
from .sources import Entry, is_offensive

LANGS = ("es", "de", "fr", "zh")
#: Directions that get an adapter. es→de has none on purpose: it is served through the pivot (en).
ADAPTER_DIRECTIONS = tuple([f"en2{x}" for x in LANGS] + [f"{x}2en" for x in LANGS])
PIVOT_DIRECTIONS = ("es2de",)

MAX_CHARS = 120
MAX_SPANS = 4

_MNEMONIC_ZH = re.compile(r"\s*[(（][_&][A-Za-z0-9][)）]")
_ACCEL = re.compile(r"(?<![&\w])[_&](?=[^\W_])")
_KEYLIKE = re.compile(r"^[\w.:/-]+$")
_HAS_LETTER = re.compile(r"[^\W\d_]")


def clean(text: str) -> str | None:
    """One UI string made fit for training, or None when it should be skipped."""
    if "\n" in text.strip() or "\t" in text:
        return None
    text = _MNEMONIC_ZH.sub("", text)
    # One accelerator marker (_Save, Save &As) per label; leave real underscores (file_name) and entities alone.
    if len(text) <= 60 and text.count("_") + text.count("&") == 1 and not re.search(r"&\w+;", text):
        text = _ACCEL.sub("", text, count=1)
    text = re.sub(r"\s+", " ", text).strip()
    if not text or len(text) > MAX_CHARS or not _HAS_LETTER.search(text):
        return None
    return text


def mask_pair(src: str, tgt: str) -> tuple[str, str] | None:
    """A pair masked for training; None when the two sides do not carry the same do-not-translate spans or the
    source has more than MAX_SPANS of them (format-heavy strings)."""
    masked = protect_pair(src, tgt)
    if masked is None or masked[0].count("⟦") > MAX_SPANS or not _HAS_LETTER.search(re.sub(r"⟦\d+⟧", "", masked[0])):
        return None
    return masked


def is_key_like(en: str) -> bool:
    """Identifiers such as 'gtk-ok' or 'default:LTR' are program keys, not text."""
    return " " not in en and bool(_KEYLIKE.match(en)) and bool(re.search(r"[_:./-]", en)) or en.isupper() and len(en) > 12


def _ratio_ok(en: str, other: str, lang: str) -> bool:
    low, high = (0.08, 2.5) if lang == "zh" else (0.25, 4.0)
    return low <= len(other) / max(1, len(en)) <= high


@dataclass
class Corpus:
    train: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)   # masked (src, tgt, origin)
    test: dict[str, list[tuple[str, str]]] = field(default_factory=dict)         # raw (src, reference)
    frequent: dict[str, list[tuple[str, str]]] = field(default_factory=dict)     # raw (en, reference) per en2x
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Per direction, the UI translations in order of preference (a source's most common translation first),
    #: for the translation memory; empty when the corpus was read back from disk.
    preferred: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)


def build_corpus(entries: Iterable[Entry], test_size: int = 400, frequent_size: int = 300,
                 max_dictionary_pairs: int = 30000, seed: int = 13) -> Corpus:
    rng = random.Random(seed)
    # English string → language → Counter of translations; and English string → set of catalogues using it.
    ui: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    domains: dict[str, set[str]] = defaultdict(set)
    extra: list[tuple[str, str, str, str]] = []          # (en, lang, text, origin) for dictionaries and CLDR
    for entry in entries:
        en, text = clean(entry.en), clean(entry.text)
        if en is None or text is None or en == text or is_key_like(en) or not _ratio_ok(en, text, entry.lang):
            continue
        if entry.origin.startswith("gettext:"):
            ui[en][entry.lang][text] += 1
            domains[en].add(entry.origin)
        elif not is_offensive(en, text):
            extra.append((en, entry.lang, text, entry.origin))

    def best(en: str, lang: str) -> str:
        return ui[en][lang].most_common(1)[0][0]

    complete = sorted(en for en, by_lang in ui.items() if all(lang in by_lang for lang in LANGS)
                      and 2 <= len(en) <= 100 and not protect(en).spans)
    # Frequent short phrases: what a first-time user types. They may be in training; they are not in the test.
    by_frequency = sorted((en for en in complete if len(en) <= 25 and len(en.split()) <= 3),
                          key=lambda en: (-len(domains[en]), en))
    frequent = by_frequency[:frequent_size]
    rest = [en for en in complete if en not in set(frequent)]
    rng.shuffle(rest)
    test_en = set(rest[:test_size])

    corpus = Corpus()
    for lang in LANGS:
        corpus.test[f"en2{lang}"] = [(en, best(en, lang)) for en in sorted(test_en)]
        corpus.test[f"{lang}2en"] = [(best(en, lang), en) for en in sorted(test_en)]
        corpus.frequent[f"en2{lang}"] = [(en, best(en, lang)) for en in frequent]
    corpus.test["es2de"] = [(best(en, "es"), best(en, "de")) for en in sorted(test_en)]
    held_out = {lang: {best(en, lang) for en in test_en} for lang in LANGS}

    pairs: dict[str, dict[tuple[str, str], str]] = {d: {} for d in ADAPTER_DIRECTIONS}
    for en, by_lang in ui.items():
        if en in test_en:
            continue
        for lang, variants in by_lang.items():
            for text, _ in variants.most_common(2):
                if text in held_out[lang]:
                    continue
                _add(pairs, en, lang, text, "gettext")
    rng.shuffle(extra)
    per_lang: Counter[str] = Counter()
    for en, lang, text, origin in extra:
        if en in test_en or text in held_out[lang] or per_lang[lang] >= max_dictionary_pairs:
            continue
        if _add(pairs, en, lang, text, origin.split(":")[0]):
            per_lang[lang] += 1

    for direction, items in pairs.items():
        corpus.preferred[direction] = [(s, t, o) for (s, t), o in items.items()]  # insertion order: most common first
        corpus.train[direction] = [(s, t, o) for (s, t), o in items.items()]
        rng.shuffle(corpus.train[direction])
        corpus.stats[direction] = dict(Counter(o for _, _, o in corpus.train[direction]))
        corpus.stats[direction]["train"] = len(items)
        corpus.stats[direction]["test"] = len(corpus.test[direction])
    corpus.stats["es2de"] = {"train": 0, "test": len(corpus.test["es2de"])}
    return corpus


def _add(pairs: dict[str, dict[tuple[str, str], str]], en: str, lang: str, text: str, origin: str) -> bool:
    masked = mask_pair(en, text)
    if masked is None:
        return False
    m_en, m_text = masked
    pairs[f"en2{lang}"].setdefault((m_en, m_text), origin)
    back = mask_pair(text, en)
    if back is not None:
        pairs[f"{lang}2en"].setdefault(back, origin)
    return True


# --- on disk: data/demo/{train,test,frequent}/<direction>.jsonl + stats.json ----------------------------------

def write_corpus(corpus: Corpus, root: Path) -> None:
    for part, rows in (("train", corpus.train), ("test", corpus.test), ("frequent", corpus.frequent)):
        folder = root / part
        folder.mkdir(parents=True, exist_ok=True)
        for direction, items in rows.items():
            with open(folder / f"{direction}.jsonl", "w", encoding="utf-8") as handle:
                for item in items:
                    record = {"src": item[0], "tgt": item[1]}
                    if len(item) > 2:
                        record["origin"] = item[2]
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    (root / "stats.json").write_text(json.dumps(corpus.stats, indent=1, ensure_ascii=False), encoding="utf-8")


def read_jsonl(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def load_corpus(root: Path) -> Corpus:
    corpus = Corpus(stats=json.loads((root / "stats.json").read_text(encoding="utf-8")))
    for direction_file in sorted((root / "train").glob("*.jsonl")):
        corpus.train[direction_file.stem] = [(r["src"], r["tgt"], r.get("origin", "")) for r in read_jsonl(direction_file)]
    for part, target in (("test", corpus.test), ("frequent", corpus.frequent)):
        for direction_file in sorted((root / part).glob("*.jsonl")):
            target[direction_file.stem] = [(r["src"], r["tgt"]) for r in read_jsonl(direction_file)]
    return corpus
