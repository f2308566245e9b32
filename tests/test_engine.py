"""The engine's decode loop: rows join between steps and leave when done; every row equals itself run alone.

Forwards are made deterministic with the engine's `before_generate` seam (called with the rows of every prefill,
decode step or static batch, in the engine thread): a gate holds a chosen forward open while the test queues the
rows under test, so they meet the running batch exactly where the test wants them. History records say which
rows each forward held; assertions read those, never timings.
"""

from __future__ import annotations

import dataclasses
import math
import random
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import tiny_models
from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.runtime.backbone import PromptRow
from hunyuan_mt.config import EngineConfig, GenerationConfig, LimitsConfig
from hunyuan_mt.decode import Sequence as DecodeSequence
from hunyuan_mt.decode.guard import LoopGuard
from hunyuan_mt.scheduler.engine import BatchEngine, Row, StepRecord
from hunyuan_mt.lora import BASE_SLOT
from hunyuan_mt.errors import AdapterUnusable, Busy, Cancelled, InputTooLarge, OutOfMemory
from hunyuan_mt.scheduler.ticket import Ticket
from tiny_models import UNGUARDED

TEXTS = ["Hello world, how are you today?", "Open the file, save the document.", "Hola mundo.",
         "The quick brown fox jumps.", "Datei öffnen, Dokument speichern.", "Bonjour le monde."]


def row(key: str | None, text: str, max_new: int | None = None) -> Row:
    """The tiny random models never produce an end token: a row's length is its token cap (`max_new`)."""
    if key is None:
        return Row(text, "en", "es", None, max_new)
    pair = Pair.parse(key)
    return Row(text, pair.src, pair.tgt, pair, max_new)


class Gate:
    """Holds the first forward open until `release` is set; `then` runs on every later forward."""

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


#: "hunyuan-static": the decoder-only model over the preallocated KV cache (what CUDA serves with graphs).
@pytest.fixture(params=["marian", "hunyuan", "hunyuan-static"])
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture()
def model_and_adapters(arch: str, request: pytest.FixtureRequest) -> tuple[Path, Path]:
    model = arch.split("-")[0]
    return request.getfixturevalue(f"{model}_dir"), request.getfixturevalue(f"{model}_adapters")


@pytest.fixture()
def make_engine(fresh_backbone, make_cache, request: pytest.FixtureRequest):
    engines: list[BatchEngine] = []
    kv_default = "static" if "arch" in request.fixturenames and request.getfixturevalue("arch").endswith(
        "-static") else "dynamic"

    def make(model_dir: Path, adapters: Path, slots: int = 3, pinned: tuple[str, ...] = (), max_rows: int = 32,
             max_tokens: int = 8192, fairness: int = 4, max_new_tokens: int = 8, lease_timeout_s: float = 10.0,
             gen: GenerationConfig | None = None, kv_cache: str | None = None,
             max_seq_len: int = 256, limits: dict | None = None, prefill_chunk: str = "auto") -> BatchEngine:
        backbone = fresh_backbone(model_dir)
        cache = make_cache(backbone, adapters, slots=slots, pinned=list(pinned), lease_timeout_s=lease_timeout_s)
        engine = BatchEngine(backbone, cache, EngineConfig(max_wait_ms=0, max_rows=max_rows, max_tokens=max_tokens,
                                                            fairness_max_skips=fairness,
                                                            kv_cache=kv_cache or kv_default, max_seq_len=max_seq_len,
                                                            prefill_chunk_tokens=prefill_chunk),
                             gen or GenerationConfig(),
                             LimitsConfig(max_new_tokens=max_new_tokens, **(UNGUARDED if limits is None else limits)))
        assert engine.static_cache == ((kv_cache or kv_default) == "static")
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


def since(engine: BatchEngine, start: int) -> list[StepRecord]:
    return list(engine.history)[start:]


def references(engine: BatchEngine, rows: list[Row]) -> list[str]:
    """Each row run alone: every forward of its run holds that row only."""
    out = []
    for r in rows:
        start = len(engine.history)
        out.append(engine.run([r])[0])
        assert {h.rows for h in since(engine, start)} == {1}
    return out


def decode_steps_alone(engine: BatchEngine, r: Row) -> int:
    """How many decode steps `r` takes when it runs alone."""
    start = len(engine.history)
    engine.run([r])
    return sum(1 for h in since(engine, start) if h.kind == "decode")


def pause_before_forward(engine: BatchEngine, watched: Row, nth: int) -> tuple[threading.Event, threading.Event]:
    """Hold the engine before the `nth` forward that includes `watched` (prefill = 1st): the first event is set
    when it waits there, and it goes on once the second is set."""
    calls = {"n": 0}
    reached, go = threading.Event(), threading.Event()

    def seam(rows: list[Row]) -> None:
        if watched in rows:
            calls["n"] += 1
            if calls["n"] == nth:
                reached.set()
                assert go.wait(30)

    engine.before_generate = seam
    return reached, go


def held(engine: BatchEngine, rows: list[Row], then: Callable[[list[Row]], None] | None = None) -> list[Future]:
    """Queue `rows` while a blocker row's prefill is held open, so they all enter at the next admission. The
    blocker asks for one token: it is done with its prefill and takes no room from them."""
    gate = Gate(then)
    engine.before_generate = gate
    blocker = engine.submit([row(None, "blocker", max_new=1)])
    assert gate.entered.wait(30)
    futures = engine.submit(rows)
    gate.release.set()
    blocker[0].result(timeout=60)
    return futures


def test_queued_rows_enter_in_one_prefill_and_equal_alone(arch: str, model_and_adapters, make_engine) -> None:
    model_dir, adapters = model_and_adapters
    engine = make_engine(model_dir, adapters, slots=3, pinned=("en2es",))
    keys = ["en2es", "es2en", None, "en2de", "en2es", "en2fr", None, "es2en"]
    rows = [row(k, TEXTS[i % len(TEXTS)]) for i, k in enumerate(keys)]
    ref = references(engine, rows)
    # Adapters really change the output: the same text differs per adapter and from the bare backbone.
    same_text = [engine.run([row(k, TEXTS[0])])[0] for k in ("en2es", "en2de", "en2fr", None)]
    assert len(set(same_text)) == 4, same_text

    start = len(engine.history)
    futures = held(engine, rows)
    assert [f.result(timeout=60) for f in futures] == ref
    records = since(engine, start)
    prefills = [h for h in records if h.kind == "prefill"]
    assert [p.rows for p in prefills] == [1, 8]  # the blocker, then every queued row at once
    mixed = prefills[1]
    assert set(mixed.pairs) == {"en2es", "es2en", "en2de", "en2fr", "__base__"}
    assert mixed.distinct_nonpinned == 3  # 3 non-pinned pairs fit 3 slots
    assert len(set(mixed.slots)) == 5 and 0 in mixed.slots
    decodes = [h for h in records if h.kind == "decode"]
    assert decodes[0].seqs == mixed.seqs  # every one of them decodes together from the first step
    assert all(h.rows <= 8 for h in records)


