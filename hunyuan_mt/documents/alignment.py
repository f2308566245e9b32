"""Markup placed in a whole-sentence translation: where do a segment's sentinels go in the translation of its text
without them?

A formatted segment (`Your ⟦0⟧account⟦1⟧ has been created.`) is translated as a whole sentence without its markup
(`Se ha creado la cuenta de usuario.`), which reads as well as an unformatted sentence, and each piece between the
sentinels on its own (`account` → `cuenta`), through the memory like any segment. The translation is then cut into
one slice per source piece, in order: a segmentation of its words, found by dynamic programming, in which each word
scores for the piece whose candidates hold a word like it, as the share of that candidate it covers (so a short
formatted piece weighs as much as a long plain one). The candidates of a piece are its translation alone and, when
the model gave the markup back in order, the piece as that tagged translation had it (`hints`): that says where a
target that reorders put the formatted words. Every piece with words that may be inside an element gets at least
one word; a word that another piece claims costs something inside a piece that found words of its own, and one
nobody claims goes by position.

The sentinels then sit between the slices, so they come back once each and in order: the markup stays valid
whatever the translation did. A placement is `confident` when the text of each element (a piece glued to its
sentinels) found its candidates' words and is at least half made of them; otherwise the caller marks the segment
for review. `None` when the translation has fewer words than the source has pieces that need one, or is too long
for its number of pieces (`MAX_WORK`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from rapidfuzz import fuzz

from ..text import masking

_CJK_CHAR = r"[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff]"
#: One Chinese/Japanese/Korean character, a word of a spaced script, or a run of anything else (spaces, marks).
_TOKEN = re.compile(rf"{_CJK_CHAR}|(?:(?!{_CJK_CHAR})[^\W_])+|[\W_]+")
_CJK = re.compile(_CJK_CHAR)
#: How alike two words must be (rapidfuzz ratio, 0-100) to count as the same word in another form (cuenta/cuentas).
_ALIKE = 70.0
#: What a word costs, per share of the translation's letters, where no candidate of its piece holds it: in a piece
#: with no words of its own between two sentinels (inside one element and outside the next: hardly ever right), at
#: either end of the segment (outside every element); in a piece glued to its sentinels (`⟦0⟧Save⟦1⟧`: an
#: element's text, kept tight around its words) when another piece's candidates hold it (a reordered sentence's
#: other words stay out of a bold run) or when none does; and in a piece spaced from them (text between elements)
#: when another piece's candidates hold it.
_BETWEEN = 2.0
_EDGE = 0.25
_CLAIMED = 1.0
_LOOSE = 0.1
_CLAIMED_OUTSIDE = 0.5
#: How much more a word of an element's text weighs than one of the text around the elements.
_ELEMENT = 2.0
#: The weight of a word's distance from its piece's place in the source: breaks ties for words nobody claims.
_POSITION = 0.05
#: Share of an element's letters that must match its candidates for a confident placement.
_MATCHED = 0.5
#: Tokens × pieces past which no placement is tried (the segmentation's time grows with their product and with the
#: pieces again: 500 runs of one paragraph took 1.5 s); such a segment goes piece by piece, in linear time.
MAX_WORK = 100_000


@dataclass(frozen=True)
class Placement:
    """The translation with the source's sentinels in it, and whether the slices matched their pieces well."""

    text: str
    confident: bool
    #: Per source piece: whether its slice holds a word its candidates have (all True when the model placed them).
    matched: tuple[bool, ...] = ()


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def _is_word(token: str) -> bool:
    return any(ch.isalnum() for ch in token)


def element_pieces(pieces: Sequence[str]) -> list[bool]:
    """Which pieces with words are glued to the sentinels beside them (`⟦0⟧Save⟦1⟧`, `Cancel⟦0⟧` at the start):
    an element's text or a run's, as opposed to text spaced from the markup around it."""
    last = len(pieces) - 1
    return [any(ch.isalnum() for ch in piece) and (k == 0 or not piece[:1].isspace())
            and (k == last or not piece[-1:].isspace()) for k, piece in enumerate(pieces)]


def needs_words(pieces: Sequence[str]) -> list[bool]:
    """Which pieces must keep a word of their own in a translation. One with words between two sentinels, or its
    formatting would sit on nothing; so does one at an end that is glued to its sentinel: a reader leaves out the
    end tag of an element that closes the segment (`could not acquire ⟦0⟧credentials`), so that piece is a link's
    text. One spaced from its sentinel is text around the elements, which a target that reorders may empty
    (`modifier les paramètres de ⟦0⟧serveur⟦1⟧`)."""
    last = len(pieces) - 1
    return [any(ch.isalnum() for ch in piece) and (0 < k < last or last == 0 or (k == 0 and not piece[-1:].isspace())
                                                   or (k == last and not piece[:1].isspace()))
            for k, piece in enumerate(pieces)]


