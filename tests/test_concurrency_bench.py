"""bench.concurrency: the sequential and the threaded pass give the same answers, the threaded pass really shares
decode steps (more than one row per step), and the engine's counters are taken around that pass only.

The service runs on the tiny Marian model and its 8 adapters, on a private backbone: a second service over the
process-wide demo backbone would take the slot layers of the web tests' live server over."""

from __future__ import annotations

from pathlib import Path

from hunyuan_mt.runtime.backbone import Backbone
from hunyuan_mt.config import load_config
from hunyuan_mt.service.translation import TranslationService


def test_run_mix_batches_threads_and_keeps_every_answer(marian_dir: Path, marian_adapters: Path) -> None:
    from bench.concurrency import MIXES, run_mix

    cfg = load_config(None, {
        "model.path": str(marian_dir), "cache.adapters_dir": str(marian_adapters), "cache.pinned": ["en2es", "es2en"],
        "routing.pivot": "en", "model.warmup": False, "model.compile": "false", "memory.enabled": False,
        "tm.enabled": False, "limits.max_new_tokens": 8, "model.quantization": "none"}, env={})
    service = TranslationService(cfg, backbone=Backbone.load_uncached(cfg.model))
    try:
        words = ["Open the file.", "Print the page.", "Settings saved.", "Close the window.", "Hello world."]
        sources = {lang: words for lang in ("en", "es", "de", "fr", "zh")}
        before = service.engine.stats.prefills
        result = run_mix(service, sources, MIXES["8 adapters + 12 pivots"], requests=24, threads=8)
        assert service.engine.stats.prefills - before > result["prefills"]  # the sequential pass is not counted
    finally:
        service.close()
    assert result["identical"] == result["requests"] == 24
    assert result["rows_per_step"] is not None and result["rows_per_step"] > 1.0
    assert result["sequential_s"] > 0 and result["concurrent_s"] > 0