def test_a_row_queued_while_the_last_rows_finish_starts_without_waiting_for_the_slot_poll(
        marian_dir: Path, marian_adapters: Path, make_engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's slot poll (rows waiting for slots held elsewhere) must not swallow a submit's wake-up: a request
    that arrived while the batch's last rows finished waited out the poll (10 ms, here a minute) before its
    prefill. The engine is held right after the batch drained, the row is submitted there, then it goes on."""
    from hunyuan_mt.scheduler import engine as engine_module

    monkeypatch.setattr(engine_module, "SLOT_POLL_S", 60.0)
    drained, go = threading.Event(), threading.Event()

    def held_after_drain(slack: int = 0) -> bool:
        drained.set()
        assert go.wait(30)
        return False

    monkeypatch.setattr(engine_module.heap, "trim_if_grown", held_after_drain)
    engine = make_engine(marian_dir, marian_adapters)
    first = engine.submit([row("en2es", "Hello world.", max_new=4)])   # it finishes in a decode step
    assert drained.wait(30) and first[0].done()
    second = engine.submit([row("en2es", "Open the file.", max_new=2)])
    go.set()
    assert second[0].result(timeout=20)


def test_a_drained_batch_trims_what_it_left_only_past_the_slack_unless_memory_is_short(
        marian_dir: Path, marian_adapters: Path, make_engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pages a lone request freed stay for the next one (heap.trim_if_grown's slack); in light mode (memory
    pressure) every drained batch gives back what it can."""
    from hunyuan_mt.scheduler import engine as engine_module

    asked: list[int] = []
    monkeypatch.setattr(engine_module.heap, "trim_if_grown", lambda slack: asked.append(slack) or False)
    engine = make_engine(marian_dir, marian_adapters)

    def trims(n: int) -> list[int]:
        deadline = time.monotonic() + 10
        while len(asked) < n and time.monotonic() < deadline:
            time.sleep(0.01)   # the loop trims after the round that answered the row
        return asked

    engine.run([row("en2es", "Hello world.", max_new=3)])
    assert trims(1) == [engine_module.heap.DRAIN_SLACK_BYTES]
    engine.set_light_mode(True)
    engine.run([row("en2es", "Open the file.", max_new=3)])
    assert trims(2) == [engine_module.heap.DRAIN_SLACK_BYTES, 0]


def test_row_arriving_mid_decode_joins_at_the_next_step(arch: str, model_and_adapters, make_engine) -> None:
    """A short row sent while a long one decodes joins at the next step, and is answered as soon as it is done,
    while the long row goes on; both equal their runs alone."""
    model_dir, adapters = model_and_adapters
    engine = make_engine(model_dir, adapters, slots=3, max_new_tokens=16)
    long_row = row("en2de", TEXTS[0], max_new=16)
    short_rows = [row("en2fr", TEXTS[1], max_new=3), row(None, TEXTS[2], max_new=4)]
    assert decode_steps_alone(engine, long_row) == 15 and decode_steps_alone(engine, short_rows[0]) == 2
    ref = dict(zip([long_row] + short_rows, references(engine, [long_row] + short_rows)))

    calls = {"long": 0}
    at_step_two, go = threading.Event(), threading.Event()

    def seam(rows: list[Row]) -> None:
        if long_row in rows:
            calls["long"] += 1
            if calls["long"] == 3:  # prefill, decode 1, now decode 2: hold it while the short rows arrive
                at_step_two.set()
                assert go.wait(30)

    engine.before_generate = seam
    start = len(engine.history)
    long_future = engine.submit([long_row])[0]
    assert at_step_two.wait(30)
    short_futures = engine.submit(short_rows)
    answered_before_long: list[bool] = []
    for f in short_futures:
        f.add_done_callback(lambda _f: answered_before_long.append(not long_future.done()))
    go.set()
    assert long_future.result(timeout=60) == ref[long_row]
    assert [f.result(timeout=60) for f in short_futures] == [ref[r] for r in short_rows]
    records = since(engine, start)
    kinds = [(h.kind, h.rows) for h in records]
    # prefill(long), decode(long) x2, then the short rows' prefill right after the held step, then shared steps.
    assert kinds[:4] == [("prefill", 1), ("decode", 1), ("decode", 1), ("prefill", len(short_rows))]
    assert records[4].kind == "decode" and records[4].rows == 1 + len(short_rows)
    assert answered_before_long == [True] * len(short_rows)
    assert records[-1].kind == "decode" and records[-1].rows == 1  # the long row finishes on its own


def test_n_best_row_runs_between_decode_steps_and_leaves_the_batch_exact(arch: str, model_and_adapters,
                                                                          make_engine) -> None:
    """An n-best row (LibreTranslate's alternatives) sent while a row decodes runs as a beam search of its own
    between two decode steps; the decoding row goes on afterwards and still equals its run alone, and the n-best
    row's answer equals its own run alone."""
    model_dir, adapters = model_and_adapters
    engine = make_engine(model_dir, adapters, slots=3, max_new_tokens=12)
    long_row = row("en2de", TEXTS[0], max_new=12)
    nbest_row = dataclasses.replace(row("es2en", TEXTS[2], max_new=6), n_best=3)
    ref_long = references(engine, [long_row])[0]
    ref_nbest = engine.run([nbest_row])[0]
    assert isinstance(ref_nbest, list) and len(ref_nbest) == 3
    assert len(set(ref_nbest)) > 1, ref_nbest  # beams differ on the tiny random models

    at_step_two, go = pause_before_forward(engine, long_row, 3)
    start = len(engine.history)
    long_future = engine.submit([long_row])[0]
    assert at_step_two.wait(30)
    nbest_future = engine.submit([nbest_row])[0]
    go.set()
    assert nbest_future.result(timeout=60) == ref_nbest
    assert long_future.result(timeout=60) == ref_long
    kinds = [(h.kind, h.rows) for h in since(engine, start)]
    assert kinds[:4] == [("prefill", 1), ("decode", 1), ("decode", 1), ("static", 1)]
    assert all(kind == "decode" for kind, _ in kinds[4:]) and len(kinds) == 1 + 11 + 1


def test_rows_of_very_different_lengths_equal_alone(arch: str, model_and_adapters, make_engine) -> None:
    model_dir, adapters = model_and_adapters
    engine = make_engine(model_dir, adapters, slots=3, max_new_tokens=12)
    rows = [row("en2de", "Hi", 3), row("en2de", " ".join(["Open the file and save it."] * 8)), row(None, "Ok.", 7),
            row("en2fr", " ".join(TEXTS), 5), row("es2en", "Hola")]
    ref = references(engine, rows)
    start = len(engine.history)
    futures = held(engine, rows)
    assert [f.result(timeout=60) for f in futures] == ref
    assert max(h.rows for h in since(engine, start)) >= 5  # they did share forwards


def test_adapter_copied_into_a_slot_while_another_slot_decodes(arch: str, model_and_adapters, make_engine) -> None:
    """A row of a new pair evicts an idle pair and is copied into its slot between two decode steps of a row on
    another slot; neither row's output changes."""
    model_dir, adapters = model_and_adapters
    engine = make_engine(model_dir, adapters, slots=2, max_new_tokens=16)
    long_row = row("en2de", TEXTS[0], max_new=16)
    newcomer = row("en2fr", TEXTS[1], max_new=4)
    ref_long, ref_new = references(engine, [long_row, newcomer])
    engine.run([row("es2en", "warm the other slot")])
    assert engine.cache.lru_order() == ["en2de", "en2fr", "es2en"][-2:] or "es2en" in engine.cache.lru_order()
    engine.run([row("en2de", "make en2de resident")])
    assert sorted(engine.cache.lru_order()) == ["en2de", "es2en"]
    es2en_slot = next(r.slot for r in engine.cache.stats().resident if r.key == "es2en")

    at_step, go = pause_before_forward(engine, long_row, 3)
    evictions = engine.cache.stats().evictions
    start = len(engine.history)
    long_future = engine.submit([long_row])[0]
    assert at_step.wait(30)
    new_future = engine.submit([newcomer])[0]
    go.set()
    assert (long_future.result(timeout=60), new_future.result(timeout=60)) == (ref_long, ref_new)
    records = since(engine, start)
    joined = next(h for h in records if h.kind == "prefill" and h.pairs == ("en2fr",))
    assert joined.slots == (es2en_slot,)  # es2en's slot, overwritten while en2de's row was mid-decode
    at = records.index(joined)
    assert any(h.kind == "decode" and "en2de" in h.pairs for h in records[:at])
    assert any(h.kind == "decode" and {"en2de", "en2fr"} <= set(h.pairs) for h in records[at:])
    assert engine.cache.stats().evictions == evictions + 1


def test_never_more_nonpinned_adapters_than_slots(arch: str, model_and_adapters, make_engine) -> None:
    model_dir, adapters = model_and_adapters
    engine = make_engine(model_dir, adapters, slots=2, pinned=("en2es",))
    keys = ["es2en", "en2de", "de2en", "en2fr", "fr2en", "en2zh", "en2es", None]
    rows = [row(k, TEXTS[i % len(TEXTS)]) for i, k in enumerate(keys)]
    ref = references(engine, rows)
    start = len(engine.history)
    futures = held(engine, rows)
    assert [f.result(timeout=60) for f in futures] == ref
    records = since(engine, start)
    decodes = [h for h in records if h.kind == "decode"]
    assert all(h.distinct_nonpinned <= 2 for h in records)
    assert max(h.distinct_nonpinned for h in decodes) == 2
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
        t.join(180)
    for plan, got in zip(plans, results):
        assert got == [ref[r] for r in plan]
    assert all(h.distinct_nonpinned <= 2 for h in engine.history)
    assert all(h.rows <= 6 for h in engine.history)
    stats = engine.cache.stats()
    assert len([r for r in stats.resident if not r.pinned]) <= 2
    assert all(r.leases == 0 for r in stats.resident)
    assert engine.running() == 0 and engine.queued() == 0


def _hot_stream(engine: BatchEngine, hot: str, limit: int) -> tuple[list[Future], Callable[[list[Row]], None]]:
    extra: list[Future] = []

    def keep_hot_busy(rows: list[Row]) -> None:
        if len(extra) < limit:  # a steady stream: a new hot row arrives during every forward
            extra.extend(engine.submit([row(hot, f"hot {len(extra)}")]))

    return extra, keep_hot_busy


def test_fairness_bound_lets_cold_pair_through(marian_dir: Path, marian_adapters: Path, make_engine) -> None:
    engine = make_engine(marian_dir, marian_adapters, slots=1, fairness=3)
    hot, cold = "en2es", "en2de"
    engine.run([row(hot, "warm")])  # resident: the scheduler prefers rows that need no load
    extra, keep_hot_busy = _hot_stream(engine, hot, 12)
    start = len(engine.history)
    futures = held(engine, [row(cold, "cold"), row(hot, "hot first")], then=keep_hot_busy)
    assert all(isinstance(f.result(timeout=60), str) for f in futures + extra)
    prefills = [h for h in since(engine, start) if h.kind == "prefill"][1:]  # after the blocker's
    cold_at = next(i for i, h in enumerate(prefills) if cold in h.pairs)
    # Passed over exactly fairness_max_skips times (3 admissions of younger hot rows), then it goes first.
    assert cold_at == 3
    assert all(set(h.pairs) == {hot} for h in prefills[:3])
    assert prefills[cold_at].pairs == (cold,)
    assert all(h.distinct_nonpinned <= 1 for h in engine.history)


def test_without_fairness_bound_cold_pair_waits_for_stream(marian_dir: Path, marian_adapters: Path,
                                                           make_engine) -> None:
    """The control for the test above: with an unreachable bound the cold row waits out the whole hot stream."""
    engine = make_engine(marian_dir, marian_adapters, slots=1, fairness=1000)
    hot, cold = "en2es", "en2de"
    engine.run([row(hot, "warm")])
    extra, keep_hot_busy = _hot_stream(engine, hot, 6)
    start = len(engine.history)
    futures = held(engine, [row(cold, "cold"), row(hot, "hot first")], then=keep_hot_busy)
    [f.result(timeout=60) for f in futures + extra]
    prefills = [h for h in since(engine, start) if h.kind == "prefill"]
    cold_at = next(i for i, h in enumerate(prefills) if cold in h.pairs)
    assert cold_at == len(prefills) - 1 and sum(p.rows for p in prefills[:cold_at]) >= 7


def test_out_of_memory_splits_and_preempts_and_all_rows_succeed(arch: str, model_and_adapters,
                                                                make_engine) -> None:
    model_dir, adapters = model_and_adapters
    engine = make_engine(model_dir, adapters, slots=3, pinned=("en2es",))
    rows = [row(k, TEXTS[i]) for i, k in enumerate(["en2es", "es2en", None, "en2de", "en2es"])]
    ref = references(engine, rows)

    def oom_above_one(rows: list[Row]) -> None:
        if len(rows) > 1:
            raise torch.OutOfMemoryError("injected: CUDA out of memory")

    start = len(engine.history)
    futures = held(engine, rows, then=oom_above_one)
    assert [f.result(timeout=60) for f in futures] == ref
    assert {h.rows for h in since(engine, start)} == {1}  # only one-row forwards ever completed
    assert engine.stats.oom_splits >= 2 and engine.stats.oom_failures == 0
    assert engine.stats.preempted >= 1  # decode steps of two rows sent the newer one back
    assert all(r.leases == 0 for r in engine.cache.stats().resident)


def test_out_of_memory_single_row_fails_alone(arch: str, model_and_adapters, make_engine) -> None:
    model_dir, adapters = model_and_adapters
    engine = make_engine(model_dir, adapters, slots=3)
    rows = [row("en2es", TEXTS[0]), row("es2en", "POISON " * 5), row("en2de", TEXTS[1]), row(None, TEXTS[2])]
    good = [r for r in rows if not r.text.startswith("POISON")]
    ref = dict(zip(good, references(engine, good)))

    def poison(rows: list[Row]) -> None:
        if any(r.text.startswith("POISON") for r in rows):
            raise torch.OutOfMemoryError("injected")

    futures = held(engine, rows, then=poison)
    for r, f in zip(rows, futures):
        if r.text.startswith("POISON"):
            with pytest.raises(OutOfMemory, match=r"^Out of memory translating one segment of \d+ tokens \(es→en\)"):
                f.result(timeout=60)
        else:
            assert f.result(timeout=60) == ref[r]
    assert engine.stats.oom_failures == 1
    assert all(r.leases == 0 for r in engine.cache.stats().resident)


def test_cpu_allocator_error_counts_as_oom() -> None:
    from hunyuan_mt.scheduler.engine import is_oom

    assert is_oom(torch.OutOfMemoryError("x"))
    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"))
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("out of memory"))


