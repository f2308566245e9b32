"""Do-not-translate spans: mask them before translation, put them back verbatim after.

Placeholders (`%s`, `%(name)s`, `{0}`, `{name}`), markup tags, URLs, e-mail addresses, file names and extensions,
numbers, `code spans`, prices, key names and shortcuts, paths, and emoji and other symbols are replaced by sentinel
tokens `⟦0⟧`, `⟦1⟧`, ... that a model copies (the demo model is trained on text masked this way and its tokenizer knows the sentinels as whole tokens). Any backbone works: `restore` does not trust the
model, it puts every span back exactly once, removes duplicated or invented sentinels and appends dropped ones.
"""

from __future__ import annotations

import re
import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field

SENTINEL_OPEN = "⟦"
SENTINEL_CLOSE = "⟧"
#: How many distinct sentinels the demo tokenizer learns as whole tokens; more spans still work, as plain text.
SENTINEL_VOCAB = 16


def sentinel(index: int) -> str:
    return f"{SENTINEL_OPEN}{index}{SENTINEL_CLOSE}"


def sentinel_tokens(count: int = SENTINEL_VOCAB) -> list[str]:
    return [sentinel(i) for i in range(count)]


def char_class(wanted: set[int]) -> str:
    """A regex character class of exactly these code points, as ranges (Python's re has no \\p{...})."""
    ranges: list[str] = []
    points = sorted(wanted)
    start = prev = points[0]
    for cp in points[1:] + [-1]:
        if cp == prev + 1:
            prev = cp
            continue
        ranges.append(re.escape(chr(start)) + ("" if start == prev else "-" + re.escape(chr(prev))))
        start = prev = cp
    return "[" + "".join(ranges) + "]"


def _symbol_class() -> str:
    """A character class of every "other symbol" (Unicode So: emoji, dingbats, ★ ✅ © °), the arrows block and
    the bullets, built once from unicodedata."""
    wanted = set(range(0x2190, 0x2200)) | {ord(c) for c in "•‣◦⁃∙"}
    wanted |= {cp for cp in range(0x20000) if unicodedata.category(chr(cp)) == "So"}
    return char_class(wanted)


_SYMBOL = _symbol_class()
# An emoji is often a sequence: a variation selector (⚠️), a skin tone, a keycap, or people joined by ZWJ.
_SYMBOLS = rf"{_SYMBOL}(?:[\uFE0F\u200D\u20E3\U0001F3FB-\U0001F3FF]|{_SYMBOL})*"
# Key names as keyboards print them, in the languages of the demo (Strg, Umschalt, Mayús, Maj, ...).
_KEY_NAMES = (r"(?:Ctrl|Control|Strg|AltGr|Alt|Shift|Umschalt|Mayús|Mayus|Maj|Cmd|Command|Option|Opt|Meta|Super|"
              r"Win|Fn|Esc|Tab|Enter|Return|Space|Del|Delete|Entf|Supr|Suppr|Ins|Einfg|Home|End|PgUp|PgDn|"
              r"Backspace)")
_KEY = rf"(?:{_KEY_NAMES}|F\d{{1,2}}|[A-Z0-9]|[⌘⌥⇧⌃←→↑↓])"
_KEYS = (rf"(?<![\w+])(?:{_KEY_NAMES}(?:\s?\+\s?{_KEY})+"      # Ctrl+S, Ctrl + Shift + P, Strg+Umschalt+N
         rf"|[⌘⌥⇧⌃]+[A-Z0-9](?![\w])"                         # ⌘Q, ⌘⇧Z
         rf"|(?:Ctrl|Strg|Cmd|AltGr)(?![\w+])"                  # a modifier named alone ("hold Ctrl")
         rf"|F\d{{1,2}}(?![\w]))")                              # F5, F11
