"""A check shared by the tests of the demo's paragraph sources that only train (manual pages, HTML manuals)."""

from __future__ import annotations

from typing import Any

from hunyuan_mt.demo.corpus import build_corpus


def assert_trains_only(entries: list[Any], origin: str, first_key: str, pair: tuple[str, str], kind: str) -> None:
    """Spanish `entries` from `origin` (German asked for, none there) become en→es training pairs of `kind`, one of
    them `pair`, and never a held-out paragraph."""
    assert {e.lang for e in entries} == {"es"} and {e.origin for e in entries} == {origin}
    assert entries[0].key == first_key
    corpus = build_corpus(entries, test_size=2, frequent_size=2, seed=1)
    assert (*pair, kind) in corpus.train["en2es"]
    assert corpus.para_test.get("en2es", []) == [] and corpus.stats["es2en"][kind] > 0