def test_broken_adapter_fails_only_its_rows(marian_dir: Path, adapters_copy: Path, make_engine) -> None:
    tiny_models.corrupt_adapter(adapters_copy / "en2de", "truncate")
    engine = make_engine(marian_dir, adapters_copy, slots=3)
    rows = [row("en2es", TEXTS[0]), row("en2de", TEXTS[1]), row(None, TEXTS[2])]
    futures = held(engine, rows)
    assert futures[0].result(timeout=60)
    assert futures[2].result(timeout=60)
    with pytest.raises(AdapterUnusable, match="en2de"):
        futures[1].result(timeout=60)
    # Remembered: the next request for it fails fast, and others keep being served.
    assert isinstance(engine.run_each([row("en2de", "x"), row("en2es", "y")])[0], AdapterUnusable)


def test_token_budget_bounds_the_live_rows(marian_dir: Path, marian_adapters: Path, make_engine) -> None:
    engine = make_engine(marian_dir, marian_adapters, max_tokens=40)
    rows = [row("en2es", TEXTS[0])] * 6
    length = engine.backbone.encode(engine._prompt_row(rows[0])).tokens
    per_batch = 40 // length
    assert 1 < per_batch < 6
    start = len(engine.history)
    futures = held(engine, rows)
    [f.result(timeout=60) for f in futures]
    records = since(engine, start)[1:]  # after the blocker's prefill
    assert max(h.rows for h in records if h.kind == "decode") == per_batch
    assert [h.rows for h in records if h.kind == "prefill"] == [per_batch, 6 - per_batch]


def test_unexpected_error_fails_only_the_row_that_causes_it(marian_dir: Path, marian_adapters: Path,
                                                             make_engine) -> None:
    engine = make_engine(marian_dir, marian_adapters)
    rows = [row("en2es", TEXTS[0]), row("es2en", "BREAKS THE MODEL"), row(None, TEXTS[2])]
    ref = {r: engine.run([r])[0] for r in rows if r.text != "BREAKS THE MODEL"}

    def breaks(batch: list[Row]) -> None:
        if any(r.text == "BREAKS THE MODEL" for r in batch):
            raise RuntimeError("shape mismatch somewhere")

    futures = held(engine, rows, then=breaks)
    with pytest.raises(RuntimeError, match="shape mismatch somewhere"):
        futures[1].result(timeout=60)
    assert [futures[0].result(timeout=60), futures[2].result(timeout=60)] == [ref[rows[0]], ref[rows[2]]]
    assert engine.stats.error_splits >= 1
    engine.before_generate = None
    assert engine.run([rows[0]]) == [ref[rows[0]]]  # the engine keeps serving
    assert engine.run([row("en2es", "   ")]) == [""]  # nothing to translate: no model call


def test_max_new_tokens_capped_by_model_positions(marian_dir: Path, marian_adapters: Path, make_engine) -> None:
    # The tiny Marian has 128 positions and a 2-token decoder prefix: asking for 500 new tokens gives 126.
    engine = make_engine(marian_dir, marian_adapters, max_new_tokens=500)
    encoded = engine.backbone.encode(engine._prompt_row(row("en2es", TEXTS[0])))
    assert len(encoded.decoder_prefix) == 2
    assert engine.backbone.max_new_tokens(encoded, 500) == 126
    assert isinstance(engine.run([row("en2es", TEXTS[0])])[0], str)


def test_over_long_row_fails_alone_at_submit(arch: str, model_and_adapters, make_engine) -> None:
    """A row over the model's input limit is refused when it is submitted: it never reaches a forward, and the
    rows sent with it run together with the output they have alone."""
    engine = make_engine(*model_and_adapters)
    limit = engine.backbone.max_input_tokens
    assert limit is not None
    long_row = row("en2es", "Hello world " * 200)
    tokens = engine.backbone.encode(engine._prompt_row(long_row)).tokens
    assert tokens > limit
    rows = [row("en2es", TEXTS[0]), long_row, row(None, TEXTS[2])]
    ref = references(engine, [rows[0], rows[2]])
    seen: list[list[str]] = []
    futures = held(engine, rows, then=lambda batch: seen.append([r.text for r in batch]))
    with pytest.raises(InputTooLarge) as info:
        futures[1].result(timeout=60)
    assert info.value.message == (f"A segment of {tokens} tokens is longer than this model's limit of {limit} "
                                  "tokens; split the text into shorter segments.")
    assert [futures[0].result(timeout=60), futures[2].result(timeout=60)] == ref
    # One prefill, without the long row (one caller's rows enter shortest first).
    assert sorted(seen[0]) == sorted([TEXTS[0], TEXTS[2]])
    assert all(long_row.text not in texts for texts in seen)
    assert engine.stats.error_splits == 0


