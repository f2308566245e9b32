"""bench.concurrency on the demo: the sequential and the threaded pass give the same answers, and the threaded pass
really shares decode steps (more than one row per step), with the engine's counters taken around that pass only."""

from __future__ import annotations

from hunyuan_mt.config import load_config
from hunyuan_mt.service import TranslationService


def test_run_mix_batches_threads_and_keeps_every_answer() -> None:
    from bench.concurrency import MIXES, run_mix

    service = TranslationService(load_config(None, {"tm.enabled": False, "memory.enabled": False,
                                                   "model.warmup": False}, env={}))
    try:
        english = ["Open the file.", "Print the current page.", "Settings have been saved.", "Close the window."]
        sources = {"en": english, "es": [r.text for r in service.translate_batch(english, "en", "es")]}
        routes = [r for r in MIXES["8 adapters"] if r[0] in sources]
        result = run_mix(service, sources, routes, requests=12, threads=6)
    finally:
        service.close()
    assert result["identical"] == result["requests"] == 12
    assert result["rows_per_step"] is not None and result["rows_per_step"] > 1.0
    assert result["speedup"] > 0
