"""From raw source entries to the demo corpus: clean, filter, mask, deduplicate, hold out, write.

The held-out split is chosen by English source string, among UI strings of the system's gettext catalogues that all
four languages translate, and no training pair of any direction or source contains a held-out English string or a
held-out reference. So the es→de pivot test (Spanish and German translations of held-out strings) is unseen by es2en
and en2de alike. The split is drawn from the system catalogues only, so adding a source does not move it and builds
stay comparable. Help sentences (LibreOffice's help) are held out by whole page, and their English sentences and
references are kept out of every source's training pairs too.
"""

from __future__ import annotations

import json
import random
import re
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..text.masking import SENTINEL, protect, protect_pair
from ..text.segment import split_text
from .sources import Entry, is_offensive

LANGS = ("es", "de", "fr", "zh")
#: Directions that get an adapter. es→de has none on purpose: it is served through the pivot (en).
ADAPTER_DIRECTIONS = tuple([f"en2{x}" for x in LANGS] + [f"{x}2en" for x in LANGS])
PIVOT_DIRECTIONS = ("es2de",)

MAX_CHARS = 120
#: Help sentences may be longer than UI strings; still well inside the training length in tokens.
HELP_MAX_CHARS = 160
MAX_SPANS = 4
#: Sources of UI strings, in the order their pairs are taken (the first source to give a pair names its origin).
UI_KINDS = ("gettext", "libreoffice", "apps")
HELP_KIND = "lohelp"
#: Share of help pages held out (by a hash of the page path, so it does not depend on what else was read).
HELP_HELD_OUT_PERCENT = 4
#: Documentation translated paragraph by paragraph (GNOME's help): the paragraph data and its held-out pages.
PARA_KIND = "gnomehelp"
PARA_HELD_OUT_PERCENT = 10
#: Manual pages and HTML manuals: paragraph data for training only (the paragraph test stays GNOME's help).
MAN_KIND = "manpages"
MANUAL_KIND = "manuals"
#: Every source read paragraph by paragraph.
PARAGRAPH_KINDS = (HELP_KIND, PARA_KIND, MAN_KIND, MANUAL_KIND)
#: The manuals' blocks with inline markup (`sources.tagged_manual_pages`): segments whose formatted words change
#: language. Pages are held out by name, for the tagged test and from the manuals' plain blocks alike; the training
#: pairs are repeated, as they are few beside the rest (a few thousand per direction).
TAGGED_KIND = "tagged"
TAG_HELD_OUT_PERCENT = 8
TAG_REPEAT = 5
TAG_MAX_SPANS = 12
#: Whole paragraphs and runs of two sentences up to this long are trained on (about 100 tokens, inside the
#: 128-token examples a paragraph build uses); the held-out paragraphs are PARA_TEST_MIN_CHARS to this long.
PARAGRAPH_MAX_CHARS = 400
PARA_TEST_MIN_CHARS = 40
#: Prose carries more do-not-translate spans (key names, file names, commands) than a UI string.
PARAGRAPH_MAX_SPANS = 8

_MNEMONIC_ZH = re.compile(r"\s*[(（][_&][A-Za-z0-9][)）]")
_ACCEL = re.compile(r"(?<![&\w])[_&](?=[^\W_])")
_TILDE_ACCEL = re.compile(r"~(?=[^\W\d_])")   # LibreOffice's accelerator marker: "~Save", "Save ~As"
_KEYLIKE = re.compile(r"^[\w.:/-]+$")
_HAS_LETTER = re.compile(r"[^\W\d_]")


def clean(text: str, max_chars: int = MAX_CHARS) -> str | None:
    """One UI string made fit for training, or None when it should be skipped."""
    if "\n" in text.strip() or "\t" in text:
        return None
    text = _MNEMONIC_ZH.sub("", text)
    if text.count("~") == 1:
        text = _TILDE_ACCEL.sub("", text)
    # One accelerator marker (_Save, Save &As) per label; leave real underscores (file_name) and entities alone.
    if len(text) <= 60 and text.count("_") + text.count("&") == 1 and not re.search(r"&\w+;", text):
        text = _ACCEL.sub("", text, count=1)
    text = re.sub(r"\s+", " ", text).strip()
    if not text or len(text) > max_chars or not _HAS_LETTER.search(text):
        return None
    return text