def test_row_waits_for_a_slot_then_gets_busy(marian_dir: Path, marian_adapters: Path, make_engine) -> None:
    """Every slot held by someone else: the row waits in the queue (the loop keeps serving others), then fails
    with Busy after cache.lease_timeout_s; once the slot is free, the same request succeeds."""
    engine = make_engine(marian_dir, marian_adapters, slots=1, lease_timeout_s=0.3)
    cache = engine.cache
    with cache.lease([Pair.parse("en2de")]):
        waiting = engine.submit([row("en2fr", TEXTS[0])])[0]
        assert engine.run([row(None, TEXTS[1])])[0] is not None  # the bare backbone needs no slot
        with pytest.raises(Busy) as err:
            waiting.result(timeout=30)
    assert err.value.message == ("Cannot attach adapter en2fr: all 1 adapter slots are held by running requests "
                                 "(waited 0.3 s); try again.")
    assert cache.stats().busy == 1
    assert isinstance(engine.run([row("en2fr", TEXTS[0])])[0], str)


def test_beam_search_runs_whole_batches_equal_alone(hunyuan_dir: Path, hunyuan_adapters: Path,
                                                    make_engine) -> None:
    engine = make_engine(hunyuan_dir, hunyuan_adapters, gen=GenerationConfig(num_beams=3))
    assert not engine.iteration_level and engine.status()["mode"] == "static"
    rows = [row(k, TEXTS[i]) for i, k in enumerate(["en2es", "es2en", None, "en2de"])]
    ref = references(engine, rows)
    start = len(engine.history)
    futures = held(engine, rows)
    assert [f.result(timeout=60) for f in futures] == ref
    assert [(h.kind, h.rows) for h in since(engine, start)] == [("static", 1), ("static", 4)]


def test_pivot_second_hop_joins_the_running_batch(marian_dir: Path, marian_adapters: Path) -> None:
    """A pivot's second hop is submitted when its first hop is answered, and enters the batch while a long row
    of another request is still decoding."""
    from hunyuan_mt.runtime.backbone import Backbone
    from hunyuan_mt.config import load_config
    from hunyuan_mt.service.translation import TranslationService

    cfg = load_config(overrides={
        "model.path": str(marian_dir), "model.warmup": False, "cache.adapters_dir": str(marian_adapters),
        "cache.pinned": [], "routing.pivot": "en", "memory.enabled": False, "limits.max_new_tokens": 4,
        "engine.max_wait_ms": 0, "engine.split_sentences": False, "model.quantization": "none",
        # The long row must run its 60 tokens (the random model loops, which the guard would cut after a few
        # steps, and then how far it got before the second hop came would depend on the step's speed).
        **{f"limits.{k}": v for k, v in UNGUARDED.items()}}, env={})
    service = TranslationService(cfg, backbone=Backbone.load_uncached(cfg.model))
    try:
        engine = service.engine
        long_row = row("en2fr", TEXTS[0], max_new=60)
        pivot_text = "Hola mundo."
        expected = service.translate(pivot_text, "es", "de").text  # each hop: 4 tokens (limits.max_new_tokens)
        limits = engine.limits
        engine.limits = LimitsConfig(max_new_tokens=60, **UNGUARDED)  # only the long row, submitted now, gets 60
        long_ref = engine.run([long_row])[0]
        state = {"hop1_seen": False, "hop1_done": False, "hop2_seen": False}

        def seam(rows: list[Row]) -> None:
            if any(r.src == "es" for r in rows):
                state["hop1_seen"] = True
            elif state["hop1_seen"]:
                state["hop1_done"] = True
            if any(r.src == "en" and r.tgt == "de" for r in rows):
                state["hop2_seen"] = True
            if long_row in rows and state["hop1_done"] and not state["hop2_seen"]:
                # The first hop is answered: hold the long row until the service has sent the second hop.
                end = time.monotonic() + 30
                while engine.queued() == 0 and time.monotonic() < end:
                    time.sleep(0.002)

        engine.before_generate = seam
        start = len(engine.history)
        long_future = engine.submit([long_row])[0]
        engine.limits = limits
        result: dict[str, str] = {}
        pivot = threading.Thread(target=lambda: result.update(text=service.translate(pivot_text, "es", "de").text))
        pivot.start()
        pivot.join(60)
        assert long_future.result(timeout=60) == long_ref and result["text"] == expected
        records = since(engine, start)
        hop2 = next(i for i, h in enumerate(records) if h.kind == "prefill" and h.pairs == ("en2de",))
        assert any(h.kind == "decode" and "en2fr" in h.pairs for h in records[:hop2])
        assert any(h.kind == "decode" and {"en2fr", "en2de"} <= set(h.pairs) for h in records[hop2:])
    finally:
        service.close()


def test_waiting_rows_are_gathered_for_a_few_steps_before_they_join(marian_dir: Path, marian_adapters: Path,
                                                                    fresh_backbone, make_cache) -> None:
    """While rows decode, one arriving row waits max_join_steps decode steps so later arrivals can share its
    prefill; enough waiting rows (join_ratio of the live ones) join at the next step."""
    backbone = fresh_backbone(marian_dir)
    cache = make_cache(backbone, marian_adapters, slots=3)
    engine = BatchEngine(backbone, cache, EngineConfig(max_wait_ms=0, join_ratio=0.5, max_join_steps=2),
                         GenerationConfig(), LimitsConfig(max_new_tokens=30, **UNGUARDED))
    try:
        long_rows = [row("en2de", t, max_new=30) for t in TEXTS[:4]]
        submitted: dict[str, list[Future]] = {}

        def seam(rows: list[Row]) -> None:
            done = engine.stats.decode_steps  # decode forwards completed so far
            if done == 2 and "one" not in submitted:
                # One row arrives during the 3rd decode step: 1 < 0.5 x 4 live rows, so it waits 2 steps.
                submitted["one"] = engine.submit([row("en2fr", "one", max_new=3)])
            if done == 9 and "three" not in submitted:
                # Three arrive during the 10th: 3 >= 0.5 x 4 live rows (the lone one is done), they join at once.
                submitted["three"] = engine.submit([row(None, f"three {i}", max_new=3) for i in range(3)])

        engine.before_generate = seam
        start = len(engine.history)
        futures = engine.submit(long_rows)
        for f in futures:
            f.result(timeout=60)
        for fs in submitted.values():
            [f.result(timeout=60) for f in fs]
        records = since(engine, start)
        kinds = [h.kind for h in records]
        prefills = [i for i, k in enumerate(kinds) if k == "prefill"]
        assert len(prefills) == 3, kinds
        one, three = prefills[1], prefills[2]
        # Arrived during step 3; steps 3 and 4 ran before it joined.
        assert records[one].pairs == ("en2fr",) and kinds[:one].count("decode") == 4, kinds
        # Arrived during step 10; joined right after it.
        assert records[three].rows == 3 and kinds[:three].count("decode") == 10, kinds
    finally:
        engine.close()