def last_word(text: str) -> str:
    """The word `text` ends with ("" when it ends otherwise): a spaced script's last word, or its last two Chinese
    or Japanese characters (about a word)."""
    tokens = _tokens(text)
    if not tokens or not _is_word(tokens[-1]):
        return ""
    if _CJK.match(tokens[-1]):
        return "".join(tokens[-2:]) if len(tokens) > 1 and _CJK.match(tokens[-2]) else tokens[-1]
    return tokens[-1]


def _letters(text: str) -> int:
    return sum(len(w) for w in _tokens(text) if _is_word(w))


def _weights(tokens: list[str], candidates: Sequence[str]) -> list[float]:
    """Per token of the translation: the share of a candidate it stands for (its length over the candidate's
    letters when a word of that candidate is like it, else 0), the best over `candidates`."""
    out = [0.0] * len(tokens)
    for candidate in candidates:
        size = _letters(candidate)
        words = {w.casefold() for w in _tokens(candidate) if _is_word(w)}
        if not size:
            continue
        for i, token in enumerate(tokens):
            if not _is_word(token):
                continue
            folded = token.casefold()
            if folded in words:
                alike = 1.0
            elif _CJK.match(token):
                alike = 0.0
            else:
                best = max(fuzz.ratio(folded, w) for w in words)
                alike = best / 100 if best >= _ALIKE else 0.0
            out[i] = max(out[i], min(len(token), size) * alike / size)
    return out


def place_markup(source: str, translation: str, alone: Sequence[str | None],
                 hints: Sequence[str] | None = None,
                 guesses: Sequence[str | None] | None = None) -> Placement | None:
    """`translation` (of `source` without its sentinels) with `source`'s sentinels ⟦0⟧ … ⟦n-1⟧ placed in it.

    `alone[k]`: the k-th piece of `source` (between sentinels) translated on its own, None for a piece with no
    words; `hints`: the pieces of a translation of `source` that gave its sentinels back in order, if there was
    one; `guesses[k]`: a word that may be the k-th piece's, taken only when no other candidate of it is in the
    translation at all, and then the placement is not confident."""
    count = masking.sentinel_count(source)
    pieces = masking.split_at_sentinels(source, count)
    if pieces is None or len(alone) != len(pieces) or (hints is not None and len(hints) != len(pieces)):
        return None
    tokens = _tokens(translation)
    if len(tokens) * len(pieces) > MAX_WORK:
        return None
    words = [i for i, t in enumerate(tokens) if _is_word(t)]
    content = [any(ch.isalnum() for ch in piece) for piece in pieces]
    needed = needs_words(pieces)
    if not words or sum(needed) > len(words):
        return None
    candidates = [[c for c in ([alone[k]] if alone[k] else []) + ([hints[k]] if hints else []) if c and c.strip()]
                  for k in range(len(pieces))]
    weights = [_weights(tokens, cands) for cands in candidates]
    # A word several pieces' candidates hold ("de", "the") says little about where it belongs: shared between them.
    for i in words:
        claims = sum(w[i] > 0 for w in weights)
        if claims > 1:
            for w in weights:
                w[i] /= claims
    tight = element_pieces(pieces)
    # Where the order of the target leaves no way to give every piece its words, an element's text wins over the
    # text around the elements: the formatting is what the placement is for.
    for k in range(len(pieces)):
        if tight[k]:
            weights[k] = [w * _ELEMENT for w in weights[k]]
    guessed = False
    for k, guess in enumerate(guesses or ()):
        if guess and content[k] and not any(weights[k]):
            weights[k] = [w * (_ELEMENT if tight[k] else 1.0) for w in _weights(tokens, [guess])]
            guessed = guessed or any(weights[k])
    assignment = _segment(tokens, [max(len(p.strip()), 1) for p in pieces], content, needed, tight, weights)
    if assignment is None:
        return None
    slices = [""] * len(pieces)
    for token, k in zip(tokens, assignment):
        slices[k] += token
    slices = _respace(slices, pieces)
    hit = tuple(any(weights[k][i] > 0 for i in words if assignment[i] == k) for k in range(len(pieces)))
    # Sure when every element's text found its own words and is mostly made of them: the formatting sits where it
    # belongs. The text around the elements may be worded otherwise alone.
    sure = not guessed and all(_held(k, tokens, words, assignment, weights) for k in range(len(pieces))
                               if tight[k] and candidates[k])
    return Placement(masking.join_pieces(slices), sure, hit)


def _held(piece: int, tokens: list[str], words: list[int], assignment: list[int],
          weights: list[list[float]]) -> bool:
    """Whether a piece's slice holds a word of its candidates, and those words make up at least `_MATCHED` of its
    letters."""
    mine = [i for i in words if assignment[i] == piece]
    matched = sum(len(tokens[i]) for i in mine if weights[piece][i] > 0)
    return matched > 0 and matched >= _MATCHED * sum(len(tokens[i]) for i in mine)


