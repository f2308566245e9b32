"""`PromptTokens`: the Rust tokenizer's ids and text equal transformers' own, prompts are tokenized once, and a
tokenizer that disagrees or keeps per-source state takes transformers' path."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from hunyuan_mt.config import PROJECT_ROOT
from hunyuan_mt.text.tokens import PromptTokens

from tiny_models import build_tokenizer

TEXTS = [
    "Open the file.", "Could not open “report.pdf”: permission denied (y/N)", "  spaced   out  ", "文件未找到。",
    "Ünïcödé ½ ﬁle — 10 %", "x" * 300, "⟦0⟧ kept ⟦1⟧", "🙂🙂", "Tab\tand\nnewline", "",
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PreTrainedTokenizerFast]:
    tiny = build_tokenizer(tmp_path_factory.mktemp("tok"))
    return {"demo": AutoTokenizer.from_pretrained(PROJECT_ROOT / "models" / "demo"), "tiny": tiny}


@pytest.mark.parametrize("name", ["demo", "tiny"])
def test_rust_path_gives_transformers_ids_and_text(tokenizers: dict, name: str) -> None:
    tok = tokenizers[name]
    tokens = PromptTokens(tok)
    assert tokens._encoder is not None and tokens._decoder is not None  # the fast path is what is tested
    for text in TEXTS:
        for special in (True, False):
            expected = tok(text, add_special_tokens=special)["input_ids"]
            assert tokens.ids(text, special=special) == tuple(expected)
        ids = tok(text)["input_ids"]
        assert tokens.text(ids) == tok.decode(ids, skip_special_tokens=True).strip()


def test_a_prompt_is_tokenized_once(tokenizers: dict) -> None:
    tokens = PromptTokens(tokenizers["demo"])
    calls: list[str] = []
    real = tokens._encoder

    class Counting:
        def encode(self, text: str, add_special_tokens: bool = True):
            calls.append(text)
            return real.encode(text, add_special_tokens=add_special_tokens)

    tokens._encoder = Counting()
    first = tokens.ids("Save the document.")
    assert tokens.ids("Save the document.") == first
    assert calls == ["Save the document."]
    tokens.ids("Save the document.", special=False)  # another key: tokenized again
    assert calls == ["Save the document."] * 2


class _Lowercasing(PreTrainedTokenizerFast):
    """A tokenizer that does part of its work in Python, so the Rust tokenizer alone gives other ids."""

    def __call__(self, text, *args, **kwargs):
        return super().__call__(text.lower() if isinstance(text, str) else text, *args, **kwargs)


def test_a_tokenizer_the_rust_path_disagrees_with_keeps_transformers(tmp_path: Path) -> None:
    build_tokenizer(tmp_path)
    tok = _Lowercasing.from_pretrained(tmp_path)
    tokens = PromptTokens(tok)
    assert tokens._encoder is None
    assert tokens.ids("Open THE File.") == tuple(tok("Open THE File.")["input_ids"])
    assert tokens.ids("Open THE File.") == tokens.ids("open the file.")


class _PerSource(PreTrainedTokenizerFast):
    """NLLB-like: the source language, set as state, becomes the first token."""

    src_lang = "en"

    def __call__(self, text, *args, **kwargs):
        out = super().__call__(text, *args, **kwargs)
        out["input_ids"] = [self.convert_tokens_to_ids(self.src_lang)] + out["input_ids"]
        return out


def test_per_source_tokenizers_switch_the_source_and_key_by_it(tmp_path: Path) -> None:
    build_tokenizer(tmp_path)
    tok = _PerSource.from_pretrained(tmp_path)
    tokens = PromptTokens(tok)
    assert tokens.per_source and tokens._encoder is None
    es, de = tokens.ids("hello", source="<s>"), tokens.ids("hello", source="</s>")
    assert es[0] == tok.convert_tokens_to_ids("<s>") and de[0] == tok.convert_tokens_to_ids("</s>")
    assert es[1:] == de[1:]
    assert tokens.ids("hello", source="<s>") == es  # kept per source, not the last one set


def test_concurrent_callers_get_the_same_ids(tokenizers: dict) -> None:
    tok = tokenizers["demo"]
    tokens = PromptTokens(tok)
    texts = [f"Sentence number {i} of the batch." for i in range(200)]
    expected = [tuple(tok(t)["input_ids"]) for t in texts]
    results: list[list[tuple[int, ...]]] = []

    def work() -> None:
        results.append([tokens.ids(t) for t in texts])

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(r == expected for r in results)