def test_starved_row_holds_back_slot_users_but_not_pinned_rows(marian_dir: Path, marian_adapters: Path,
                                                                make_engine) -> None:
    """Once a cold row is starved, younger rows that would hold a slot wait behind it, while rows of a pinned
    pair (they hold no slot) keep entering."""
    engine = make_engine(marian_dir, marian_adapters, slots=1, pinned=("en2es",), fairness=2)
    hot, cold, pinned = "en2de", "en2fr", "en2es"
    engine.run([row(hot, "warm")])
    sent: list[Future] = []

    def streams(rows: list[Row]) -> None:
        if len(sent) < 16:  # every forward: one hot row and one pinned row arrive
            sent.extend(engine.submit([row(hot, f"hot {len(sent)}", max_new=4),
                                       row(pinned, f"pinned {len(sent)}", max_new=4)]))

    start = len(engine.history)
    futures = held(engine, [row(cold, "cold", max_new=4), row(hot, "hot first", max_new=4)], then=streams)
    assert all(isinstance(f.result(timeout=60), str) for f in futures + sent)
    prefills = [h for h in since(engine, start) if h.kind == "prefill"][1:]
    cold_at = next(i for i, h in enumerate(prefills) if cold in h.pairs)
    starved_from = 2  # the cold row was passed over twice
    assert all(hot not in h.pairs for h in prefills[starved_from:cold_at])  # slot users held back...
    assert any(pinned in h.pairs for h in prefills[starved_from:cold_at])  # ...pinned rows still entered
    assert all(h.distinct_nonpinned <= 1 for h in engine.history)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_static_cache_gives_the_dynamic_caches_output(hunyuan_dir: Path, hunyuan_adapters: Path, fresh_backbone,
                                                      make_cache, attention: str) -> None:
    """The preallocated cache (rows from column 0, a mask of filled columns, per-row writes) computes what the
    left-padded dynamic cache computes, with either attention: row for row, in one batch of mixed lengths."""
    rows = [row("en2es", "Hi", 5), row("es2en", " ".join(TEXTS), 12), row(None, TEXTS[2], 9),
            row("en2de", TEXTS[3] * 3, 12), row("en2es", TEXTS[4], 2)]
    outs = {}
    for kv in ("dynamic", "static"):
        backbone = fresh_backbone(hunyuan_dir, attn_implementation=attention)
        cache = make_cache(backbone, hunyuan_adapters, slots=3)
        engine = BatchEngine(backbone, cache, EngineConfig(max_wait_ms=0, kv_cache=kv, max_seq_len=192),
                             GenerationConfig(), LimitsConfig(max_new_tokens=12, **UNGUARDED))
        try:
            assert engine.static_cache == (kv == "static")
            outs[kv] = [f.result(timeout=60) for f in held(engine, rows)]
            if kv == "static":
                status = engine.status()
                assert status["kv_cache_layout"] == "static" and status["cuda_graphs"] is None  # CPU: eager
                storage = engine._batch.storage
                assert storage.keys[0].shape[0] == 32 and storage.keys[0].shape[2] == 192
        finally:
            engine.close()
    assert outs["static"] == outs["dynamic"]


def test_static_cache_row_length_is_bounded(hunyuan_dir: Path, hunyuan_adapters: Path, make_engine,
                                            fresh_backbone) -> None:
    short = row("en2es", "Hi")
    probe = fresh_backbone(hunyuan_dir)
    n = probe.encode(BatchEngine._prompt_row(short)).tokens
    width = n + 20  # room for 20 tokens of the short row; the limit allows 40
    engine = make_engine(hunyuan_dir, hunyuan_adapters, kv_cache="static", max_seq_len=width, max_new_tokens=40)
    long_row = row("en2es", "Hello world " * 20)
    tokens = engine.backbone.encode(engine._prompt_row(long_row)).tokens
    assert width <= tokens < engine.backbone.max_input_tokens
    with pytest.raises(InputTooLarge) as info:
        engine.run([long_row])
    assert info.value.message == (f"A segment of {tokens} tokens is longer than the {width} tokens a row of the KV "
                                  "cache holds (engine.max_seq_len); split the text into shorter segments.")
    start = len(engine.history)
    engine.run([short])
    # New tokens stop where the row's cache row ends: 20, the first from the prefill, then 19 decode steps.
    assert sum(1 for h in since(engine, start) if h.kind == "decode") == 19


def test_light_mode_switches_the_static_cache_to_fp8_mid_flight(hunyuan_dir: Path, hunyuan_adapters: Path,
                                                                make_engine) -> None:
    """Entering light mode converts the live rows' cache to fp8 between two steps (half the bytes); rows that run
    wholly in fp8 still equal their runs alone in fp8 (the scales are per row); leaving converts back."""
    engine = make_engine(hunyuan_dir, hunyuan_adapters, kv_cache="static", max_seq_len=128, max_new_tokens=12)
    full = engine.status()["kv_cache_bytes"]
    long_row = row("en2de", TEXTS[0], max_new=12)
    flipped = threading.Event()

    def seam(rows: list[Row]) -> None:
        if long_row in rows and not flipped.is_set():
            flipped.set()
            engine.set_light_mode(True)  # from another thread in real life (the memory monitor); applied by the loop

    engine.before_generate = seam
    assert isinstance(engine.run([long_row])[0], str)  # converted under it, and it finished
    engine.before_generate = None
    status = engine.status()
    assert status["light_mode"] and status["kv_cache"] == "fp8" and status["mode"] == "iteration"
    # fp8 (half the bytes) for a quarter of the rows (light mode admits max_rows / 4), plus small scales
    assert engine._batch.storage.capacity == 8 and status["kv_cache_bytes"] < full / 8 * 1.1
    rows = [row(k, TEXTS[i], 8) for i, k in enumerate(["en2es", "es2en", None, "en2de"])]
    ref = references(engine, rows)
    assert [f.result(timeout=60) for f in held(engine, rows)] == ref
    engine.set_light_mode(False)
    assert isinstance(engine.run([row("en2es", TEXTS[5])])[0], str)
    assert engine.status()["kv_cache_bytes"] == full and engine._batch.storage.capacity == 32


# ---------------------------------------------------------------------------------------------------- degenerate output


def _alone(backbone: Any, text: str, guarded: bool, max_new: int = 60, stutter: bool = False) -> Any:
    """One bare-backbone row through a fresh running batch, alone: the finished `Live` row. The cut is tested
    without the stutter block (which changes what the row generates), the block on its own."""
    encoded = backbone.encode(PromptRow(text, "en", "es"))
    batch = backbone.new_batch(GenerationConfig())
    batch.guard = LoopGuard(stutter=stutter)
    with backbone.model_lock, torch.inference_mode():
        batch.add([DecodeSequence(0, encoded.input_ids, BASE_SLOT, max_new, encoded.decoder_prefix, guarded)])
        while True:
            done = batch.pop_finished()
            if done:
                return done[0]
            batch.step()


def _expected_cut(tokens: list[int]) -> tuple[list[int], int] | None:
    """Where the guard must stop an unguarded output: (the kept tokens, how many had been generated)."""
    for t in range(1, len(tokens) + 1):
        keep = LoopGuard(stutter=False).cut(tokens[:t])
        if keep is not None:
            return tokens[:keep], t
    return None


@pytest.mark.parametrize("model", ["marian", "hunyuan"])
def test_a_looping_row_stops_at_once_and_keeps_one_copy(model: str, request: pytest.FixtureRequest,
                                                        fresh_backbone) -> None:
    backbone = fresh_backbone(request.getfixturevalue(f"{model}_dir"))
    looping = 0
    for text in TEXTS:
        free = _alone(backbone, text, guarded=False).generated
        guarded = _alone(backbone, text, guarded=True)
        expected = _expected_cut(free)
        if expected is None:
            assert guarded.generated == free and guarded.cut is None
            continue
        looping += 1
        kept, steps = expected
        assert guarded.output == kept and len(guarded.generated) == steps < len(free)
    assert looping >= 2, "the tiny random models should loop on some of TEXTS; the test would prove nothing"


@pytest.mark.parametrize("model", ["marian", "hunyuan"])
def test_a_stuttering_row_never_takes_the_third_copy(model: str, request: pytest.FixtureRequest,
                                                     fresh_backbone) -> None:
    backbone = fresh_backbone(request.getfixturevalue(f"{model}_dir"))
    guard = LoopGuard()
    changed = 0
    for text in TEXTS:
        free = _alone(backbone, text, guarded=False).generated
        row = _alone(backbone, text, guarded=True, stutter=True).generated
        # At every step the row took something else than the token that would have begun a third copy...
        assert all(guard.third_copy(row[:t]) != row[t] for t in range(len(row)))
        # ...and until the first such step it generated what it generates free.
        first = next((t for t in range(len(free)) if guard.third_copy(free[:t]) == free[t]), None)
        if first is None:
            assert row == free
        else:
            changed += 1
            assert row[:first] == free[:first] and row[first] != free[first]
    assert changed >= 2, "the tiny random models should stutter on some of TEXTS; the test would prove nothing"


@pytest.mark.parametrize("stutter", [False, True])
def test_guarded_rows_in_one_batch_equal_their_runs_alone(arch: str, model_and_adapters, make_engine,
                                                          stutter: bool) -> None:
    model_dir, adapters = model_and_adapters
    engine = make_engine(model_dir, adapters, max_new_tokens=48,
                         limits={"loop_repeats": 3, "max_output_ratio": 0, "loop_stutter": stutter})
    rows = [row(key, text) for key in ("en2de", "es2en", None) for text in TEXTS]
    alone = references(engine, rows)
    cut_alone = engine.status()["loops_cut"]
    # The stutter block keeps the tiny models from most loops: then the cut has little to do.
    assert cut_alone >= (0 if stutter else 2)
    assert [f.result(timeout=120) for f in held(engine, rows)] == alone
    assert engine.status()["loops_cut"] == 2 * cut_alone


