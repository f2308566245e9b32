"""The compiled decode step (decode/compiled.py): what it computes, that one graph serves every batch, and that it
falls back to the eager step when compiling fails.

One backbone (the tiny Marian with int8 weights, as the CPU profile runs, and q/v adapters) is compiled once for
the module: ahead of time, 46–56 s for the step and the encoder on the 2-core box the first time, then read from
the package cache (decode/aot.py). The float32 tests compile a second one, its weights frozen into the packages.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.runtime.backbone import PromptRow
from hunyuan_mt.config import GenerationConfig
from hunyuan_mt.decode import Sequence
from row_logits import assert_rows_as_alone  # tests/ is on sys.path

TEXTS = ["Hello world, how are you today?", "Open the file, save the document and close the window.",
         "Hola mundo", "The quick brown fox.", "Datei öffnen", "Bonjour le monde, encore une fois."]


@pytest.fixture(scope="module")
def compiled(marian_dir: Path, marian_adapters: Path):
    """(backbone with the compiled step, its adapter cache, slots of en2es/en2fr/en2de)."""
    yield from _compiled_backbone(marian_dir, marian_adapters, "int8")


@pytest.fixture(scope="module")
def compiled_fp32(marian_dir: Path, marian_adapters: Path):
    """The same in float32: the weights frozen into the step's package. Its encoder stays eager (the frozen
    encoder is the same mechanism, and its compile would add ~20 s to the suite)."""
    yield from _compiled_backbone(marian_dir, marian_adapters, "none", encoder=False)


def _compiled_backbone(marian_dir: Path, marian_adapters: Path, quantization: str, encoder: bool = True):
    from hunyuan_mt.decode import compiled as compiled_module
    from hunyuan_mt.decode.compiled import CompiledEncoder
    from hunyuan_mt.adapters.cache import AdapterCache
    from hunyuan_mt.adapters.registry import AdapterRegistry
    from hunyuan_mt.runtime.backbone import Backbone
    from hunyuan_mt.config import CacheConfig, ModelConfig

    # Two threads, as the CPU profile runs: eager forwards of few rows would drop to one, and a compiled graph is
    # specific to its thread count.
    threads = torch.get_num_threads()
    bb = Backbone.load_uncached(ModelConfig(path=str(marian_dir), warmup=False, quantization=quantization,
                                            cpu_threads=2))
    registry = AdapterRegistry(marian_adapters, bb.spec)
    registry.scan()
    cache = AdapterCache(bb, registry, CacheConfig(adapters_dir=str(marian_adapters), slots=3))
    cache.start()
    lease = cache.lease([Pair.parse(k) for k in ("en2es", "en2fr", "en2de")])
    slots = list(lease.__enter__().slots)
    with pytest.MonkeyPatch.context() as patch:
        if not encoder:
            # compile_step makes a new step and encoder (an encoder set eager beforehand was replaced, and its two
            # packages compiled: ~35 s of CPU on a fresh machine), so the class it makes is one that stays eager.
            class EagerEncoder(CompiledEncoder):
                def __init__(self, freeze: bool = False, build: bool = True) -> None:
                    super().__init__(freeze, build)
                    self.error = "eager in these tests"

            patch.setattr(compiled_module, "CompiledEncoder", EagerEncoder)
        assert bb.compile_step(), bb.compiled[0].error
    if not encoder:
        assert not bb.compiled[1].active and bb.compiled[1].graphs == 0
    yield bb, cache, slots
    lease.__exit__(None, None, None)
    torch.set_num_threads(threads)


def _rows(n: int) -> list[PromptRow]:
    return [PromptRow(TEXTS[i % len(TEXTS)], "en", "es") for i in range(n)]


def _script(bb, slots: list[int], compiled: bool) -> list[tuple[torch.Tensor, list[int]]]:
    """Rows on mixed adapters (and the bare backbone) decoding, two joining mid-way, one leaving: (logits, row tags)
    at every step."""
    batch = bb.new_batch(GenerationConfig())
    if not compiled:
        batch.compiled = None
    assert (batch.compiled is not None) == compiled
    batch.picker.finished = lambda token, row: False  # the random model would stop rows at different steps
    seen: list[tuple[torch.Tensor, list[int]]] = []
    choose = batch._choose

    def record(logits, live):
        seen.append((logits.clone(), [r.seq.tag for r in live]))
        choose(logits, live)

    batch._choose = record
    enc = {i: bb.encode(PromptRow(TEXTS[i], "en", "es")) for i in range(5)}
    slot = {0: 0, 1: slots[0], 2: slots[1], 3: slots[0], 4: slots[2]}
    with torch.inference_mode():
        batch.add([Sequence(i, enc[i].input_ids, slot[i], 40, enc[i].decoder_prefix) for i in (0, 1)])
        for _ in range(3):
            batch.step()
        batch.add([Sequence(i, enc[i].input_ids, slot[i], 40, enc[i].decoder_prefix) for i in (2, 3)])
        for _ in range(2):
            batch.step()
        batch.drop({0})
        batch.add([Sequence(4, enc[4].input_ids, slot[4], 40, enc[4].decoder_prefix)])
        for _ in range(3):
            batch.step()
    return seen


@pytest.mark.parametrize("profile", ["compiled", "compiled_fp32"])
def test_compiled_logits_equal_the_eager_step(profile: str, request) -> None:
    bb, _, slots = request.getfixturevalue(profile)
    calls = bb.compiled[0].calls
    eager, ours = _script(bb, slots, compiled=False), _script(bb, slots, compiled=True)
    assert bb.compiled[0].calls >= calls + 8  # every decode step of the second run went through the compiled graph
    assert [tags for _, tags in ours] == [tags for _, tags in eager]
    for (a, _), (b, _) in zip(ours, eager):
        # Fused kernels round in another order, and int8 rounding of the activations can amplify that.
        torch.testing.assert_close(a, b, atol=2e-3, rtol=1e-2)


@pytest.mark.parametrize("profile", ["compiled", "compiled_fp32"])
def test_compiled_rows_in_a_mixed_batch_equal_rows_alone(profile: str, request) -> None:
    """A row's greedy output is what it is alone, whatever its neighbours, on the compiled step: the padding row and
    the complete LoRA masks leak nothing into real rows. In float32 the frozen weights run oneDNN's packed GEMM, as
    the eager step's do."""
    bb, _, slots = request.getfixturevalue(profile)
    rows = _rows(6)
    row_slots = [0, slots[0], slots[1], slots[2], slots[0], slots[1]]
    together = bb.generate(rows, row_slots, GenerationConfig(), 12)
    alone = [bb.generate([r], [s], GenerationConfig(), 12)[0] for r, s in zip(rows, row_slots)]
    assert together == alone