_CURRENCY = "$€£¥₹₩₽¢"
_AMOUNT = r"\d+(?:[.,\u00a0 ]\d{3})*(?:[.,]\d+)?"
_PRICE = rf"[{_CURRENCY}]\s?{_AMOUNT}|(?<![\w.,]){_AMOUNT}\s?[{_CURRENCY}]"
# Absolute, home and relative paths (/tmp, ~/.config/x.json, ../src/main.c); Windows paths with a drive letter.
_PATH = (r"(?<![\w/.~])(?:~|\.{1,2})?/[\w.-]+(?:/[\w.-]+)*/?(?<![.,;:])"
         r"|\b[A-Za-z]:\\(?:[\w.-]+\\?)+")

# File names, globs and extensions (report.txt, settings.json, archive.tar.gz, docs/intro.md, *.po, ".docx"): a
# model turned `settings.json` into `设置.json`. A name is Latin, Greek or Cyrillic letters, digits, `_` and `-`
# (Chinese text around it is not part of it: `打开settings.json`), its parts joined by dots or slashes. The
# extension is a known one in any case, or any lowercase one of 2-8 characters after a name of 2+ characters: so
# "e.g.", "z.B." and "Mr.Smith" stay text.
_FILE_CHAR = r"A-Za-z0-9_\u00C0-\u024F\u0370-\u03FF\u0400-\u04FF"
_FILE_NAME_PART = rf"[{_FILE_CHAR}][{_FILE_CHAR}-]*"
_KNOWN_EXTENSIONS = (
    "txt|text|md|rst|log|csv|tsv|json|jsonl|xml|html?|xhtml|css|scss|ya?ml|toml|ini|cfg|conf|env|lock|"
    "docx?|xlsx?|pptx?|odt|ods|odp|rtf|pdf|epub|tex|bib|srt|vtt|po|pot|mo|xliff|xlf|tmx|"
    "png|jpe?g|gif|svg|webp|bmp|ico|tiff?|psd|mp3|mp4|wav|ogg|flac|avi|mkv|mov|webm|"
    "zip|tar|gz|tgz|bz2|xz|zst|7z|rar|iso|img|dmg|deb|rpm|apk|msi|exe|dll|so|dylib|jar|whl|bin|dat|db|sqlite|"
    "py|pyc|ipynb|js|mjs|ts|jsx|tsx|java|kt|c|h|cc|cpp|hpp|cs|go|rs|rb|php|pl|lua|swift|sh|bash|zsh|bat|ps1|sql|"
    "bak|tmp|pem|crt|key|ttf|otf|woff2?")
_FILENAME = (rf"(?<![{_FILE_CHAR}.@/\\-])"
             rf"(?:(?:\*|{_FILE_NAME_PART}(?:[./\\]{_FILE_NAME_PART})*)\.(?i:{_KNOWN_EXTENSIONS})"
             rf"|[{_FILE_CHAR}]{{2}}[{_FILE_CHAR}-]*(?:[./\\]{_FILE_NAME_PART})*\.[a-z][a-z0-9]{{1,7}}"
             rf"|\.(?:(?i:{_KNOWN_EXTENSIONS})|[a-z][a-z0-9]{{1,7}}))"
             rf"(?![{_FILE_CHAR}-]|\.[{_FILE_CHAR}])")
# 20+ characters of letters and digits (and base64's + / =) mixed, with no space: a checksum, a key, an id.
_OPAQUE = r"(?<![\w+/=])(?=[A-Za-z0-9+/]*\d)(?=[A-Za-z0-9+/]*[A-Za-z])[A-Za-z0-9+/]{20,}={0,2}(?![\w+/=])"
# Version strings as semver writes them (v3.0.0-beta.2, 2.1.0+build.5, v2): one span, or the model rewrote the
# pre-release ("v3.0.2", "v3.0-beta.2"). A bare 3.0.0 is a number below; without a "v", a pre-release must hold a
# letter, so 2024-05 and 1.5-2 stay numbers.
_SEMVER_PRE = r"-[0-9A-Za-z]+(?:\.[0-9A-Za-z]+)*"
_SEMVER_BUILD = r"\+[0-9A-Za-z]+(?:\.[0-9A-Za-z]+)*"
_VERSION = (rf"(?<![\w.])(?:[vV]\d+(?:\.\d+)*(?:{_SEMVER_PRE})?(?:{_SEMVER_BUILD})?"
            rf"|\d+(?:\.\d+){{1,3}}(?:(?=-[0-9A-Za-z.]*[A-Za-z]){_SEMVER_PRE}(?:{_SEMVER_BUILD})?|{_SEMVER_BUILD}))"
            r"(?![\w])")