def test_the_engine_answers_the_cut_output_and_counts_it(make_engine, marian_dir: Path, marian_adapters: Path,
                                                         fresh_backbone) -> None:
    engine = make_engine(marian_dir, marian_adapters, max_new_tokens=60,
                         limits={"loop_repeats": 3, "max_output_ratio": 0, "loop_stutter": False})
    looping = next(t for t in TEXTS if _expected_cut(_alone(engine.backbone, t, guarded=False).generated))
    kept, _ = _expected_cut(_alone(engine.backbone, looping, guarded=False).generated)
    assert engine.run([row(None, looping)])[0] == engine.backbone.decode(kept)
    assert engine.status()["loops_cut"] == 1


def test_a_source_that_repeats_itself_is_not_guarded(make_engine, marian_dir: Path, marian_adapters: Path) -> None:
    """"ha ha ha …" may well be translated by a repeating output: such rows are left to their token limit."""
    engine = make_engine(marian_dir, marian_adapters, max_new_tokens=8,
                         limits={"loop_repeats": 3, "max_output_ratio": 0})
    flags: dict[str, bool] = {}
    engine.before_generate = lambda rows: flags.update({p.row.text: p.guarded for p in engine._running.values()})
    engine.run([row(None, "ha " * 12), row(None, TEXTS[0])])
    assert flags == {"ha " * 12: False, TEXTS[0]: True}


def test_the_output_cap_follows_the_source_length(make_engine, marian_dir: Path, marian_adapters: Path) -> None:
    engine = make_engine(marian_dir, marian_adapters, max_new_tokens=200,
                         limits={"loop_repeats": 0, "max_output_ratio": 0.5, "output_slack_tokens": 2})
    text = TEXTS[0]
    tokens = engine.backbone.encode(PromptRow(text, "en", "es")).tokens
    assert decode_steps_alone(engine, row(None, text)) == math.ceil(0.5 * tokens) + 2 - 1  # the first token is the
    assert engine.status()["length_capped"] == 1                                           # prefill's


# ------------------------------------------------------------------------------------------------------------------
# Tickets: cancel, background rows yield, token listeners.


def leases(engine: BatchEngine) -> int:
    return sum(r.leases for r in engine.cache.stats().resident)


def test_cancelled_rows_leave_the_running_batch_at_the_next_step(arch: str, model_and_adapters, make_engine) -> None:
    """A client that goes away mid-decode: its rows are in the step during which it cancelled, in none after it,
    their leases are back before the next step, and the row that stays gives its output alone."""
    model_dir, adapters = model_and_adapters
    engine = make_engine(model_dir, adapters, max_new_tokens=40)
    keep = row("en2de", TEXTS[1], max_new=40)
    gone = [row("en2es", TEXTS[0], max_new=40), row("en2fr", TEXTS[3], max_new=40)]
    ref = references(engine, [keep])
    ticket = Ticket()
    seen = {"n": 0}
    reached, go = threading.Event(), threading.Event()
    at_next: dict[str, Any] = {}

    def seam(rows: list[Row]) -> None:
        if keep in rows:
            seen["n"] += 1
            if seen["n"] == 6:
                reached.set()
                assert go.wait(30)
            elif seen["n"] == 7:
                at_next.update(leases=leases(engine), rows=list(rows))

    engine.before_generate = seam
    start = len(engine.history)
    f_keep = engine.submit([keep])
    f_gone = engine.submit(gone, ticket)
    assert reached.wait(30)
    assert leases(engine) == 3
    ticket.cancel("client disconnected")
    go.set()
    assert f_keep[0].result(timeout=60) == ref[0]
    for f in f_gone:
        with pytest.raises(Cancelled, match="client disconnected"):
            f.result(timeout=60)
    with_keep = [h for h in since(engine, start) if "en2de" in h.pairs]
    cancelled_during = with_keep[5]
    assert {"en2es", "en2fr"} <= set(cancelled_during.pairs)
    after = list(engine.history)[list(engine.history).index(cancelled_during) + 1:]
    assert after and not any({"en2es", "en2fr"} & set(h.pairs) for h in after)
    assert at_next["rows"] == [keep] and at_next["leases"] == 1
    assert leases(engine) == 0
    assert (engine.stats.cancelled, engine.stats.cancelled_running) == (2, 2)


def test_a_queued_row_of_a_cancelled_ticket_never_runs(marian_dir: Path, marian_adapters: Path, make_engine) -> None:
    engine = make_engine(marian_dir, marian_adapters)
    ticket = Ticket()
    gate = Gate()
    engine.before_generate = gate
    blocker = engine.submit([row(None, "blocker", max_new=1)])
    assert gate.entered.wait(30)
    start = len(engine.history)
    queued = engine.submit([row("en2es", TEXTS[0])], ticket)
    ticket.cancel("job cancelled")
    gate.release.set()
    blocker[0].result(timeout=60)
    with pytest.raises(Cancelled, match="job cancelled"):
        queued[0].result(timeout=60)
    assert not any("en2es" in h.pairs for h in since(engine, start))
    assert (engine.stats.cancelled, engine.stats.cancelled_running) == (1, 0)


def test_a_ticket_hears_each_rows_tokens_after_every_step(arch: str, model_and_adapters, make_engine) -> None:
    model_dir, adapters = model_and_adapters
    engine = make_engine(model_dir, adapters, max_new_tokens=12)
    rows = [row("en2es", TEXTS[0], max_new=12), row(None, TEXTS[2], max_new=5)]
    heard: dict[int, list[list[int]]] = {0: [], 1: []}
    finals: dict[int, list[bool]] = {0: [], 1: []}

    def listen(i: int, ids: list[int], done: bool) -> None:
        heard[i].append(ids)
        finals[i].append(done)

    outs = engine.run(rows, ticket=Ticket(on_tokens=listen))
    for i, r in enumerate(rows):
        snapshots = heard[i]
        lengths = [len(s) for s in snapshots]
        assert lengths == list(range(lengths[0], lengths[0] + len(lengths))), lengths  # one more token each step
        assert lengths[-1] == r.max_new_tokens
        assert all(b[:len(a)] == a for a, b in zip(snapshots, snapshots[1:]))
        assert engine.backbone.decode(snapshots[-1]) == outs[i]
        assert finals[i] == [False] * (len(snapshots) - 1) + [True]


def test_a_listening_row_shares_a_step_with_rows_that_have_no_ticket(marian_dir: Path, marian_adapters: Path,
                                                                    make_engine) -> None:
    """A stream's rows beside rows submitted without a ticket (a warm-up, a caller that does not listen): the
    decode loop read `ticket.final_only` of every running row and failed with AttributeError on None, which
    failed every row in the batch (the page's first translation, in the browser tests)."""
    engine = make_engine(marian_dir, marian_adapters, max_new_tokens=6)
    gate = Gate()
    engine.before_generate = gate
    blocker = engine.submit([row(None, "blocker", max_new=1)])
    assert gate.entered.wait(30)
    heard: list[int] = []
    plain = engine.submit([row("en2es", TEXTS[1], max_new=6)])
    streamed = engine.submit([row("en2es", TEXTS[0], max_new=6)],
                             Ticket(on_tokens=lambda i, ids, done: heard.append(len(ids))))
    gate.release.set()
    blocker[0].result(timeout=60)
    assert isinstance(plain[0].result(timeout=60), str) and isinstance(streamed[0].result(timeout=60), str)
    assert heard and heard == sorted(heard)


def test_background_rows_give_their_places_to_an_interactive_row(marian_dir: Path, marian_adapters: Path,
                                                                 make_engine) -> None:
    """A full batch of document rows: an interactive row enters at the very next forward, the newest document
    rows go back to the queue for it (two stay: engine.background_rows), and every document row still gives its
    output alone."""
    engine = make_engine(marian_dir, marian_adapters, max_rows=4, max_new_tokens=30)
    docs = [row(None, t, max_new=30) for t in TEXTS]
    short = row("en2es", "Hola mundo.", max_new=5)
    ref_docs, ref_short = references(engine, docs), references(engine, [short])
    reached, go = pause_before_forward(engine, docs[2], 4)
    start = len(engine.history)
    f_docs = engine.submit(docs, Ticket(background=True))
    assert reached.wait(30)
    f_short = engine.submit([short])
    go.set()
    assert f_short[0].result(timeout=60) == ref_short[0]
    assert [f.result(timeout=60) for f in f_docs] == ref_docs
    records = since(engine, start)
    held_at = [n for n, h in enumerate(records) if h.rows == 4 and h.kind == "decode"][2]
    assert records[held_at + 1].kind == "prefill" and records[held_at + 1].pairs == ("en2es",)
    assert all(h.rows <= 4 for h in records)
    assert engine.stats.yielded == 2


