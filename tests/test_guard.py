"""The degenerate-output rules on their own: loop detection on token and word lists, the relative output cap."""

from __future__ import annotations

import pytest

from hunyuan_mt.config import LimitsConfig
from hunyuan_mt.decode.guard import LoopGuard, output_cap
from hunyuan_mt.errors import ConfigError


@pytest.mark.parametrize("tokens, keep", [
    ([1, 2, 3, 7, 8, 7, 8, 7, 8, 7, 8], 5),         # a 2-token unit 4 times: keep the text before it and one copy
    ([1, 2, 3, 7, 8, 7, 8, 7, 8], None),            # 3 times, but 6 tokens: under the 8-token span
    ([1, 5, 5, 5, 5, 5, 5, 5, 5], 2),               # 1-token unit: 8 copies reach the 8-token span
    ([1, 5, 5, 5, 5, 5, 5, 5], None),               # 7 copies of 1 token: under the span
    ([4, 7, 8, 9, 7, 8, 9, 7, 8, 9], 4),            # a 3-token unit 3 times (9 tokens)
    ([4, 6, 7, 8, 9, 6, 7, 8, 9], None),            # a 4-token unit only twice
    ([9, 7, 8, 9, 7, 8, 9, 7, 8, 9, 7, 8, 9, 7], 5),  # ends mid-unit: the unit is read from the end (8 9 7)
    ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], None),
])
def test_a_loop_at_the_end_is_cut_to_one_copy(tokens: list[int], keep: int | None) -> None:
    assert LoopGuard().cut(tokens) == keep


def test_a_loop_that_ended_earlier_is_not_the_tails() -> None:
    guard = LoopGuard()
    tokens = [5] * 10 + [1, 2, 3]
    assert guard.cut(tokens) is None and guard.has_loop(tokens)
    assert not guard.has_loop([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3])
    assert guard.cut(tokens, end=10) == 1


@pytest.mark.parametrize("tokens, token", [
    ([1, 2, 5, 5], 5),                       # "ha ha": a third "ha" is forbidden
    ([1, 7, 8, 7, 8], 7),                    # "Fi-Fi": the third copy would start with 7
    ([4, 6, 7, 8, 9, 6, 7, 8, 9], 6),        # a 4-token unit twice
    ([1, 2, 3, 4, 5], None),
    ([5], None),
    ([3, 5, 5, 3, 5, 5], 5),                 # the shortest unit decides: 5 5, not 3 5 5
])
def test_the_third_copy_of_a_short_unit(tokens: list[int], token: int | None) -> None:
    assert LoopGuard().third_copy(tokens) == token
    assert LoopGuard(stutter=False).third_copy(tokens) is None and LoopGuard(repeats=0).third_copy(tokens) is None


def test_words_and_the_switch() -> None:
    guard = LoopGuard()
    assert guard.cut_words("Haga clic de vez de vez de vez de vez") == "Haga clic de vez"
    assert guard.cut_words("Haga clic en Guardar.") == "Haga clic en Guardar."
    assert LoopGuard(repeats=0).cut([5] * 20) is None and not LoopGuard(repeats=0).has_loop([5] * 20)


def test_the_output_cap() -> None:
    assert output_cap(10, 256, 3.0, 16) == 46
    assert output_cap(200, 256, 3.0, 16) == 256
    assert output_cap(10, 256, 0, 16) == 256
    assert output_cap(0, 256, 3.0, 0) == 1


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="limits.loop_repeats"):
        LimitsConfig(loop_repeats=1)
    with pytest.raises(ConfigError, match="limits.max_output_ratio"):
        LimitsConfig(max_output_ratio=-1)


def _cut_by_definition(tokens: list[int], guard: LoopGuard) -> int | None:
    """The rule written out without shortcuts: the smallest period whose unit repeats enough at the end."""
    n = len(tokens)
    for period in range(1, guard.max_period + 1):
        count = 1
        while (count + 1) * period <= n and tokens[n - (count + 1) * period:n - count * period] == tokens[n - period:]:
            count += 1
        if n >= max(guard.repeats * period, guard.min_span) and count >= guard.repeats \
                and count * period >= guard.min_span:
            return n - (count - 1) * period
    return None


def test_the_per_period_shortcut_finds_every_loop_the_rule_defines() -> None:
    # `cut` skips a period at once when the last token differs from the one a period before; over every prefix of
    # many small-alphabet lists (loops of every period arise by chance) it must answer as the definition does.
    import random

    rng = random.Random(7)
    guard = LoopGuard()
    for _ in range(300):
        tokens = [rng.randrange(3) for _ in range(rng.randrange(1, 40))]
        for end in range(1, len(tokens) + 1):
            assert guard.cut(tokens[:end]) == _cut_by_definition(tokens[:end], guard), tokens[:end]