#: A markup tag, start or end (`<b>`, `</a>`, `<img src="x"/>`): a span of its own here, and what `inline` counts
#: as markup in a text sent with format=html.
MARKUP_TAG = r"</?[A-Za-z][\w:.-]*(?:\s+[^<>]*?)?\s*/?>"
_ISO_DATE = r"(?<![\w.,])\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?(?![\w])"

# One alternation, tried left to right at each position, so the longer constructs (a URL that holds digits, a tag
# that holds an attribute with a number) win over the pieces inside them.
_PATTERNS: tuple[str, ...] = (
    r"⟦\d+⟧",                                                  # sentinel-looking text already in the input
    r"`[^`\n]+`",                                              # `code spans`
    r"<!--.*?-->",                                             # markup comments
    MARKUP_TAG,                                                # markup tags
    r"&(?:[A-Za-z][A-Za-z0-9]{1,31}|#\d{1,7}|#x[0-9A-Fa-f]{1,6});",  # character entities
    r"(?:https?|ftp|file)://[^\s<>\"'`]+",                     # URLs with a scheme
    r"www\.[^\s<>\"'`]+",                                      # bare www URLs
    r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+",                           # e-mail addresses
    _FILENAME,                                                 # report.txt, *.po, archive.tar.gz, .docx
    r"%\([\w.-]+\)[-+ #0]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]",    # %(name)s
    r"%(?:\d+\$)?[-+ #0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t|I64|I32)?[diouxXeEfFgGcrsaApn@]",  # printf
    r"%\d+",                                                   # Qt-style %1
    r"%%",                                                     # literal percent in format strings
    r"\$\{[^{}\s]+\}",                                         # ${var}
    r"%\{[\w.-]+\}",                                            # %{name} (Ruby, Rails i18n)
    r"\{\{\s*[\w.-]+\s*\}\}",                                   # {{count}} (i18next, Handlebars, Jinja)
    r"\{\{|\}\}",                                              # escaped braces of str.format
    r"\{[\w.\[\]]*(?:![rsa])?(?::[^{}]*)?\}",                  # {0}, {name}, {name:>8}, {}
    _KEYS,                                                     # Ctrl+S, Alt+F4, ⌘Q, Strg+Umschalt+N, F5
    _PRICE,                                                    # $19.99, 19,99 €, ¥1200 (before plain numbers)
    _PATH,                                                     # /usr/share/fonts/, ~/.config/x.json, C:\Users
    _VERSION,                                                  # v3.0.0-beta.2, 2.1.0+build.5, v2
    _ISO_DATE,                                                 # 2024-05-17, 2024-05-17T10:30
    _OPAQUE,                                                   # checksums, base64 keys, tokens: never text
    r"(?<![\w.,])[-+]?\d+(?:[.,:/]\d+)*(?:%)?(?![\w])",        # numbers, times, dates, percentages
    _SYMBOLS,                                                  # emoji, ★ ✅ • ➜ → © °: a run of them is one span
)
_SPAN = re.compile("|".join(f"(?:{p})" for p in _PATTERNS), re.S)
# URLs and e-mails do not end on sentence punctuation; give that back to the text.
_TRAILING_PUNCT = re.compile(r"[.,;:!?)\]'\"]+$")
#: A sentinel exactly as `sentinel()` writes it (what documents put in their segments and get back restored).
SENTINEL = re.compile(r"⟦(\d+)⟧")
#: Two letters in a row (no digit, no underscore): a piece between markup sentinels that holds a word, which a
#: translation changes, as opposed to a number, a symbol or a lone letter.
WORD = re.compile(r"[^\W\d_]{2}")
# Tolerant of what models do to the sentinels: spaces inside, full-width or ASCII brackets.
_FOUND = re.compile(r"(?:⟦|\[\[|［［)\s*(\d{1,3})\s*(?:⟧|\]\]|］］)")