def test_beside_an_interactive_row_only_background_rows_share_the_batch(marian_dir: Path, marian_adapters: Path,
                                                                        make_engine) -> None:
    """Eight document rows decode; an interactive row arrives: the six newest go back to the queue, the steps
    it decodes in hold it and two document rows, and once it is answered the others come back."""
    engine = make_engine(marian_dir, marian_adapters, max_rows=8, max_new_tokens=30)
    assert (engine.cfg.background_rows, engine.cfg.background_prefill_rows) == (2, 4)
    docs = [row(None, f"{t} ({n})", max_new=30) for n, t in enumerate(TEXTS + TEXTS[:2])]
    short = row("en2es", "Hola mundo.", max_new=5)
    ref_docs, ref_short = references(engine, docs), references(engine, [short])
    reached, go = pause_before_forward(engine, docs[0], 3)
    start = len(engine.history)
    f_docs = engine.submit(docs, Ticket(background=True))
    assert reached.wait(30)
    f_short = engine.submit([short])
    go.set()
    assert f_short[0].result(timeout=60) == ref_short[0]
    assert [f.result(timeout=60) for f in f_docs] == ref_docs
    records = since(engine, start)
    with_short = [h for h in records if "en2es" in h.pairs]
    assert with_short[0].kind == "prefill" and with_short[0].rows == 1
    assert [h.rows for h in with_short[1:]] == [3] * (len(with_short) - 1)  # itself and 2 document rows
    assert engine.stats.yielded == 6
    after = records[records.index(with_short[-1]) + 1:]
    assert max(h.rows for h in after if h.kind == "decode") > 2  # the document rows came back


def test_document_prefills_stay_small_only_while_interactive_traffic_is_about(marian_dir: Path,
                                                                             marian_adapters: Path,
                                                                             make_engine) -> None:
    """A document alone enters in one prefill (full speed when nobody waits); after an interactive request, its
    rows enter at most engine.background_prefill_rows a prefill, so a request arriving meanwhile waits for a
    small forward."""
    engine = make_engine(marian_dir, marian_adapters, max_rows=16, max_new_tokens=3)
    docs = [row(None, f"{TEXTS[n % len(TEXTS)]} {n}", max_new=3) for n in range(12)]
    start = len(engine.history)
    engine.run(docs, ticket=Ticket(background=True))
    assert [h.rows for h in since(engine, start) if h.kind == "prefill"] == [12]
    engine.run([row("en2es", "Hola mundo.", max_new=2)])
    start = len(engine.history)
    engine.run(docs, ticket=Ticket(background=True))
    prefills = [h.rows for h in since(engine, start) if h.kind == "prefill"]
    assert sum(prefills) == 12 and max(prefills) <= engine.cfg.background_prefill_rows == 4


# ---------------------------------------------------------------------------------------------------- chunked prefill

#: 160 prompt tokens on the tiny Hunyuan (three pieces of at most 64); TEXTS' prompts take 52-55 (one piece).
LONG = ("Open the settings page, choose the printer you want to use, check that it has paper and ink, then press "
        "print and wait until the whole document has come out of the tray before you close the lid.")


def _pieces(records: list[StepRecord], seq: int) -> list[int]:
    """Positions in `records` of the prefill forwards that held row `seq`."""
    return [i for i, h in enumerate(records) if h.kind == "prefill" and seq in h.seqs]