# One accelerator marker in a word, at its start or inside ("_Save", "Guardar co_mo", "An_wenden", "Fo_lder"):
# translators put the marker where their language's key is, so it sits anywhere in a word. A word with one marker
# whose unmarked form is a word of the language is a label with its key marked; an identifier (data_statement,
# PAGE_WIDTH, max_wal_size) is not a word when joined, and stays. Not after a placeholder (⟦0⟧_check).
_MARKED_WORD = re.compile(r"(?<![\w&~*./⟧-])[^\W_]*[_&~][^\W_]+(?![\w&~*])")
_WORDFREQ_LANGS = {"en": "en", "es": "es", "de": "de", "fr": "fr"}
#: Languages that write compounds as one word, which wordfreq's lists mostly lack.
_COMPOUNDING = frozenset({"de"})
#: wordfreq frequency from which a joined form counts as a word ("carpeta" 6.5e-6, "folder" 5.5e-6).
WORD_FREQUENCY = 1e-6


def strip_accelerators(text: str, lang: str, other: str | None = None) -> str:
    """`text` without the accelerator markers of its words (see _MARKED_WORD); zh marks keys with a suffix
    ("保存(_S)"), which clean() removes.

    `other` is the pair's other side. A German compound is rarely in wordfreq's lists ("Druckvorschau",
    "Ausgabeschacht"), so the word test alone kept "Druck_vorschau". In German, when the other side has no such
    marker at all, a marker inside a word before a small letter is a key mark too: an identifier would be copied
    to both sides, and a marker before a capital ("ganze_Zahl", "Scroll_Lock") joins two words. Not in the other
    languages: there two words joined are no word, and a translated identifier ("nom_fichier", "pixmap_path"
    against "路径") keeps its underscore."""
    code = _WORDFREQ_LANGS.get(lang)
    if code is None:
        return text
    from wordfreq import word_frequency

    def unmark(match: re.Match[str]) -> str:
        word = match.group(0)
        joined = re.sub(r"[_&~]", "", word)
        letters = sum(ch.isalpha() for ch in joined)
        if letters < 3 or joined.isupper():  # R&D, AT&T: names, not a marked label
            return word
        if word_frequency(joined.lower(), code) >= WORD_FREQUENCY:
            return joined
        mark = next(ch for ch in word if ch in "_&~")
        after = word[word.index(mark) + 1]
        if code in _COMPOUNDING and other is not None and mark not in other and after.islower() and \
                not any(ch.isdigit() for ch in word):
            return joined
        return word

    return _MARKED_WORD.sub(unmark, text)


def clean_pair(en: str, text: str, lang: str, max_chars: int = MAX_CHARS) -> tuple[str | None, str | None]:
    """An English catalogue string and its translation (in `lang`) made fit for training and the memory:
    clean() on each, then the accelerator markers clean() leaves inside words (each side read against the
    other: see strip_accelerators)."""
    cleaned_en, cleaned = clean(en, max_chars), clean(text, max_chars)
    if cleaned_en is None or cleaned is None:
        return (None if cleaned_en is None else strip_accelerators(cleaned_en, "en"),
                None if cleaned is None else strip_accelerators(cleaned, lang))
    return strip_accelerators(cleaned_en, "en", cleaned), strip_accelerators(cleaned, lang, cleaned_en)