@dataclass(frozen=True)
class Protected:
    """Masked text plus the original spans; `spans[i]` is what `⟦i⟧` stands for."""

    text: str
    spans: list[str] = field(default_factory=list)

    @property
    def has_words(self) -> bool:
        """False when nothing but spans, whitespace and punctuation is left: no need to run a model."""
        rest = _FOUND.sub("", self.text)
        return any(ch.isalpha() for ch in rest)


def protect(text: str) -> Protected:
    """Replace every do-not-translate span of `text` by a sentinel, numbered in order of appearance."""
    spans: list[str] = []
    out: list[str] = []
    pos = 0
    for match in _SPAN.finditer(text):
        span = match.group(0)
        start, end = match.start(), match.end()
        if span[0] not in "<`&%{$⟦" and not span[0].isdigit() and span[0] not in "+-":
            # URL or e-mail: trailing punctuation belongs to the sentence.
            trail = _TRAILING_PUNCT.search(span)
            if trail:
                span = span[: trail.start()]
                end = start + len(span)
        if not span:
            continue
        out.append(text[pos:start])
        out.append(sentinel(len(spans)))
        spans.append(span)
        pos = end
    out.append(text[pos:])
    return Protected("".join(out), spans)


def restore(translated: str, protected: Protected) -> str:
    """Put every span of `protected` back into `translated`, verbatim and exactly once.

    A sentinel the model repeated keeps its first occurrence; one it invented is removed; one it dropped is
    appended where it stood relative to the end in the source: before the final punctuation when the source had
    it there, else at the end. Linear in the text and the spans (20,000 dropped codes took minutes when each was
    placed by searching the whole text again; tests/test_hostile_input.py).
    """
    result, seen = _put_back(translated, protected.spans)
    spans = protected.spans
    if len(_FOUND.findall(translated)) > len(seen):
        result = _collapse_spaces(result)
    missing = [i for i in range(len(spans)) if i not in seen]
    if not missing:
        return result
    return _append_all(result, [(spans[i], before) for i, before in zip(missing, _before_final_punctuation(
        protected.text, missing))])


def _before_final_punctuation(masked_source: str, indices: list[int]) -> list[bool]:
    """For each sentinel of `indices`: whether only punctuation and spaces (no letter or digit, sentinels' digits
    included) follow it in the source, and not only spaces: such a span goes before the translation's final
    punctuation. One pass over the source for all of them."""
    last_alnum = next((i for i in range(len(masked_source) - 1, -1, -1) if masked_source[i].isalnum()), -1)
    last_visible = len(masked_source.rstrip()) - 1
    ends = {int(m.group(1)): m.end() for m in SENTINEL.finditer(masked_source)}
    return [index in ends and last_alnum < ends[index] <= last_visible for index in indices]


#: What `_append_all` keeps at the end of a translation when a span goes before its final punctuation.
_FINAL_PUNCT = ".!?。！？:：…"


def _append_all(result: str, items: list[tuple[str, bool]]) -> str:
    """Append each (span, before final punctuation) in order: a span marked `before` goes in front of the result's
    final punctuation run when it has one; any other goes at the end, after a space unless the result is empty or
    ends in whitespace. Pieces in a list, so each span costs its own length."""
    body: list[str] = [result]
    trail = ""
    for span, before in items:
        if before and not trail:
            body, trail = _split_final(body)
        if before and trail:
            _rstrip_pieces(body)
            body += [" ", span]
            continue
        if trail:
            body.append(trail)
            trail = ""
        last = next((piece for piece in reversed(body) if piece), "")
        body += [span] if not last or last[-1].isspace() else [" ", span]
    return "".join(body) + trail


def _split_final(body: list[str]) -> tuple[list[str], str]:
    """(the pieces without their final punctuation run and the spaces after it, that run), or (body, "") when the
    text does not end in such a run. Reads back from the end only as far as the run goes."""
    k, i = len(body) - 1, 0
    seen_punct = False
    while k >= 0:
        piece = body[k]
        i = len(piece)
        while i > 0 and (piece[i - 1] in _FINAL_PUNCT or (not seen_punct and piece[i - 1].isspace())):
            seen_punct = seen_punct or piece[i - 1] in _FINAL_PUNCT
            i -= 1
        if i > 0:
            break
        k -= 1
    if not seen_punct:
        return body, ""
    if k < 0:
        return [], "".join(body)
    # Spaces right before the run stay in the body (the caller strips them); the run starts after them.
    piece = body[k]
    return body[:k] + [piece[:i]], piece[i:] + "".join(body[k + 1:])


