"""The two benches behind the review marks: bench.review_threshold's calibration and bench.formatted's set."""

from __future__ import annotations

from bench.formatted import SET, build_set, plain, read_set, tags
from bench.review_threshold import calibrate, rates


def _rows(bad: list[float], good: list[float]) -> list[dict[str, object]]:
    return ([{"confidence": c, "chrf": 10.0, "copied": False} for c in bad]
            + [{"confidence": c, "chrf": 60.0, "copied": False} for c in good])


def test_the_threshold_is_the_lowest_that_lets_at_most_one_bad_row_in_ten_through() -> None:
    bad = [i / 20 for i in range(20)]  # 0.00, 0.05, ..., 0.95
    rows = _rows(bad, [0.9, 0.95])
    threshold = calibrate(rows)
    assert threshold == 0.86  # 0.90 and 0.95 pass: 2 of 20
    assert rates(rows, threshold)["bad_passing"] == 2 and rates(rows, 0.85)["bad_passing"] == 3
    assert rates(rows, threshold)["good_to_review"] == 0 and rates(rows, 0.96)["good_to_review"] == 2


def test_the_formatted_set_is_built_again_the_same_from_the_held_out_strings() -> None:
    rows = read_set()
    assert len(rows) == 480 and rows == build_set(), f"{SET} differs from what --build-set writes"
    for _, source, _ in rows:
        assert tags(source) and tags(source).count("b") == tags(source).count("b/")
        assert "<" not in plain(source)
