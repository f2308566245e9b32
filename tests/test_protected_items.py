"""Nothing in the source vanishes: emoji, symbols and bullets, prices, key names and shortcuts, numbers,
URLs, e-mail addresses, paths, file names and inline code come back exactly as often as they went in, in every
direction the service reaches, on a corpus written for this test (tests/data/protected_items.tsv, 160 strings in
en, es, de, fr and zh). `python -m bench.protected` measured why they are masked as spans rather than put back
afterwards."""

from __future__ import annotations

from typing import Any

import pytest

from bench.protected import read_corpus
from hunyuan_mt.text.masking import protect

ROWS = read_corpus()
LANGS = ("en", "es", "de", "fr", "zh")


def test_the_corpus_covers_every_kind_and_language() -> None:
    assert len(ROWS) >= 150 and {lang for lang, _, _ in ROWS} == set(LANGS)
    items = [item for _, _, row_items in ROWS for item in row_items]
    for kind, example in (("emoji", "😀"), ("bullet", "•"), ("price", "19,99 €"), ("shortcut", "Ctrl+S"),
                          ("mac shortcut", "⌘Q"), ("URL", "https://"), ("e-mail", "@"), ("path", "~/.config"),
                          ("code", "`"), ("date", "2024-05-17"), ("file name", ".txt")):
        assert any(example in item for item in items), kind


@pytest.mark.parametrize("lang, text, items", ROWS, ids=[f"{lang}:{text[:24]}" for lang, text, _ in ROWS])
def test_every_item_is_one_protected_span(lang: str, text: str, items: list[str]) -> None:
    spans = protect(text).spans
    for item in items:
        assert spans.count(item) == text.count(item), (item, spans)


@pytest.mark.parametrize("lang", LANGS)
def test_every_item_comes_back_in_every_direction(web_service: Any, lang: str) -> None:
    rows = [(text, items) for code, text, items in ROWS if code == lang]
    targets = [t for t in web_service.router.reachable_targets(lang) if t in LANGS]
    assert targets
    lost = []
    for tgt in targets:
        results = web_service.translate_batch([text for text, _ in rows], lang, tgt)
        for (text, items), result in zip(rows, results):
            lost += [(tgt, text, item, result.text) for item in items
                     if result.text.count(item) != text.count(item)]
    assert not lost, lost[:10]