def _rstrip_pieces(body: list[str]) -> None:
    while body and not body[-1].rstrip():
        body.pop()
    if body:
        body[-1] = body[-1].rstrip()


def _put_back(translated: str, spans: list[str]) -> tuple[str, set[int]]:
    """Each sentinel's span, at its first occurrence; repeated and invented sentinels removed."""
    seen: set[int] = set()

    def put_back(match: re.Match[str]) -> str:
        index = int(match.group(1))
        if index >= len(spans) or index in seen:
            return ""
        seen.add(index)
        return spans[index]

    return _FOUND.sub(put_back, translated), seen


# The start of a sentinel the model is still writing, at the end of a partial output.
_UNFINISHED = re.compile(r"(?:⟦|\[\[?|［［?)\s*\d{0,3}\s*$")


def restore_prefix(partial: str, protected: Protected) -> str:
    """What can be shown of a translation still being generated: its complete sentinels put back (each once), an
    unfinished one at the end held back, and nothing appended (spans it has not reached yet may still come)."""
    cut = _UNFINISHED.search(partial)
    if cut is not None:
        partial = partial[:cut.start()]
    return _put_back(partial, protected.spans)[0]


def _collapse_spaces(text: str) -> str:
    # Removing a duplicated sentinel can leave two spaces or a space before punctuation behind.
    text = re.sub(r"[ \t]{2,}", " ", text)
    return re.sub(r" +([.,;:!?])", r"\1", text).strip()


def protect_pair(src: str, tgt: str) -> tuple[str, str] | None:
    """A training pair masked on both sides with the same sentinel for the same span, so that a model learns to copy
    sentinels; None when the two sides do not carry the same spans (a translator dropped or changed one)."""
    p_src, p_tgt = protect(src), protect(tgt)
    if sorted(p_src.spans) != sorted(p_tgt.spans):
        return None
    # Target span k is the same string as some source span; number it like the source's first unused one.
    free: dict[str, list[int]] = defaultdict(list)
    for index, span in enumerate(p_src.spans):
        free[span].append(index)
    text = p_tgt.text
    for index, span in enumerate(p_tgt.spans):
        text = text.replace(sentinel(index), f"\x00{free[span].pop(0)}\x00", 1)
    text = re.sub(r"\x00(\d+)\x00", lambda m: sentinel(int(m.group(1))), text)
    return p_src.text, text


def split_at_sentinels(text: str, count: int) -> list[str] | None:
    """`text` cut at ⟦0⟧ … ⟦count-1⟧ when each is there once and in order; None otherwise. Markup whose
    sentinels come back this way is nested as in the source, whatever the translation did around it."""
    matches = list(SENTINEL.finditer(text))
    if [int(m.group(1)) for m in matches] != list(range(count)):
        return None
    pieces: list[str] = []
    pos = 0
    for m in matches:
        pieces.append(text[pos:m.start()])
        pos = m.end()
    pieces.append(text[pos:])
    for i in range(1, len(pieces)):
        if pieces[i - 1][-1:].isspace() and pieces[i][:1].isspace():
            pieces[i] = pieces[i].lstrip()  # "crecieron ⟦0⟧ mucho": one space, not two
    return pieces


def sentinel_count(text: str) -> int:
    """How many sentinels ⟦0⟧ … ⟦n-1⟧ a document segment carries (they are numbered in order)."""
    return len(SENTINEL.findall(text))


def join_pieces(pieces: list[str]) -> str:
    """Pieces back into one text with ⟦0⟧ … ⟦n-2⟧ between them, in order (the inverse of split_at_sentinels)."""
    out = [pieces[0]]
    for index, piece in enumerate(pieces[1:]):
        out.append(sentinel(index))
        out.append(piece)
    return "".join(out)
