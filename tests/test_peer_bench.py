"""bench.peer compares us with CTranslate2 on the same model: the conversion must give CTranslate2 exactly our
float32 model (the demo backbone with the en→es adapter merged, every vocabulary row, decoding from `<pad>`)."""

from __future__ import annotations

from pathlib import Path

TEXTS = ["Open the file.", "The connection to the server was lost.", "Print the current page.",
         "Do you want to delete this folder?", "Settings have been saved."]


def test_ctranslate2_translates_like_our_float32_engine(tmp_path: Path) -> None:
    import ctranslate2
    from transformers import AutoTokenizer

    from bench.peer import PAIR, convert, ct2_translate
    from hunyuan_mt.config import PROJECT_ROOT, load_config
    from hunyuan_mt.service.translation import TranslationService

    translator = ctranslate2.Translator(str(convert(PAIR, tmp_path)), device="cpu", compute_type="float32",
                                        intra_threads=1)
    tok = AutoTokenizer.from_pretrained(PROJECT_ROOT / "models" / "demo")
    theirs = ct2_translate(translator, tok, TEXTS)
    service = TranslationService(load_config(None, {
        "tm.enabled": False, "memory.enabled": False, "model.quantization": "none", "model.warmup": False,
        "engine.split_sentences": False}, env={}))
    try:
        ours = [r.text for r in service.translate_batch(TEXTS, "en", "es")]
    finally:
        service.close()
    assert all(ours) and ours == theirs


def test_the_steady_row_leaves_each_process_first_pass_out() -> None:
    from bench.peer import _steady

    runs = [{"seconds": [9.0, 2.0, 2.2]}, {"seconds": [9.0, 1.9, 2.1]}, {"seconds": [9.0, 2.5, 2.4]}]
    assert _steady(runs) == {"steady_seconds": 2.1, "steady_runs": [2.1, 2.0, 2.45]}
