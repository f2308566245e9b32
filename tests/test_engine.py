"""Batching engine: mixed batches equal single runs (both architectures), slots bound, fairness, OOM split.

Batches are made deterministic with a gate in the engine's `before_generate` seam: the first batch is held open
while the rows under test are queued, so they are all waiting when the next batch is formed.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

import pytest
import torch

import tiny_models
from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.config import EngineConfig, GenerationConfig, LimitsConfig
from hunyuan_mt.engine import BatchEngine, Row
from hunyuan_mt.errors import AdapterUnusable, InputTooLarge, OutOfMemory

TEXTS = ["Hello world, how are you today?", "Open the file, save the document.", "Hola mundo.",
         "The quick brown fox jumps.", "Datei öffnen, Dokument speichern.", "Bonjour le monde."]


def row(key: str | None, text: str) -> Row:
    if key is None:
        return Row(text, "en", "es", None)
    pair = Pair.parse(key)
    return Row(text, pair.src, pair.tgt, pair)


class Gate:
    """Holds the first generate call open until `release` is set; optional `then` runs on every later call."""

    def __init__(self, then: Callable[[list[Row]], None] | None = None) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0
        self.then = then

    def __call__(self, rows: list[Row]) -> None:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            assert self.release.wait(30), "gate never released"
        elif self.then is not None:
            self.then(rows)


@pytest.fixture(params=["marian", "hunyuan"])
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture()
def model_and_adapters(arch: str, request: pytest.FixtureRequest) -> tuple[Path, Path]:
    model = request.getfixturevalue(f"{arch}_dir")
    adapters = request.getfixturevalue(f"{arch}_adapters")
    return model, adapters


@pytest.fixture()
def make_engine(fresh_backbone, make_cache):
    engines: list[BatchEngine] = []

    def make(model_dir: Path, adapters: Path, slots: int = 3, pinned: tuple[str, ...] = (), max_rows: int = 32,
             max_tokens: int = 8192, fairness: int = 4, max_new_tokens: int = 8) -> BatchEngine:
        backbone = fresh_backbone(model_dir)
        cache = make_cache(backbone, adapters, slots=slots, pinned=list(pinned))
        engine = BatchEngine(backbone, cache, EngineConfig(max_wait_ms=0, max_rows=max_rows, max_tokens=max_tokens,
                                                            fairness_max_skips=fairness),
                             GenerationConfig(), LimitsConfig(max_new_tokens=max_new_tokens))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


def references(engine: BatchEngine, rows: list[Row]) -> list[str]:
    """Each row run alone (a batch of one)."""
    out = []
    for r in rows:
        before = len(engine.history)
        out.append(engine.run([r])[0])
        assert [h.rows for h in list(engine.history)[before:]] == [1]
    return out


def held_batch(engine: BatchEngine, rows: list[Row], then: Callable[[list[Row]], None] | None = None) -> list[Future]:
    """Queue `rows` while a blocker batch is running, so they meet in the scheduler together."""
    gate = Gate(then)
    engine.before_generate = gate
    blocker = engine.submit([row(None, "blocker")])
    assert gate.entered.wait(30)
    futures = engine.submit(rows)
    gate.release.set()
    blocker[0].result(timeout=60)
    return futures


def test_mixed_batch_equals_single_runs(arch: str, model_and_adapters, make_engine) -> None:
    model_dir, adapters = model_and_adapters
    engine = make_engine(model_dir, adapters, slots=3, pinned=("en2es",))
    keys = ["en2es", "es2en", None, "en2de", "en2es", "en2fr", None, "es2en"]
    rows = [row(k, TEXTS[i % len(TEXTS)]) for i, k in enumerate(keys)]
    ref = references(engine, rows)
    # Adapters really change the output: the same text differs per adapter and from the bare backbone.
    same_text = [engine.run([row(k, TEXTS[0])])[0] for k in ("en2es", "en2de", "en2fr", None)]
    assert len(set(same_text)) == 4, same_text

    start = len(engine.history)
    futures = held_batch(engine, rows)
    got = [f.result(timeout=60) for f in futures]
    assert got == ref
    batches = list(engine.history)[start + 1:]
    assert sum(b.rows for b in batches) == len(rows)
    mixed = max(batches, key=lambda b: b.rows)
    assert mixed.rows == len(rows)  # 3 non-pinned pairs fit 3 slots: one batch holds every row
    assert set(mixed.pairs) == {"en2es", "es2en", "en2de", "en2fr", "__base__"}
    assert mixed.distinct_nonpinned == 3


def test_never_more_nonpinned_adapters_than_slots(arch: str, model_and_adapters, make_engine) -> None:
    model_dir, adapters = model_and_adapters
    engine = make_engine(model_dir, adapters, slots=2, pinned=("en2es",))
    keys = ["es2en", "en2de", "de2en", "en2fr", "fr2en", "en2zh", "en2es", None]
    rows = [row(k, TEXTS[i % len(TEXTS)]) for i, k in enumerate(keys)]
    ref = references(engine, rows)
    start = len(engine.history)
    futures = held_batch(engine, rows)
    assert [f.result(timeout=60) for f in futures] == ref
    batches = list(engine.history)[start + 1:]
    assert all(b.distinct_nonpinned <= 2 for b in batches)
    assert max(b.distinct_nonpinned for b in batches) == 2
    assert len(batches) == 3  # 6 non-pinned pairs, 2 per batch
    assert engine.stats.max_distinct_nonpinned == 2


def test_concurrent_callers_identical_results(arch: str, model_and_adapters, make_engine) -> None:
    model_dir, adapters = model_and_adapters
    engine = make_engine(model_dir, adapters, slots=2, pinned=("en2es",), max_rows=6)
    keys = ["en2es", "es2en", "en2de", "de2en", "en2fr", None]
    rows = [row(k, t) for k in keys for t in TEXTS[:3]]
    ref = dict(zip(rows, references(engine, rows)))
    rng = random.Random(7)
    plans = [[rng.choice(rows) for _ in range(4)] for _ in range(12)]
    results: list[list[str] | BaseException] = [None] * len(plans)  # type: ignore[list-item]
    barrier = threading.Barrier(len(plans))

    def worker(i: int) -> None:
        barrier.wait()
        try:
            results[i] = engine.run(plans[i], timeout=120)
        except BaseException as exc:  # noqa: BLE001
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    for plan, got in zip(plans, results):
        assert got == [ref[r] for r in plan]
    assert all(h.distinct_nonpinned <= 2 for h in engine.history)
    assert all(h.rows <= 6 for h in engine.history)
    stats = engine.cache.stats()
    assert len([r for r in stats.resident if not r.pinned]) <= 2
    assert all(r.leases == 0 for r in stats.resident)


def test_fairness_bound_lets_cold_pair_through(marian_dir: Path, marian_adapters: Path, make_engine) -> None:
    engine = make_engine(marian_dir, marian_adapters, slots=1, fairness=3)
    hot, cold = "en2es", "en2de"
    # Warm the hot pair so it is resident (the scheduler prefers rows that need no load).
    engine.run([row(hot, "warm")])
    extra: list[Future] = []

    def keep_hot_busy(rows: list[Row]) -> None:
        if len(extra) < 8:  # a steady stream: a new hot row arrives during every batch
            extra.extend(engine.submit([row(hot, f"hot {len(extra)}")]))

    start = len(engine.history)
    futures = held_batch(engine, [row(cold, "cold"), row(hot, "hot first")], then=keep_hot_busy)
    assert [f.result(timeout=60) for f in futures]
    for f in extra:
        f.result(timeout=60)
    batches = list(engine.history)[start + 1:]
    cold_at = next(i for i, b in enumerate(batches) if cold in b.pairs)
    # Passed over exactly fairness_max_skips times (3 hot-only batches), then served ahead of the hot stream.
    assert cold_at == 3
    assert all(b.pairs and set(b.pairs) == {hot} for b in batches[:3])
    assert batches[cold_at].pairs == (cold,)
    assert all(b.distinct_nonpinned <= 1 for b in batches)


def test_without_fairness_bound_cold_pair_waits_for_stream(marian_dir: Path, marian_adapters: Path,
                                                           make_engine) -> None:
    """The control for the test above: with an unreachable bound the cold row waits out the whole hot stream."""
    engine = make_engine(marian_dir, marian_adapters, slots=1, fairness=1000)
    hot, cold = "en2es", "en2de"
    engine.run([row(hot, "warm")])
    extra: list[Future] = []

    def keep_hot_busy(rows: list[Row]) -> None:
        if len(extra) < 6:
            extra.extend(engine.submit([row(hot, f"hot {len(extra)}")]))

    start = len(engine.history)
    futures = held_batch(engine, [row(cold, "cold"), row(hot, "hot first")], then=keep_hot_busy)
    [f.result(timeout=60) for f in futures + extra]
    batches = list(engine.history)[start + 1:]
    cold_at = next(i for i, b in enumerate(batches) if cold in b.pairs)
    assert cold_at == len(batches) - 1 and cold_at >= 6


def test_oom_splits_batch_and_all_rows_succeed(arch: str, model_and_adapters, make_engine) -> None:
    model_dir, adapters = model_and_adapters
    engine = make_engine(model_dir, adapters, slots=3, pinned=("en2es",))
    rows = [row(k, TEXTS[i]) for i, k in enumerate(["en2es", "es2en", None, "en2de", "en2es"])]
    ref = references(engine, rows)

    def oom_above_one(rows: list[Row]) -> None:
        if len(rows) > 1:
            raise torch.OutOfMemoryError("injected: CUDA out of memory")

    start = len(engine.history)
    futures = held_batch(engine, rows, then=oom_above_one)
    assert [f.result(timeout=60) for f in futures] == ref
    batches = list(engine.history)[start + 1:]
    assert [b.rows for b in batches] == [1] * 5
    assert engine.stats.oom_splits == 4  # 5 → 2+3 → 1+1, 1+2 → 1+1
    assert engine.stats.oom_failures == 0


def test_oom_single_row_fails_alone(arch: str, model_and_adapters, make_engine) -> None:
    model_dir, adapters = model_and_adapters
    engine = make_engine(model_dir, adapters, slots=3)
    rows = [row("en2es", TEXTS[0]), row("es2en", "POISON " * 5), row("en2de", TEXTS[1]), row(None, TEXTS[2])]
    good = [r for r in rows if not r.text.startswith("POISON")]
    ref = dict(zip(good, references(engine, good)))

    def poison(rows: list[Row]) -> None:
        if any(r.text.startswith("POISON") for r in rows):
            raise torch.OutOfMemoryError("injected")

    futures = held_batch(engine, rows, then=poison)
    for r, f in zip(rows, futures):
        if r.text.startswith("POISON"):
            with pytest.raises(OutOfMemory, match=r"^Out of memory translating one segment of \d+ tokens \(es→en\)"):
                f.result(timeout=60)
        else:
            assert f.result(timeout=60) == ref[r]
    assert engine.stats.oom_failures == 1


def test_cpu_allocator_error_counts_as_oom() -> None:
    from hunyuan_mt.engine import is_oom

    assert is_oom(torch.OutOfMemoryError("x"))
    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"))
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("out of memory"))


def test_broken_adapter_fails_only_its_rows(marian_dir: Path, adapters_copy: Path, make_engine) -> None:
    tiny_models.corrupt_adapter(adapters_copy / "en2de", "truncate")
    engine = make_engine(marian_dir, adapters_copy, slots=3)
    rows = [row("en2es", TEXTS[0]), row("en2de", TEXTS[1]), row(None, TEXTS[2])]
    futures = held_batch(engine, rows)
    assert futures[0].result(timeout=60)
    assert futures[2].result(timeout=60)
    with pytest.raises(AdapterUnusable, match="en2de"):
        futures[1].result(timeout=60)
    # Remembered: the next request for it fails fast, and others keep being served.
    assert isinstance(engine.run_each([row("en2de", "x"), row("en2es", "y")])[0], AdapterUnusable)


def test_token_budget_splits_batches(marian_dir: Path, marian_adapters: Path, make_engine) -> None:
    engine = make_engine(marian_dir, marian_adapters, max_tokens=40)
    rows = [row("en2es", TEXTS[0])] * 6
    lengths = engine.backbone.prompt_lengths([engine._prompt_row(r) for r in rows])
    per_batch = 40 // max(lengths)
    start = len(engine.history)
    futures = held_batch(engine, rows)
    [f.result(timeout=60) for f in futures]
    batches = list(engine.history)[start + 1:]
    assert all(b.padded_tokens <= 40 for b in batches)
    assert max(b.rows for b in batches) == per_batch


def test_unexpected_error_fails_only_the_row_that_causes_it(marian_dir: Path, marian_adapters: Path,
                                                             make_engine) -> None:
    engine = make_engine(marian_dir, marian_adapters)
    rows = [row("en2es", TEXTS[0]), row("es2en", "BREAKS THE MODEL"), row(None, TEXTS[2])]
    ref = {r: engine.run([r])[0] for r in rows if r.text != "BREAKS THE MODEL"}

    def breaks(batch: list[Row]) -> None:
        if any(r.text == "BREAKS THE MODEL" for r in batch):
            raise RuntimeError("shape mismatch somewhere")

    futures = held_batch(engine, rows, then=breaks)
    with pytest.raises(RuntimeError, match="shape mismatch somewhere"):
        futures[1].result(timeout=60)
    assert [futures[0].result(timeout=60), futures[2].result(timeout=60)] == [ref[rows[0]], ref[rows[2]]]
    assert engine.stats.error_splits >= 1
    engine.before_generate = None
    assert engine.run([rows[0]]) == [ref[rows[0]]]  # the engine keeps serving
    assert engine.run([row("en2es", "   ")]) == [""]  # nothing to translate: no model call


def test_max_new_tokens_capped_by_model_positions(marian_dir: Path, marian_adapters: Path, make_engine) -> None:
    # The tiny Marian has 128 positions; asking for 500 new tokens must not index past them.
    engine = make_engine(marian_dir, marian_adapters, max_new_tokens=500)
    assert engine._max_new_tokens([]) == 126
    assert isinstance(engine.run([row("en2es", TEXTS[0])])[0], str)


def test_over_long_row_fails_alone_before_batching(arch: str, model_and_adapters, make_engine) -> None:
    """A row over the model's input limit is refused when it is counted: it never reaches generate, and the rows
    queued with it run in one batch with the output they have alone."""
    engine = make_engine(*model_and_adapters)
    limit = engine.backbone.max_input_tokens
    assert limit is not None
    long_row = row("en2es", "Hello world " * 200)
    tokens = engine.backbone.prompt_lengths([engine._prompt_row(long_row)])[0]
    assert tokens > limit
    rows = [row("en2es", TEXTS[0]), long_row, row(None, TEXTS[2])]
    ref = references(engine, [rows[0], rows[2]])
    seen: list[list[str]] = []
    start = len(engine.history)
    futures = held_batch(engine, rows, then=lambda batch: seen.append([r.text for r in batch]))
    with pytest.raises(InputTooLarge) as info:
        futures[1].result(timeout=60)
    assert info.value.message == (f"A segment of {tokens} tokens is longer than this model's limit of {limit} "
                                  "tokens; split the text into shorter segments.")
    assert [futures[0].result(timeout=60), futures[2].result(timeout=60)] == ref
    assert seen == [[TEXTS[0], TEXTS[2]]]  # one generate, without the long row
    assert [h.rows for h in list(engine.history)[start + 1:]] == [2]
    assert engine.stats.error_splits == 0