def test_a_long_prompt_prefills_in_pieces_with_a_decode_step_between_each_two(hunyuan_dir: Path,
                                                                            hunyuan_adapters: Path,
                                                                            make_engine) -> None:
    """A prompt longer than `engine.prefill_chunk_tokens` is prefilled a piece a round, and the running row
    decodes a step between every two pieces (it is not stalled for the whole prefill); both rows give what they
    give alone, and what one whole prefill gives."""
    from seams import hold

    whole = make_engine(hunyuan_dir, hunyuan_adapters, max_new_tokens=40, prefill_chunk="off")
    engine = make_engine(hunyuan_dir, hunyuan_adapters, max_new_tokens=40, prefill_chunk="64")
    running, long = row("en2es", TEXTS[0], max_new=30), row("en2es", LONG, max_new=6)
    alone = references(engine, [running, long])
    assert references(whole, [running, long]) == alone
    start = len(engine.history)
    reached, go, _ = hold(engine, TEXTS[0], nth=2)   # the running row's first decode step
    first = engine.submit([running])[0]
    assert reached.wait(30)
    second = engine.submit([long])[0]
    go.set()
    assert [first.result(60), second.result(60)] == alone
    records = since(engine, start)
    seq = next(h.seqs[0] for h in records if h.kind == "prefill" and h.padded_tokens > 64)
    pieces = _pieces(records, seq)
    tokens = records[pieces[0]].padded_tokens
    assert len(pieces) == -(-tokens // 64) >= 3
    between = [[h.kind for h in records[a + 1:b]] for a, b in zip(pieces, pieces[1:])]
    assert between == [["decode"]] * (len(pieces) - 1)
    assert records[pieces[-1] + 1].kind == "decode" and records[pieces[-1] + 1].rows == 2
    assert engine.status()["prefilling"] == 0


def test_a_row_cancelled_between_its_pieces_runs_no_more_of_them(hunyuan_dir: Path, hunyuan_adapters: Path,
                                                                  make_engine) -> None:
    from seams import hold

    engine = make_engine(hunyuan_dir, hunyuan_adapters, max_new_tokens=40, prefill_chunk="64")
    running = row("en2es", TEXTS[0], max_new=12)
    alone = references(engine, [running])
    start = len(engine.history)
    reached, go, after = hold(engine, LONG[:40], nth=2)   # the long row's second piece
    ticket = Ticket()
    first = engine.submit([running])[0]
    second = engine.submit([row("en2es", LONG, max_new=6)], ticket)[0]
    assert reached.wait(30)
    ticket.cancel("client disconnected")
    go.set()
    with pytest.raises(Cancelled):
        second.result(30)
    assert first.result(60) == alone[0]
    records = since(engine, start)
    seq = next(h.seqs[0] for h in records if h.kind == "prefill" and h.padded_tokens > 64)
    assert len(_pieces(records, seq)) == 2     # the one held was the last
    assert not any(LONG[:40] in r.text for rows in after[1:] for r in rows)
    assert engine.status()["prefilling"] == 0 and engine.running() == 0


def test_an_interactive_row_prefills_before_the_rest_of_a_documents_long_prompt(hunyuan_dir: Path,
                                                                               hunyuan_adapters: Path,
                                                                               make_engine) -> None:
    from seams import hold

    engine = make_engine(hunyuan_dir, hunyuan_adapters, max_new_tokens=40, prefill_chunk="64")
    doc, short = row("en2es", LONG, max_new=6), row("en2es", TEXTS[1], max_new=4)
    alone = references(engine, [doc, short])
    start = len(engine.history)
    reached, go, _ = hold(engine, LONG[:40], nth=1)   # the document's first piece
    f_doc = engine.submit([doc], Ticket(background=True))[0]
    assert reached.wait(30)
    f_short = engine.submit([short])[0]
    go.set()
    assert [f_doc.result(60), f_short.result(60)] == alone
    records = since(engine, start)
    doc_seq = records[0].seqs[0]
    short_seq = next(h.seqs[0] for h in records if h.kind == "prefill" and doc_seq not in h.seqs)
    doc_pieces, short_prefill = _pieces(records, doc_seq), _pieces(records, short_seq)
    assert len(doc_pieces) >= 3 and len(short_prefill) == 1
    # It starts after the piece that was running when it arrived, before the document's next one.
    assert doc_pieces[0] < short_prefill[0] < doc_pieces[1]


def test_a_short_request_prefills_beside_a_long_prompt_and_a_long_one_waits_for_it(hunyuan_dir: Path,
                                                                                   hunyuan_adapters: Path,
                                                                                   make_engine) -> None:
    """Beside an interactive long prompt's prefill, while other rows decode, a request whose prompt is one
    forward starts a prefill of its own before the long prompt's next piece (at once: not gathered for a few
    steps, which here are a piece each); a second long prompt waits for the first one's last piece."""
    from seams import hold

    engine = make_engine(hunyuan_dir, hunyuan_adapters, max_new_tokens=40, prefill_chunk="64")
    running = [row("en2es", text, max_new=30) for text in TEXTS[:4]]
    long, other, short = (row("en2es", LONG, max_new=6), row("en2es", LONG.replace("printer", "scanner"), max_new=6),
                          row("en2es", TEXTS[5], max_new=4))
    alone = references(engine, running + [long, other, short])
    start = len(engine.history)
    reached, go, _ = hold(engine, LONG[:40], nth=1)   # the first long prompt's first piece
    futures = engine.submit(running) + engine.submit([long])
    assert reached.wait(30)
    futures += engine.submit([other]) + engine.submit([short])
    go.set()
    assert [f.result(60) for f in futures] == alone
    prefills = [h.seqs for h in since(engine, start) if h.kind == "prefill"]
    first, second, third = sorted({seq for seqs in prefills for seq in seqs})[-3:]   # in the order submitted
    order = [seqs for seqs in prefills if set(seqs) & {first, second, third}]
    assert order == [(first,), (third,), (first,), (first,), (second,), (second,), (second,)]


def test_light_mode_mid_prefill_lets_the_prefill_and_the_running_batch_finish(hunyuan_dir: Path,
                                                                               hunyuan_adapters: Path,
                                                                               make_engine) -> None:
    """Memory pressure arrives during a long prompt's pieces, with a short request queued beside it: the prefill
    under way completes and its row decodes with the running one to the end (what they give alone); the short
    request and rows after it run as light mode runs them."""
    engine = make_engine(hunyuan_dir, hunyuan_adapters, max_new_tokens=40, prefill_chunk="64")
    running, long = row("en2es", TEXTS[0], max_new=12), row("en2es", LONG, max_new=6)
    alone = references(engine, [running, long])
    started, flipped, queued = threading.Event(), threading.Event(), threading.Event()

    def seam(rows: list[Row]) -> None:
        if any(r.text == TEXTS[0] for r in rows):
            started.set()
        if rows == [long] and not flipped.is_set():
            flipped.set()
            engine.set_light_mode(True)  # from another thread in real life (the memory monitor)
            assert queued.wait(30)

    engine.before_generate = seam
    start = len(engine.history)
    first = engine.submit([running])[0]
    assert started.wait(30)
    second = engine.submit([long])[0]
    assert flipped.wait(30)
    short = engine.submit([row("en2es", TEXTS[1], 4)])[0]
    queued.set()
    assert [first.result(60), second.result(60)] == alone
    assert isinstance(short.result(60), str)
    engine.before_generate = None
    records = since(engine, start)
    assert sum(1 for h in records if h.kind == "prefill" and h.padded_tokens > 64) == 3   # all its pieces
    assert engine.status()["light_mode"] and engine.status()["prefilling"] == 0 and engine.running() == 0
    assert isinstance(engine.run([row("en2es", TEXTS[5], 6)])[0], str)
    engine.set_light_mode(False)


def test_a_piece_out_of_memory_sends_its_row_back_until_the_batch_drains(hunyuan_dir: Path, hunyuan_adapters: Path,
                                                                        make_engine) -> None:
    """Out of memory in a later piece of a long prompt: the rows it made live stay, the row goes back to the
    queue and enters again once the running batch drained (as a whole prefill that does not fit does)."""
    engine = make_engine(hunyuan_dir, hunyuan_adapters, max_new_tokens=40, prefill_chunk="64")
    running, long = row("en2es", TEXTS[0], max_new=10), row("en2es", LONG, max_new=6)
    alone = references(engine, [running, long])
    start = len(engine.history)
    seen = {"n": 0}
    started = threading.Event()

    def seam(rows: list[Row]) -> None:
        if any(r.text == TEXTS[0] for r in rows):
            started.set()
        if len(rows) == 1 and rows[0].text == LONG:
            seen["n"] += 1
            if seen["n"] == 2:
                raise torch.OutOfMemoryError("CPU out of memory (test)")

    engine.before_generate = seam
    first = engine.submit([running])[0]
    assert started.wait(30)
    second = engine.submit([long])[0]
    assert [first.result(60), second.result(60)] == alone
    assert engine.status()["preempted"] == 1 and engine.status()["oom_failures"] == 0
    records = since(engine, start)
    long_seqs = {h.seqs[0] for h in records if h.kind == "prefill" and h.padded_tokens > 64}
    assert len(long_seqs) == 1
    pieces = _pieces(records, long_seqs.pop())
    # The first try's pieces before the failure, then a whole new run of them once the running row finished.
    running_seq = records[0].seqs[0]
    assert len(pieces) == 1 + -(-records[pieces[0]].padded_tokens // 64)
    assert pieces[1] > max(i for i, h in enumerate(records) if running_seq in h.seqs)


@pytest.mark.parametrize("owners", [True, False], ids=["owners-take-turns", "control-one-owner"])
def test_another_callers_row_enters_ahead_of_a_flood_of_rows(marian_dir: Path, marian_adapters: Path, make_engine,
                                                            owners: bool) -> None:
    """Twelve rows of one caller, then one row of another, queued together with room for four: with owners on
    the tickets, the other caller's row enters in the first prefill (turns: one of the flood, then it, then the
    flood's next); the control, where every row has the same owner, lets it in only after the whole flood (the
    arrival order), the way a page's flood queued another key's sentence behind it."""
    engine = make_engine(marian_dir, marian_adapters, slots=3, pinned=("en2es",), max_rows=4)
    flood = [row("en2es", f"{TEXTS[i % len(TEXTS)]} {i}", max_new=8) for i in range(12)]
    mine = row("en2es", "Open the file.", max_new=8)
    alone = references(engine, [mine])[0]
    start = len(engine.history)
    gate = Gate()
    engine.before_generate = gate
    blocker = engine.submit([row(None, "blocker", max_new=1)])
    assert gate.entered.wait(30)
    f_flood = engine.submit(flood, Ticket(owner="addr:127.0.0.2"))
    f_mine = engine.submit([mine], Ticket(owner="key:k2" if owners else "addr:127.0.0.2"))[0]
    gate.release.set()
    blocker[0].result(timeout=60)
    assert f_mine.result(timeout=60) == alone  # the row's output does not depend on when it entered
    assert all(isinstance(f.result(timeout=60), str) for f in f_flood)
    prefills = [h for h in since(engine, start) if h.kind == "prefill"][1:]  # after the blocker's
    mine_seq = max(s for h in prefills for s in h.seqs)  # queued last: the highest sequence number
    entered_in = next(i for i, h in enumerate(prefills) if mine_seq in h.seqs)
    assert entered_in == (0 if owners else len(prefills) - 1), [h.seqs for h in prefills]
    if not owners:
        assert sum(h.rows for h in prefills[:entered_in]) == 12


@pytest.mark.parametrize("owners", [True, False], ids=["owners-share-the-batch", "control-one-owner"])
def test_another_callers_row_takes_a_place_of_a_full_batch_at_once(marian_dir: Path, marian_adapters: Path,
                                                                   make_engine, owners: bool) -> None:
    """Four long rows of one caller fill the batch (four places) and four more wait. Another caller's row, queued
    while they decode, enters at the next round: the flood's newest running row goes back to the queue for it
    (each owner's share is two places now). The control, one owner throughout, waits for the flood's first rows
    to finish their 30 tokens. Every row's output equals the row run alone, the one sent back included."""
    engine = make_engine(marian_dir, marian_adapters, slots=3, pinned=("en2es",), max_rows=4, max_new_tokens=40)
    flood = [row("en2es", f"{TEXTS[i % len(TEXTS)]} {i}", max_new=30) for i in range(8)]
    mine = row("en2es", "Open the file.", max_new=5)
    alone = references(engine, flood + [mine])
    start = len(engine.history)
    calls = {"n": 0}
    reached, go = threading.Event(), threading.Event()

    def seam(rows: list[Row]) -> None:
        calls["n"] += 1
        if calls["n"] == 5:  # the flood's fourth decode step: its four rows are live
            reached.set()
            assert go.wait(30)

    engine.before_generate = seam
    f_flood = engine.submit(flood, Ticket(owner="addr:127.0.0.2"))
    assert reached.wait(30)
    f_mine = engine.submit([mine], Ticket(owner="key:k2" if owners else "addr:127.0.0.2"))[0]
    go.set()
    assert [f.result(timeout=60) for f in f_flood] + [f_mine.result(timeout=60)] == alone
    records = since(engine, start)
    mine_seq = max(s for h in records for s in h.seqs)
    entered = next(i for i, h in enumerate(records) if mine_seq in h.seqs)
    assert records[entered].kind == "prefill"
    if owners:
        assert entered == 5 and engine.status()["yielded"] >= 1, [(h.kind, h.rows) for h in records[:8]]
        assert all(h.rows <= 4 for h in records if mine_seq in h.seqs)
    else:
        assert entered >= 30, [(h.kind, h.rows) for h in records[:8]]
