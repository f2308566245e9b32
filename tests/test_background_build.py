"""Serve at once, compile beside (prebuild.py): the kernels stay unbuilt in a serving process until activated, the
engine switches its step only where no row decodes, and a fresh service answers eagerly while a worker process
compiles its step, then switches to it without changing a row's tokens.

The end-to-end case compiles the tiny decoder-only model's one package (the decoder-only step: one package against
the encoder-decoder's three) into a folder of its own, so the worker has something to build.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from hunyuan_mt.scheduler import admission
from hunyuan_mt.quant import fbgemm as int8_fbgemm
from hunyuan_mt import kernels
from hunyuan_mt.service.translation import prebuild
from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.config import EngineConfig, GenerationConfig, LimitsConfig
from hunyuan_mt.scheduler.engine import BatchEngine, Row
from tiny_models import UNGUARDED


def _row(key: str | None, text: str, max_new: int = 8) -> Row:
    if key is None:
        return Row(text, "en", "es", None, max_new)
    pair = Pair.parse(key)
    return Row(text, pair.src, pair.tgt, pair, max_new)


@pytest.fixture()
def fresh_kernels(monkeypatch: pytest.MonkeyPatch):
    """The kernels module as in a process that has not asked for them yet; building them fails the test."""
    monkeypatch.setattr(kernels, "_LOADED", None)
    monkeypatch.setattr(kernels, "_DEFERRED", False)
    monkeypatch.setattr(int8_fbgemm, "_NATIVE", None)
    loads: list[int] = []

    def load() -> bool:
        loads.append(1)
        return False

    monkeypatch.setattr(kernels, "_load", load)
    return loads


def test_deferred_kernels_count_as_absent_and_build_nothing_until_activated(fresh_kernels: list[int]) -> None:
    kernels.defer()
    assert kernels.state() == "deferred"
    assert kernels.decode_attention() is None and kernels.move_rows() is None and kernels.qgemm() is None
    # The int8 layers take the Python op meanwhile, and do not keep that choice past the activation.
    assert int8_fbgemm.linear_op() is int8_fbgemm.torch.ops.hmt.fbgemm_linear
    assert int8_fbgemm._NATIVE is None
    assert fresh_kernels == []
    assert kernels.activate() is False  # the build failed here (_load says so): the fallbacks stay
    assert fresh_kernels == [1] and kernels.state() == "unavailable"


def test_kernels_not_deferred_are_built_on_first_use(fresh_kernels: list[int]) -> None:
    assert kernels.state() == "unknown"
    assert kernels.decode_attention() is None
    assert fresh_kernels == [1] and kernels.state() == "unavailable"


@pytest.fixture()
def engine(hunyuan_dir: Path, hunyuan_adapters: Path, fresh_backbone, make_cache):
    backbone = fresh_backbone(hunyuan_dir, quantization="none")
    cache = make_cache(backbone, hunyuan_adapters, slots=3)
    made = BatchEngine(backbone, cache, EngineConfig(max_wait_ms=0, kv_cache="dynamic"), GenerationConfig(),
                       LimitsConfig(max_new_tokens=8, **UNGUARDED))
    yield made
    made.close()


def test_a_switch_waits_for_the_running_rows_and_a_row_keeps_its_tokens(engine: BatchEngine) -> None:
    rows = [_row("en2es", "Open the file, save the document."), _row(None, "Hello world, how are you today?")]
    alone = [engine.run([r])[0] for r in rows]
    applied: list[int] = []
    reached, go = threading.Event(), threading.Event()
    calls = {"n": 0}

    def seam(forward_rows: list[Row]) -> None:
        calls["n"] += 1
        if calls["n"] == 3:  # the prefill, then the second decode step: the rows are mid-way
            reached.set()
            assert go.wait(30)

    engine.before_generate = seam
    before = engine._batch
    futures = engine.submit(rows)
    assert reached.wait(30)
    engine.request_upgrade("a test step", lambda: applied.append(len(engine._running)))
    assert engine.upgrade_pending
    go.set()
    assert [f.result(timeout=60) for f in futures] == alone
    deadline = time.monotonic() + 10
    while engine.upgrade_pending and time.monotonic() < deadline:
        time.sleep(0.01)
    # Applied once, by the loop, with no row running, and the loop decodes with a new batch from then on.
    assert applied == [0]
    assert engine._batch is not before
    assert [u["what"] for u in engine.upgrades()] == ["a test step"]
    assert [engine.run([r])[0] for r in rows] == alone


def test_a_busy_engine_stops_admitting_to_make_the_switch(engine: BatchEngine,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows that keep arriving would keep the batch from ever draining: after UPGRADE_HOLD_S the queue waits."""
    monkeypatch.setattr(admission, "UPGRADE_HOLD_S", 0.0)
    applied = threading.Event()
    stop = threading.Event()
    running_at_switch: list[int] = []

    def feed() -> None:
        i = 0
        while not stop.is_set():
            engine.submit([_row(None, f"Sentence number {i} arrives.", max_new=6)])
            i += 1
            time.sleep(0.005)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        deadline = time.monotonic() + 10
        while engine.running() == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        engine.request_upgrade("a test step", lambda: (running_at_switch.append(engine.running()), applied.set()))
        assert applied.wait(30), "the switch never found a point where no row decoded"
    finally:
        stop.set()
        feeder.join(10)
    assert running_at_switch == [0]