@pytest.mark.parametrize("profile", ["compiled", "compiled_fp32"])
def test_compiled_rows_joining_at_different_steps_have_the_logits_they_have_alone(profile: str, request) -> None:
    """Invariant 5 to the bit on the compiled step (tests/test_batch_invariance.py has the eager step on the demo
    model): rows on three adapters and the bare backbone, joining a running batch at different steps, so that their
    cache columns sit at different offsets and the batch's widths change under them. This tiny model's rows start
    with two decoder tokens, which a prefill runs eagerly; with float32 weights frozen into the step that eager
    forward multiplies the unpacked weights (MKL), whose rows must be padded (`invariant.linear`) too."""
    bb, _, slots = request.getfixturevalue(profile)
    row_slots = [slots[0], 0, slots[1], slots[2], slots[0], slots[1]]
    items = [(PromptRow(TEXTS[i], "en", "es"), s) for i, s in enumerate(row_slots)]
    assert_rows_as_alone(bb, items, joins=[0, 2, 0, 5, 1, 3], compiled=True)


def test_one_graph_serves_every_batch(compiled) -> None:
    """The warm-up compiles one graph for the step and two for the encoder (a lone source, and every batch of
    sources), and nothing compiles again: one row, many rows, mixed adapters, the bare backbone, a one-token source,
    rows past the cache's first 32 columns, a row joining a longer history."""
    bb, _, slots = compiled
    calls = bb.compiled[0].calls
    gen = GenerationConfig()
    bb.generate(_rows(1), [slots[0]], gen, 6)
    bb.generate(_rows(3), [slots[0], 0, slots[1]], gen, 6)
    bb.generate(_rows(9), [0] * 9, gen, 6)
    bb.generate([PromptRow("", "en", "es"), PromptRow("Hola", "en", "es")], [slots[2], slots[2]], gen, 6)
    batch = bb.new_batch(gen)
    batch.picker.finished = lambda token, row: False
    enc = bb.encode(PromptRow(TEXTS[1], "en", "es"))
    with torch.inference_mode():
        batch.add([Sequence(0, enc.input_ids, slots[0], 70, enc.decoder_prefix)])
        for _ in range(40):
            batch.step()
        batch.add([Sequence(1, enc.input_ids[:3], slots[1], 70, enc.decoder_prefix)])
        for _ in range(5):
            batch.step()
    assert batch.cache.columns > 32
    step, encoder = bb.compiled
    assert (step.graphs, encoder.graphs) == (1, 2)
    # The lone source ran without a padding row: its package takes exactly one row.
    (single,) = encoder._single.packages
    (batches,) = encoder._fn.packages
    assert single.key != batches.key
    assert step.calls > calls + 60 and step.active and encoder.active


