"""Memory-pressure policy: injected readings drive light mode in and out, with its effects on cache and engine."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.config import EngineConfig, GenerationConfig, LimitsConfig, MemoryConfig
from hunyuan_mt.scheduler.engine import BatchEngine, Row
from hunyuan_mt.runtime.pressure import LIGHT, NORMAL, MemoryMonitor, MemoryPolicy, MemoryReading, quantized_kv_support
from tiny_models import UNGUARDED

GiB = 1024 ** 3


class Readings:
    """The monitor's seam: hands out the next scripted reading on each call."""

    def __init__(self, *fractions: float, host: float | None = None) -> None:
        self.fractions = list(fractions)
        self.host = host

    def __call__(self) -> MemoryReading:
        f = self.fractions.pop(0)
        host = f if self.host is None else self.host
        return MemoryReading("host", f, int(f * 16 * GiB), 16 * GiB, host, 1 * GiB)


def test_real_reading_is_host_memory_on_cpu() -> None:
    r = MemoryMonitor("cpu").read()
    assert r.source == "host"
    assert 0 < r.used_fraction <= 1 and r.total_bytes > r.used_bytes > 0 and r.rss_bytes > 0
    assert MemoryMonitor("cpu").gpu() is None


def test_hysteresis_without_targets() -> None:
    policy = MemoryPolicy(MemoryConfig(high_watermark=0.88, low_watermark=0.75),
                          MemoryMonitor(reader=Readings(0.5, 0.9, 0.8, 0.74, 0.8, 0.95, 0.89)))
    modes = [policy.check() for _ in range(7)]
    assert modes == [NORMAL, LIGHT, LIGHT, NORMAL, NORMAL, LIGHT, LIGHT]
    assert policy.transitions == 3
    assert [t.mode for t in policy.history] == [LIGHT, NORMAL, LIGHT]
    status = policy.status()
    assert status["mode"] == LIGHT and status["transitions"] == 3
    assert status["last_reading"]["used_fraction"] == 0.89


@pytest.fixture()
def engine_for(fresh_backbone, make_cache):
    engines: list[BatchEngine] = []

    def make(model_dir: Path, adapters: Path) -> BatchEngine:
        backbone = fresh_backbone(model_dir)
        cache = make_cache(backbone, adapters, slots=3, pinned=["en2es"], ram_tier=8)
        engine = BatchEngine(backbone, cache, EngineConfig(max_wait_ms=0, max_rows=32, max_tokens=8192),
                             GenerationConfig(), LimitsConfig(max_new_tokens=6, **UNGUARDED))
        engines.append(engine)
        return engine

    yield make
    for e in engines:
        e.close()


def _rows() -> list[Row]:
    return [Row("Hello world.", p.src, p.tgt, p) for p in map(Pair.parse, ("es2en", "en2de", "en2es"))]


def test_light_mode_enter_and_exit(hunyuan_dir: Path, hunyuan_adapters: Path, engine_for,
                                   caplog: pytest.LogCaptureFixture) -> None:
    engine = engine_for(hunyuan_dir, hunyuan_adapters)
    for row in _rows():  # one by one: the order they are used in is the LRU order
        engine.run([row])
    cache = engine.cache
    assert cache.lru_order() == ["es2en", "en2de"]
    policy = MemoryPolicy(MemoryConfig(), MemoryMonitor(reader=Readings(0.95, 0.80, 0.70, host=0.5)),
                          cache, engine)
    pkg = logging.getLogger("hunyuan_mt")
    pkg.setLevel(logging.INFO)
    caplog.set_level(logging.INFO)

    assert policy.check() == LIGHT
    assert cache.lru_order() == []                     # idle non-pinned adapters detached
    assert cache.pinned() == ["en2es"]                 # pins stay
    assert set(cache.ram_tier()) >= {"es2en", "en2de"}  # host memory allows keeping them in RAM
    assert (engine.max_rows, engine.max_tokens) == (8, 2048)
    assert engine.status()["kv_cache"] == "fp8"
    assert pkg.level == logging.WARNING
    assert "memory: entering light mode (host at 95% > 88%): evicted ['es2en', 'en2de']" in caplog.text
    assert policy.history[-1].evicted == ["es2en", "en2de"]
    light_out = engine.run(_rows())                    # still serving, with the quantized KV cache
    assert all(isinstance(t, str) for t in light_out)
    assert engine.history[-1].rows == 3

    assert policy.check() == LIGHT                     # 80%: between the watermarks, no change
    assert policy.check() == NORMAL
    assert (engine.max_rows, engine.max_tokens) == (32, 8192)
    assert engine.status()["kv_cache"] == "default"
    assert pkg.level == logging.INFO
    assert "memory: back to normal mode (host at 70% < 75%)" in caplog.text
    assert policy.transitions == 2
    assert policy.status()["mode"] == NORMAL
    pkg.setLevel(logging.NOTSET)


def test_host_pressure_drops_ram_tier(marian_dir: Path, marian_adapters: Path, engine_for) -> None:
    engine = engine_for(marian_dir, marian_adapters)
    engine.run(_rows())
    policy = MemoryPolicy(MemoryConfig(), MemoryMonitor(reader=Readings(0.95)), engine.cache, engine)
    assert policy.check() == LIGHT
    assert engine.cache.lru_order() == [] and engine.cache.ram_tier() == []
    effect = policy.status()["engine"]
    assert effect["kv_cache"] == "default"
    assert effect["kv_cache_note"].startswith("not supported for encoder-decoder models")


def test_quantized_kv_support_by_arch(hunyuan_dir: Path, marian_dir: Path, fresh_backbone) -> None:
    dec = fresh_backbone(hunyuan_dir)
    ok, why = quantized_kv_support(dec.model, dec.arch)
    assert ok and why.startswith("fp8")
    enc = fresh_backbone(marian_dir)
    assert quantized_kv_support(enc.model, enc.arch)[0] is False


def test_background_polling_survives_reading_errors() -> None:
    calls = {"n": 0}

    def flaky() -> MemoryReading:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("sensor gone")
        return MemoryReading("host", 0.95, 1, 1, 0.5, 1)

    policy = MemoryPolicy(MemoryConfig(poll_interval_s=0.01), MemoryMonitor(reader=flaky))
    policy.start()
    try:
        import time

        deadline = time.monotonic() + 10
        while policy.mode != LIGHT and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        policy.stop()
    assert policy.mode == LIGHT and calls["n"] >= 2
