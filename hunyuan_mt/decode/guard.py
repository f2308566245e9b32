"""Degenerate output: a row caught in a repetition loop, or running far longer than its source.

A weak or confused model can fall into "de vez de vez de vez …" and only stop at the token limit: the caller waits
for hundreds of useless steps and gets a paragraph of noise. Two rules, per row, depending on the row alone (so a
row's output stays what it would be alone):

- `output_cap`: a row may generate at most `ratio` × its input tokens + `slack` (never above the absolute limit);
- `LoopGuard.cut`: when the generated tokens end in a unit of at most `max_period` tokens repeated `repeats` times
  (and the repeats cover at least `min_span` tokens), the row stops and keeps one copy of the unit.
- `LoopGuard.third_copy`: a short stutter ("ha ha", "Fi-Fi") is below `min_span`, and stopping the row there would
  lose the rest of its translation; instead the token that would begin a third copy is forbidden for the next step
  and the row goes on. On held-out paragraphs this took en→X outputs with a phrase said three times from 15 of
  743 to none while chrF rose by up to 0.3 (BENCHMARKS.md); stopping rows at a 3-token span instead cost 0.3–0.4.

The decode loop asks `cut` after every token, so a looping row leaves the batch at once; rows that ran in
transformers' `generate` (beam search) are cut afterwards, on their final tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def output_cap(input_tokens: int, absolute: int, ratio: float, slack: int) -> int:
    """New tokens a row may generate: `ratio` × `input_tokens` + `slack`, at most `absolute`; ratio 0: absolute."""
    if ratio <= 0:
        return absolute
    return max(1, min(absolute, math.ceil(ratio * input_tokens) + slack))


@dataclass(frozen=True)
class LoopGuard:
    """Finds a repetition loop at the end of a row's generated tokens. `repeats` 0 turns it off."""

    repeats: int = 3
    max_period: int = 8
    min_span: int = 8
    #: Forbid the token that would begin a third copy of a short unit (third_copy); off, only `cut` acts.
    stutter: bool = True

    @property
    def enabled(self) -> bool:
        return self.repeats >= 2

    def cut(self, generated: list, end: int | None = None) -> int | None:
        """How many tokens to keep when `generated[:end]` ends in a loop (the text before it and one copy of the
        repeated unit), else None. Works on any list: token ids, or words."""
        if not self.enabled:
            return None
        n = len(generated) if end is None else end
        for period in range(1, self.max_period + 1):
            needed = max(self.repeats * period, self.min_span)
            if n < needed:
                break
            if generated[n - 1] != generated[n - 1 - period]:
                continue  # not even two copies (the common case: a check per period, no slicing)
            unit = generated[n - period:n]
            count = 1
            # Walk back one unit at a time while the copies match.
            while (count + 1) * period <= n and generated[n - (count + 1) * period:n - count * period] == unit:
                count += 1
            if count >= self.repeats and count * period >= self.min_span:
                return n - (count - 1) * period
        return None

    def third_copy(self, generated: list) -> int | None:
        """The token that would start a third copy of the unit `generated` ends with twice (the shortest such
        unit of at most `max_period` tokens), else None."""
        if not self.enabled or not self.stutter:
            return None
        n = len(generated)
        for period in range(1, min(self.max_period, n // 2) + 1):
            if generated[n - 1] != generated[n - 1 - period]:
                continue
            if generated[n - 2 * period:n - period] == generated[n - period:]:
                return generated[n - period]
        return None

    def has_loop(self, tokens: list) -> bool:
        """Whether a loop ends anywhere in `tokens`. A source that repeats itself ("ha ha ha ha …") may be
        translated by a repeating output: the engine leaves such rows unguarded."""
        return self.enabled and any(self.cut(tokens, end) is not None
                                    for end in range(self.min_span, len(tokens) + 1))

    def cut_words(self, text: str) -> str:
        """`text` with a loop of words at its end cut to one copy (outputs known only as text: beam search)."""
        words = text.split(" ")
        keep = self.cut(words)
        return text if keep is None else " ".join(words[:keep])
