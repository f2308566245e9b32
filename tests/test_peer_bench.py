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


def _engine(seconds: float, short_ms: float, busy: float, ours: bool = False) -> dict:
    x = {"seconds": seconds, "seconds_runs": [seconds], "short_ms": short_ms, "busy": busy, "tokens_per_s": 1000,
         "steady_seconds": seconds, "steady_runs": [seconds]}
    if ours:
        x.update(mixed_seconds=seconds * 1.5, mixed_runs=[seconds * 1.5], http_short_ms=short_ms + 2)
    return x


def test_the_ratios_take_ctranslate2_on_the_same_openmp_runtime_as_ours() -> None:
    """CTranslate2 on its wheel's own OpenMP ran ~2.5x slower than on the Intel runtime ours is preloaded with (a
    2-core Xeon VM): the headline ratio is against the run on the same runtime, the old one stays beside it."""
    from bench import peer

    median = {"ct2-int8": _engine(2.4, 8.0, 1.2), "ct2-float32": _engine(3.0, 12.0, 1.3),
              "ct2-int8-iomp": _engine(0.8, 4.0, 1.9), "ct2-float32-iomp": _engine(1.5, 8.0, 1.9),
              "ours-int8": _engine(1.6, 12.0, 1.9, ours=True), "ours-none": _engine(3.0, 16.0, 1.9, ours=True)}
    results = {"date": "2026-12-07 22:00 UTC", "threads": 2, "runs": 3, "passes": 2, "sentences": 600,
               "median": median, "agreement": {}, "quality": {}, "ours_threads": 2, "shipped": "int8",
               "quoted": "ours-int8", "int8_gemm": {"note": "int8 through torch._int_mm takes 0.3× float32's time"}}
    lines = peer._report(results)
    row = next(line for line in lines if line.startswith("| 600 sentences, one pair"))
    assert row.endswith("| 1.60 s | 0.80 s | **2.00** | 0.67 |")
    short = next(line for line in lines if line.startswith("| one short sentence, idle, in-process"))
    assert short.endswith("| 12.0 ms | 4.0 ms | **3.00** | 1.50 |")
    assert "| CTranslate2 int8, batch 64, Intel's OpenMP (as ours) | 0.80 (0.8) |" in "\n".join(lines)
    # Where the Intel runtime is not installed, CTranslate2 on its own runtime is the only peer.
    del median["ct2-int8-iomp"], median["ct2-float32-iomp"]
    row = next(line for line in peer._report(results) if line.startswith("| 600 sentences, one pair"))
    assert row.endswith("| 1.60 s | 2.40 s | **0.67** | 0.67 |")


def test_ctranslate2_workers_get_the_intel_runtime_only_when_asked(monkeypatch, tmp_path: Path) -> None:
    import argparse
    import json

    from bench import openmp, peer

    seen: list[dict] = []

    def run(cmd, cwd, env, check):  # noqa: ANN001 - subprocess.run's signature
        seen.append(env)
        Path(cmd[cmd.index("--out") + 1]).write_text(json.dumps({}))

    monkeypatch.setattr(peer.subprocess, "run", run)
    monkeypatch.setattr(peer, "WORK", tmp_path)
    monkeypatch.setattr(openmp, "with_intel_openmp", lambda env: {**env, "LD_PRELOAD": "/x/libiomp5.so",
                                                                   "KMP_BLOCKTIME": "1"})
    monkeypatch.setenv("LD_PRELOAD", "/elsewhere/libiomp5.so")
    args = argparse.Namespace(threads=2, passes=1, quick=True)
    peer._spawn("ct2", [], args, "a")
    peer._spawn("ct2", [], args, "b", intel_openmp=True)
    peer._spawn("ours", [], args, "c")
    assert [e.get("LD_PRELOAD") for e in seen] == [None, "/x/libiomp5.so", "/x/libiomp5.so"]