def test_describe_says_how_far_the_build_is() -> None:
    status = {"state": "building", "done": 1, "total": 4, "seconds": 50.0,
              "parts": [{"name": "CPU kernels", "state": "done", "seconds": 41.0},
                        {"name": "decoder_step", "state": "building", "seconds": 9.0}]}
    line = prebuild.describe(status)
    assert "1 of 4 parts done" in line and "decoder_step (9 s)" in line and "eager step answers" in line
    done = prebuild.describe({**status, "state": "done", "done": 4})
    assert done.startswith("full speed")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_fresh_service_answers_eagerly_then_switches_to_the_step_built_beside(
        hunyuan_dir: Path, hunyuan_adapters: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hunyuan_mt.runtime.backbone import Backbone
    from hunyuan_mt.config import load_config
    from hunyuan_mt.service.translation import TranslationService

    monkeypatch.setenv("HMT_AOT_CACHE", str(tmp_path / "aot"))  # nothing compiled yet, for the worker too
    kernels.decode_attention()  # built or loaded here, as after an earlier start: the worker compiles the step only
    cfg = load_config(overrides={
        "model.path": str(hunyuan_dir), "cache.adapters_dir": str(hunyuan_adapters), "cache.pinned": ["en2es"],
        "model.warmup": True, "model.compile": "auto", "model.quantization": "int8", "model.int8_kernel": "fbgemm",
        "model.cpu_threads": 2, "memory.enabled": False, "tm.enabled": False, "limits.max_new_tokens": 8,
        "routing.pivot": "en"}, env={})
    service = TranslationService(cfg, backbone=Backbone.load_uncached(cfg.model))
    try:
        assert service.build is not None
        assert [p.name for p in service.build.parts] == ["llama_step"]
        texts = ["Open the file.", "Hello world, how are you today?", "Save the document and close the window."]
        eager = [service.engine.run([_row("en2es", t)])[0] for t in texts]
        full = service.full_speed()
        assert full["compiled_step"] is False and full["build"]["total"] == 1
        assert service.wait_full_speed(timeout=800), service.full_speed()
        full = service.full_speed()
        assert full["reached"] and full["compiled_step"], full
        assert full["build"]["state"] == "done" and full["build"]["parts"][0]["state"] == "done"
        assert [u["what"] for u in full["upgrades"]] == ["the compiled decode step"]
        assert list((tmp_path / "aot").glob("llama_step-*.pt2")), "the worker wrote no package"
        assert service.engine._batch.compiled is service.backbone.compiled[0]
        # Eager and compiled steps give the same bits: the same translations after the switch.
        assert [service.engine.run([_row("en2es", t)])[0] for t in texts] == eager
    finally:
        service.close()


def test_the_status_tab_says_what_decodes_and_how_far_the_build_is() -> None:
    from hunyuan_mt.web.status_view import step_line

    building = {"build": {"state": "building", "done": 1, "total": 4, "seconds": 61.0, "parts": [
        {"name": "CPU kernels", "state": "done"}, {"name": "encode_cross (one row)", "state": "building"},
        {"name": "decoder_step", "state": "waiting"}, {"name": "encode_cross", "state": "waiting"}]}}
    line = step_line(building)
    assert line.startswith("**Decode step:** eager, while the fast one is built")
    assert "1 of 4 parts done, 61 s so far; now: encode_cross (one row); then: decoder_step, encode_cross" in line
    done = {"build": {**building["build"], "state": "done", "done": 4}, "line": "full speed: built 4 of 4 parts in 281 s",
            "compiled_step": True}
    assert step_line(done) == "**Decode step:** full speed: built 4 of 4 parts in 281 s"
    assert step_line({"compiled_step": True}) == "**Decode step:** compiled for this CPU"
    assert step_line({}) == ""