def _segment(tokens: list[str], sizes: list[int], content: list[bool], needed: list[bool], tight: list[bool],
             weights: list[list[float]]) -> list[int] | None:
    """Each token's piece: non-decreasing, every `needed` piece given at least one word, the sum of the tokens'
    weights for their pieces, less the costs of words no candidate of their piece holds (`_stray`, `_POSITION`:
    `sizes` are the source pieces' lengths; `content`, which have words; `tight`, which are glued to their
    sentinels), as large as it can be."""
    n_tokens, n_pieces = len(tokens), len(content)
    whole = float(sum(sizes))
    middles = [(sum(sizes[:k]) + sizes[k] / 2) / whole for k in range(n_pieces)]
    letters = float(sum(len(t) for t in tokens if _is_word(t)))
    claimed = [any(w[i] > 0 for w in weights) for i in range(n_tokens)]
    # A piece none of whose candidates' words is in the translation anywhere takes other pieces' words for free:
    # they are the text around the pieces that did find theirs.
    anchored = [any(w) for w in weights]
    negative = float("-inf")
    # A state: piece k, and whether it holds a word yet (index 2k + filled).
    best = [negative] * (2 * n_pieces)
    for k in range(n_pieces):  # before the first token: the first piece, or one after pieces that may stay empty
        if not any(needed[:k]):
            best[2 * k] = 0.0
    back: list[list[int]] = []
    for i, token in enumerate(tokens):
        word = _is_word(token)
        share = len(token) / letters if word else 0.0
        position = (i + 0.5) / n_tokens
        step = [negative] * (2 * n_pieces)
        came = [-1] * (2 * n_pieces)
        for state in range(2 * n_pieces):
            if best[state] == negative:
                continue
            k, filled = divmod(state, 2)
            for target in range(k, n_pieces):
                # Moving on closes piece k (it must hold a word if it has words) and skips the pieces between,
                # which must be allowed to stay empty.
                if target > k and ((needed[k] and not filled) or (target > k + 1 and needed[target - 1])):
                    break
                weight = weights[target][i]
                value = best[state] + weight - _POSITION * abs(position - middles[target]) * share
                if word and not weight:
                    value -= _stray(target, content[target], tight[target], claimed[i] and anchored[target],
                                    n_pieces) * share
                now = 2 * target + int(word or (target == k and bool(filled)))
                if value > step[now]:
                    step[now], came[now] = value, state
        best = step
        back.append(came)
    ends = [(best[state], state) for state in range(2 * n_pieces) if best[state] != negative
            and (state % 2 or not needed[state // 2]) and not any(needed[state // 2 + 1:])]
    if not ends:
        return None
    state = max(ends)[1]
    out = [0] * n_tokens
    for i in range(n_tokens - 1, -1, -1):
        out[i] = state // 2
        state = back[i][state]
    return out


def _stray(piece: int, content: bool, tight: bool, claimed: bool, pieces: int) -> float:
    """What a word no candidate of `piece` holds costs there, per share of the translation's letters."""
    if not content:
        return _EDGE if piece in (0, pieces - 1) else _BETWEEN
    if tight:
        return _CLAIMED if claimed else _LOOSE
    return _CLAIMED_OUTSIDE if claimed else 0.0


def _respace(slices: list[str], pieces: list[str]) -> list[str]:
    """Spaces and punctuation at a slice's edge move out where the source's piece starts (or ends) with a letter or
    digit on that side (`la ⟦0⟧cuenta⟦1⟧, de`, not `la⟦0⟧ cuenta, ⟦1⟧de`): past the empty pieces between adjacent
    sentinels too, so they leave every element the piece is in (`La <b><i>pantalla</i></b>`, not
    `La<b> <i>pantalla</i>`)."""
    out = list(slices)
    for k in range(len(out)):
        if not any(ch.isalnum() for ch in out[k]):
            continue
        left = next((j for j in range(k - 1, -1, -1) if pieces[j] or j == 0), None)
        if left is not None and pieces[k][:1].isalnum():
            body = _lstrip_marks(out[k])
            out[left] += out[k][:len(out[k]) - len(body)]
            out[k] = body
        right = next((j for j in range(k + 1, len(out)) if pieces[j] or j == len(out) - 1), None)
        if right is not None and pieces[k][-1:].isalnum():
            body = _rstrip_marks(out[k])
            out[right] = out[k][len(body):] + out[right]
            out[k] = body
    return out


def _lstrip_marks(text: str) -> str:
    start = 0
    while start < len(text) and not text[start].isalnum():
        start += 1
    return text[start:]


def _rstrip_marks(text: str) -> str:
    end = len(text)
    while end > 0 and not text[end - 1].isalnum():
        end -= 1
    return text[:end]