def mask_pair(src: str, tgt: str, max_spans: int = MAX_SPANS) -> tuple[str, str] | None:
    """A pair masked for training; None when the two sides do not carry the same do-not-translate spans or the
    source has more than `max_spans` of them (format-heavy strings)."""
    masked = protect_pair(src, tgt)
    if masked is None or masked[0].count("⟦") > max_spans or not _HAS_LETTER.search(re.sub(r"⟦\d+⟧", "", masked[0])):
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
    help_test: dict[str, list[tuple[str, str]]] = field(default_factory=dict)    # raw held-out help sentences
    para_test: dict[str, list[tuple[str, str]]] = field(default_factory=dict)    # raw held-out paragraphs
    tag_test: dict[str, list[tuple[str, str]]] = field(default_factory=dict)     # held-out tagged segments
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Per direction, the UI translations in order of preference (a source's most common translation first),
    #: for the translation memory; empty when the corpus was read back from disk.
    preferred: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)


def build_corpus(entries: Iterable[Entry], test_size: int = 400, frequent_size: int = 300,
                 max_dictionary_pairs: int = 30000, max_help_pairs: int = 40000, max_paragraph_pairs: int = 80000,
                 para_test_size: int = 240, seed: int = 13, keep: Corpus | None = None) -> Corpus:
    """The corpus of `entries`. With `keep` (an earlier extraction), its held-out UI strings, frequent phrases and
    help sentences stay the test sets and are kept out of training, so that a build continued from one trained on
    that extraction is scored on what neither has seen, and against the same numbers."""
    rng = random.Random(seed)
    # Per UI source: English string → language → Counter of translations; English string → catalogues using it.
    ui: dict[str, dict[str, dict[str, Counter[str]]]] = {
        kind: defaultdict(lambda: defaultdict(Counter)) for kind in UI_KINDS}
    domains: dict[str, set[str]] = defaultdict(set)
    extra: list[tuple[str, str, str, str]] = []          # (en, lang, text, origin) for dictionaries and CLDR
    help_pairs: list[tuple[str, str, str, str]] = []     # (page, en, lang, text)
    # Paragraph segments (page, en, lang, text, origin) of both helps, the manual pages and manuals; GNOME's whole
    # paragraphs for the test.
    para_pairs: list[tuple[str, str, str, str, str]] = []
    paragraphs: list[tuple[str, str, str, str]] = []
    tagged: list[tuple[str, str, str, str]] = []         # (page, en, lang, text) with markup sentinels
    for entry in entries:
        kind = entry.origin.split(":")[0]
        if kind == TAGGED_KIND:
            if (len(entry.en) <= PARAGRAPH_MAX_CHARS and len(entry.text) <= PARAGRAPH_MAX_CHARS
                    and _ratio_ok(entry.en, entry.text, entry.lang) and not is_offensive(entry.en, entry.text)):
                tagged.append((entry.key.split("#")[0], entry.en, entry.lang, entry.text))
            continue
        if kind in PARAGRAPH_KINDS:
            page = entry.key.split("#")[0]
            if kind == HELP_KIND:
                help_pairs.extend((page, en, entry.lang, text)
                                  for en, text in help_sentences(entry.en, entry.text, entry.lang))
            elif kind == PARA_KIND:
                paragraphs.append((page, entry.en, entry.lang, entry.text))
            # LibreOffice's help sentences and short paragraphs are in help_pairs already.
            para_pairs.extend((page, en, entry.lang, text, kind) for en, text in paragraph_segments(
                entry.en, entry.text, entry.lang, short=kind != HELP_KIND))
            continue
        en, text = clean_pair(entry.en, entry.text, entry.lang)
        if en is None or text is None or en == text or is_key_like(en) or not _ratio_ok(en, text, entry.lang):
            continue
        if kind in ui:
            ui[kind][en][entry.lang][text] += 1
            if kind == "gettext":
                domains[en].add(entry.origin)
        elif not is_offensive(en, text):
            extra.append((en, entry.lang, text, entry.origin))
    system = ui["gettext"]

    def best(en: str, lang: str) -> str:
        return system[en][lang].most_common(1)[0][0]

    complete = sorted(en for en, by_lang in system.items() if all(lang in by_lang for lang in LANGS)
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
    help_train, help_en, help_refs = _hold_out_help(help_pairs, corpus, test_size, random.Random(seed))
    para_en, para_refs = _hold_out_paragraphs(paragraphs, corpus, para_test_size, random.Random(seed))
    tag_en, tag_refs = _hold_out_tagged(tagged, corpus, para_test_size, random.Random(seed))
    # Nothing held out, UI string, help sentence, paragraph or tagged segment, may reach training through any
    # source.
    test_en |= help_en | para_en | tag_en
    for lang in LANGS:
        held_out[lang] |= help_refs.get(lang, set()) | para_refs.get(lang, set()) | tag_refs.get(lang, set())
    if keep is not None:
        corpus.test, corpus.frequent, corpus.help_test = keep.test, keep.frequent, keep.help_test
        for lang in LANGS:
            for part in (keep.test, keep.help_test):
                rows = part.get(f"en2{lang}", [])
                test_en |= {en for en, _ in rows}
                held_out[lang] |= {ref for _, ref in rows}

    pairs: dict[str, dict[tuple[str, str], str]] = {d: {} for d in ADAPTER_DIRECTIONS}
    for kind in UI_KINDS:
        for en, by_lang in ui[kind].items():
            if en in test_en:
                continue
            for lang, variants in by_lang.items():
                for text, _ in variants.most_common(2):
                    if text in held_out[lang]:
                        continue
                    _add(pairs, en, lang, text, kind)
    rng.shuffle(extra)
    per_lang: Counter[str] = Counter()
    for en, lang, text, origin in extra:
        if en in test_en or text in held_out[lang] or per_lang[lang] >= max_dictionary_pairs:
            continue
        if _add(pairs, en, lang, text, origin.split(":")[0]):
            per_lang[lang] += 1
    rng.shuffle(help_train)
    per_lang.clear()
    for en, lang, text in help_train:
        if en in test_en or text in held_out[lang] or per_lang[lang] >= max_help_pairs:
            continue
        if _add(pairs, en, lang, text, HELP_KIND):
            per_lang[lang] += 1
    para_train = [(en, lang, text, origin) for page, en, lang, text, origin in para_pairs
                  if not is_held_out_page(page, _held_out_percent(origin))
                  and not (origin == MANUAL_KIND and _tag_held_out(page))]
    rng.shuffle(para_train)
    per_lang.clear()
    for en, lang, text, origin in para_train:
        if en in test_en or text in held_out[lang] or per_lang[lang] >= max_paragraph_pairs:
            continue
        if _add(pairs, en, lang, text, origin, max_spans=PARAGRAPH_MAX_SPANS):
            per_lang[lang] += 1
    for page, en, lang, text in tagged:
        if not _tag_held_out(page) and en not in test_en and text not in held_out[lang]:
            _add(pairs, en, lang, text, TAGGED_KIND, max_spans=TAG_MAX_SPANS)

    for direction, items in pairs.items():
        corpus.preferred[direction] = [(s, t, o) for (s, t), o in items.items()]  # insertion order: most common first
        corpus.train[direction] = [(s, t, o) for (s, t), o in items.items()]
        corpus.train[direction] += [row for row in corpus.train[direction] if row[2] == TAGGED_KIND] * (TAG_REPEAT - 1)
        rng.shuffle(corpus.train[direction])
        corpus.stats[direction] = dict(Counter(items.values()))
        corpus.stats[direction]["train"] = len(items)
        corpus.stats[direction]["test"] = len(corpus.test[direction])
        corpus.stats[direction]["help_test"] = len(corpus.help_test.get(direction, []))
        corpus.stats[direction]["para_test"] = len(corpus.para_test.get(direction, []))
        corpus.stats[direction]["tag_test"] = len(corpus.tag_test.get(direction, []))
    corpus.stats["es2de"] = {"train": 0, "test": len(corpus.test["es2de"])}
    return corpus


def help_sentences(en: str, text: str, lang: str) -> list[tuple[str, str]]:
    """Sentence pairs of one aligned help paragraph: the paragraph itself when it is short, else its sentences
    when both sides split into the same number (pysbd); otherwise nothing (no guessing at alignment)."""
    if len(en) <= HELP_MAX_CHARS and len(text) <= HELP_MAX_CHARS:
        candidates = [(en, text)]
    else:
        en_parts = split_text(en, "en").segments
        other_parts = split_text(text, lang).segments
        candidates = list(zip(en_parts, other_parts)) if len(en_parts) == len(other_parts) else []
    kept = []
    for source, target in candidates:
        source, target = clean(source, HELP_MAX_CHARS), clean(target, HELP_MAX_CHARS)
        if source and target and source != target and not is_key_like(source) and _ratio_ok(source, target, lang):
            kept.append((source, target))
    return kept


def paragraph_segments(en: str, text: str, lang: str, short: bool = True) -> list[tuple[str, str]]:
    """Training segments longer than a sentence from one aligned paragraph: the paragraph itself when it fits
    PARAGRAPH_MAX_CHARS, and, when both sides split into the same number of sentences (pysbd), every run of two
    neighbouring sentences. With `short`, the paragraph's single sentences and a paragraph of HELP_MAX_CHARS or
    less are included too (help_sentences gives those for LibreOffice's help). Both help readers collapse
    whitespace already."""
    candidates: list[tuple[str, str]] = []
    if short or len(en) > HELP_MAX_CHARS or len(text) > HELP_MAX_CHARS:
        candidates.append((en, text))
    en_parts, other_parts = split_text(en, "en").segments, split_text(text, lang).segments
    if short and len(en_parts) == len(other_parts) > 1:
        candidates.extend(zip(en_parts, other_parts))
    if len(en_parts) == len(other_parts) > 2:     # with two sentences, the run of two is the paragraph
        joiner = "" if lang == "zh" else " "
        candidates.extend((f"{en_parts[i]} {en_parts[i + 1]}", f"{other_parts[i]}{joiner}{other_parts[i + 1]}")
                          for i in range(len(en_parts) - 1))
    kept = []
    for source, target in candidates:
        source, target = clean(source, PARAGRAPH_MAX_CHARS), clean(target, PARAGRAPH_MAX_CHARS)
        if source and target and source != target and not is_key_like(source) and _ratio_ok(source, target, lang):
            kept.append((source, target))
    return list(dict.fromkeys(kept))


def is_held_out_page(page: str, percent: int | None = None) -> bool:
    """Whether `page` is held out: `percent` of pages (LibreOffice's help share when None, read at call time)."""
    return zlib.crc32(page.encode("utf-8")) % 100 < (HELP_HELD_OUT_PERCENT if percent is None else percent)


def _held_out_percent(origin: str) -> int:
    return {PARA_KIND: PARA_HELD_OUT_PERCENT, MAN_KIND: 0, MANUAL_KIND: 0}.get(origin, HELP_HELD_OUT_PERCENT)


def _tag_held_out(page: str) -> bool:
    """Whether a manual page ("manuals:gimp-help/foo" or "tagged:gimp-help/foo": the same page) is held out for
    the tagged test."""
    return is_held_out_page(page.split(":", 1)[-1], TAG_HELD_OUT_PERCENT)


def _hold_out_tagged(tagged: list[tuple[str, str, str, str]], corpus: Corpus, size: int, rng: random.Random
                     ) -> tuple[set[str], dict[str, set[str]]]:
    """Fill `corpus.tag_test` with the tagged segments of the held-out manual pages, as the reader gave them
    (markup sentinels spaced). Returns every held-out English segment and reference."""
    tested: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for page, en, lang, text in tagged:
        if _tag_held_out(page):
            tested[lang].append((en, text))
    _sample_both_ways(tested, size, rng, corpus.tag_test)
    # The same blocks read plain (the manuals' source flattens the markup) are held out too.
    both = {lang: [(e, t) for en, text in rows for e, t in ((en, text), (_plain(en), _plain(text)))]
            for lang, rows in tested.items()}
    return ({en for rows in both.values() for en, _ in rows}, {lang: {t for _, t in rows} for lang, rows in both.items()})


def _plain(tagged: str) -> str:
    return " ".join(SENTINEL.sub(" ", tagged).split())


def _hold_out_paragraphs(paragraphs: list[tuple[str, str, str, str]], corpus: Corpus, size: int,
                         rng: random.Random) -> tuple[set[str], dict[str, set[str]]]:
    """Fill `corpus.para_test` with whole paragraphs of GNOME's held-out help pages: real prose of
    PARA_TEST_MIN_CHARS to PARAGRAPH_MAX_CHARS, translated (not left in English). Returns every held-out English
    paragraph and reference, tested or not, for the caller to keep out of training."""
    tested: dict[str, list[tuple[str, str]]] = defaultdict(list)
    held_en: set[str] = set()
    held_refs: dict[str, set[str]] = defaultdict(set)
    for page, en, lang, text in paragraphs:
        if not is_held_out_page(page, PARA_HELD_OUT_PERCENT):
            continue
        held_en.add(en)
        held_refs[lang].add(text)
        if (PARA_TEST_MIN_CHARS <= len(en) <= PARAGRAPH_MAX_CHARS and len(en.split()) >= 6 and en != text
                and _ratio_ok(en, text, lang)):
            tested[lang].append((en, text))
    _sample_both_ways(tested, size, rng, corpus.para_test)
    return held_en, dict(held_refs)


def _sample_both_ways(tested: dict[str, list[tuple[str, str]]], size: int, rng: random.Random,
                      target: dict[str, list[tuple[str, str]]]) -> None:
    """Up to `size` distinct (en, text) pairs per language, sorted, as en→X and X→en tests into `target`."""
    for lang in LANGS:
        unique = sorted(set(tested[lang]))
        chosen = sorted(rng.sample(unique, min(size, len(unique))))
        if chosen:
            target[f"en2{lang}"] = chosen
            target[f"{lang}2en"] = [(t, e) for e, t in chosen]


def _hold_out_help(help_pairs: list[tuple[str, str, str, str]], corpus: Corpus, test_size: int, rng: random.Random
                   ) -> tuple[list[tuple[str, str, str]], set[str], dict[str, set[str]]]:
    """Fill `corpus.help_test` from the held-out pages (sentences of four words or more: real sentences, not
    menu names). Returns the other pages' triples (en, lang, text) and the held-out English sentences and
    references, which the caller keeps out of every source."""
    tested: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for page, en, lang, text in help_pairs:
        if is_held_out_page(page) and len(en.split()) >= 4 and not protect(en).spans:
            tested[lang].append((en, text))
    _sample_both_ways(tested, test_size, rng, corpus.help_test)
    help_en = {en for rows in tested.values() for en, _ in rows}
    help_refs = {lang: {t for _, t in rows} for lang, rows in tested.items()}
    return [(en, lang, text) for page, en, lang, text in help_pairs if not is_held_out_page(page)], help_en, help_refs


def _add(pairs: dict[str, dict[tuple[str, str], str]], en: str, lang: str, text: str, origin: str,
         max_spans: int = MAX_SPANS) -> bool:
    masked = mask_pair(en, text, max_spans)
    if masked is None:
        return False
    m_en, m_text = masked
    pairs[f"en2{lang}"].setdefault((m_en, m_text), origin)
    back = mask_pair(text, en, max_spans)
    if back is not None:
        pairs[f"{lang}2en"].setdefault(back, origin)
    return True


# --- on disk: data/demo/{train,test,frequent}/<direction>.jsonl + stats.json ----------------------------------

def write_corpus(corpus: Corpus, root: Path) -> None:
    for part, rows in (("train", corpus.train), ("test", corpus.test), ("frequent", corpus.frequent),
                       ("help_test", corpus.help_test), ("para_test", corpus.para_test),
                       ("tag_test", corpus.tag_test)):
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
    for part, target in (("test", corpus.test), ("frequent", corpus.frequent), ("help_test", corpus.help_test),
                         ("para_test", corpus.para_test), ("tag_test", corpus.tag_test)):
        for direction_file in sorted((root / part).glob("*.jsonl")):   # no such folder: an older extraction
            target[direction_file.stem] = [(r["src"], r["tgt"]) for r in read_jsonl(direction_file)]
    return corpus