def test_a_second_start_reads_the_compiled_packages_from_disk(compiled) -> None:
    """The packages the warm-up compiled are found by a new step on the same backbone (a restart) and loaded, not
    compiled again; they compute the same."""
    from hunyuan_mt.decode.compiled import CompiledEncoder, CompiledStep

    bb, _, slots = compiled
    first = bb.compiled
    rows, row_slots = _rows(3), [slots[0], 0, slots[1]]
    reference = bb.generate(rows, row_slots, GenerationConfig(), 8)
    bb.compiled = (CompiledStep(), CompiledEncoder())
    try:
        assert bb.generate(rows, row_slots, GenerationConfig(), 8) == reference
        for fresh, old in zip(bb.compiled, first):
            (package,) = fresh._fn.packages
            assert not package.compiled and package.key == old._fn.packages[0].key
    finally:
        bb.compiled = first


def test_a_call_the_package_does_not_fit_falls_back_to_eager(compiled, fresh_backbone, marian_dir: Path,
                                                             caplog) -> None:
    """The compiled code checks each call's inputs in C++: a call that does not fit (here self-attention keys of
    another dtype) is refused with AotMismatch instead of computing garbage; the step then logs it once and runs
    eagerly from there on, with the same output."""
    from hunyuan_mt.decode.aot import AotMismatch
    from hunyuan_mt.decode.compiled import CompiledEncoder, CompiledStep

    bb, _, slots = compiled
    step = bb.compiled[0]
    seen = []
    run = step._run
    step._run = lambda args, eager: seen.append(args) or run(args, eager)
    try:
        bb.generate(_rows(2), [slots[0], slots[1]], GenerationConfig(), 3)
    finally:
        del step._run
    args = list(seen[-1])
    args[4] = [t.to(torch.float64) for t in args[4]]
    with pytest.raises(AotMismatch, match="unmatched dtype"):
        step._fn(tuple(args), step.STATIC)

    plain = fresh_backbone(marian_dir, quantization="int8")
    reference = plain.generate(_rows(3), [0] * 3, GenerationConfig(), 8)
    refusing, encoder = CompiledStep(), CompiledEncoder()
    encoder.error = "eager here"  # this backbone has no slot layers: its encoder would be a package of its own

    def refuse(args, static):
        raise AotMismatch("input_handles[4]: unmatched dtype")

    refusing._fn = refuse
    plain.compiled = (refusing, encoder)
    with caplog.at_level("WARNING", logger="hunyuan_mt.decode.compiled"):
        assert plain.generate(_rows(3), [0] * 3, GenerationConfig(), 8) == reference
        assert plain.generate(_rows(3), [0] * 3, GenerationConfig(), 8) == reference
    assert not refusing.active and "unmatched dtype" in refusing.error
    assert sum("runs eagerly" in r.getMessage() for r in caplog.records) == 1


def test_compile_applies_to_marian_steps_in_int8_and_float32(hunyuan_dir: Path, marian_dir: Path,
                                                              fresh_backbone, compiled, compiled_fp32) -> None:
    bb = fresh_backbone(hunyuan_dir)
    assert bb.compile_note() is None  # the lean decoder-only step compiles too (tests/test_llama_step.py)
    bb.batch_class = None  # a model the decode loop does not cover
    assert "no lean decode step to compile" in bb.compile_note()
    assert bb.compile_step() is False and bb.compiled is None
    assert fresh_backbone(marian_dir).compile_note() is None
    # int8 weights are inputs of the packages; float32 ones are compiled in (frozen).
    assert [c.frozen for c in compiled[0].compiled] == [False, False]
    assert compiled_fp32[0].compiled[0].frozen
    half = fresh_backbone(marian_dir, dtype="bfloat16")
    assert "int8 and float32" in half.compile_note()


def test_compile_setting_reads_yaml_booleans_and_refuses_others() -> None:
    from hunyuan_mt.config import ModelConfig
    from hunyuan_mt.errors import ConfigError

    assert ModelConfig(compile=False).compile == "off"
    assert ModelConfig(compile=True).compile == "on"
    assert ModelConfig().compile == "auto"
    assert ModelConfig(compile="false").compile == "off"  # HMT_MODEL__COMPILE=false and --set arrive as strings
    with pytest.raises(ConfigError) as info:
        ModelConfig(compile="fast")
    assert "model.compile" in info.value.message and "auto, true, false" in info.value.message


def test_the_service_compiles_only_when_it_warms_up(marian_dir: Path, marian_adapters: Path) -> None:
    from hunyuan_mt.runtime.backbone import Backbone
    from hunyuan_mt.config import load_config
    from hunyuan_mt.service.translation import TranslationService

    cfg = load_config(None, {"model.path": str(marian_dir), "model.warmup": False, "tm.enabled": False,
                             "model.quantization": "int8",
                             "cache.adapters_dir": str(marian_adapters), "cache.pinned": []}, env={})
    bb = Backbone.load_uncached(cfg.model)
    service = TranslationService(cfg, backbone=bb)
    try:
        assert bb.compiled is None
    finally:
        service.close()

