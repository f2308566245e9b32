"""The lean decode step against transformers, the grouped LoRA against the slot layers, int8 weights, and the
engine's scheduling rules that came with them (threads per forward, no idle wait, a backlog joining in groups).

The lean Marian step computes what transformers' MarianMTModel computes for each row alone: logits per step are
compared in float32 with the model's own forward over the row's whole history, the row's adapter set in the slot
mapping, for rows on different adapters and rows that join while others decode.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.runtime.backbone import PromptRow
from hunyuan_mt.config import EngineConfig, GenerationConfig, LimitsConfig
from hunyuan_mt.decode import Sequence
from hunyuan_mt.lora import BASE_SLOT
from tiny_models import UNGUARDED

#: What the demo's adapters target: every linear of attention and feed-forward (the tiny defaults are q and v).
ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")


@pytest.fixture(scope="module", params=["q_v", "all"])
def adapters(request, tmp_path_factory, marian_dir: Path) -> Path:
    """The tiny Marian's adapters: tiny_models' defaults (q and v), or every linear as the demo's adapters."""
    import tiny_models

    if request.param == "q_v":
        return request.getfixturevalue("marian_adapters")
    root = tmp_path_factory.mktemp("all_targets")
    tiny_models.make_adapters(marian_dir, root, target_modules=ALL_TARGETS)
    return root


TEXTS = ["Hello world, how are you today?", "Open the file, save the document and close the window.",
         "Hola mundo", "The quick brown fox.", "Datei öffnen", "Bonjour le monde."]


def _slots(cache, keys: list[str | None]) -> tuple[object, list[int]]:
    lease = cache.lease([None if k is None else Pair.parse(k) for k in keys])
    held = lease.__enter__()
    return lease, list(held.slots)


def test_lean_marian_logits_equal_transformers_per_step(marian_dir: Path, adapters: Path, fresh_backbone,
                                                        make_cache, monkeypatch) -> None:
    from hunyuan_mt.decode import kvcache

    copies: list[str] = []  # how each compaction copied the cache: every kept row, or only the rows that moved
    for name in ("_keep", "_move"):
        real = getattr(kvcache, name)
        monkeypatch.setattr(kvcache, name, lambda *a, _real=real, _name=name: (copies.append(_name), _real(*a))[1])
    bb = fresh_backbone(marian_dir)
    cache = make_cache(bb, adapters, slots=3)
    lease, slots = _slots(cache, [None, "en2es", "en2fr", "en2de"])
    batch = bb.new_batch(GenerationConfig())
    batch.picker.finished = lambda token, row: False  # the random model would stop rows at different steps
    seen: list[tuple[torch.Tensor, list[tuple[int, list[int]]]]] = []
    choose = batch._choose

    def record(logits, live):
        seen.append((logits.clone(), [(r.seq.tag, list(r.tokens.seen)) for r in live]))
        choose(logits, live)

    batch._choose = record
    encoded = {i: bb.encode(PromptRow(TEXTS[i], "en", "es")) for i in range(5)}
    row_slot = {0: slots[0], 1: slots[1], 2: slots[2], 3: slots[1], 4: slots[3]}
    with torch.inference_mode():
        batch.add([Sequence(i, encoded[i].input_ids, row_slot[i], 40, encoded[i].decoder_prefix) for i in (0, 1)])
        for _ in range(3):
            batch.step()
        # Two rows join three steps in, with sources longer and shorter than the running rows'.
        batch.add([Sequence(i, encoded[i].input_ids, row_slot[i], 40, encoded[i].decoder_prefix) for i in (2, 3)])
        for _ in range(2):
            batch.step()
        batch.drop({0})  # a row leaving mid-decode compacts the cache
        batch.add([Sequence(4, encoded[4].input_ids, row_slot[4], 40, encoded[4].decoder_prefix)])
        for _ in range(3):
            batch.step()
        # A row finishing in the middle: the last row moves into its place, the others stay where they are.
        assert [r.seq.tag for r in batch.rows] == [1, 2, 3, 4]
        batch.rows[1].done = True
        copies.clear()
        batch.compact()
        assert [r.seq.tag for r in batch.rows] == [1, 4, 3]
        assert copies == ["_move", "_move"]  # self- and cross-attention caches, one row each
        for _ in range(2):
            batch.step()
        checked = 0
        for logits, rows in seen:
            for j, (tag, history) in enumerate(rows):
                src = torch.tensor([encoded[tag].input_ids])
                with bb.lora.mapping.use([row_slot[tag]]):
                    ref = bb.model(input_ids=src, decoder_input_ids=torch.tensor([history])).logits[0, -1]
                torch.testing.assert_close(logits[j], ref, atol=1e-4, rtol=1e-3)  # float32, ops fused and reordered
                checked += 1
    lease.__exit__(None, None, None)
    assert checked >= 31  # every row at every step, adapters mixed



@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_final_logits_bias_rides_in_the_output_projection(marian_dir: Path, fresh_backbone,
                                                          quantization: str) -> None:
    """Marian's final logits bias is added by the output projection's GEMM, not after it. The demo's and the tiny
    model's biases are zeros, so this one is set: the lean step's logits still equal transformers' (float32), or
    stay as close to them as int8 keeps the rest (int8), and the step adds no bias of its own."""
    bb = fresh_backbone(marian_dir, quantization=quantization)
    with torch.no_grad():
        bb.model.final_logits_bias.copy_(torch.randn_like(bb.model.final_logits_bias) * 3)
    batch = bb.new_batch(GenerationConfig())
    seen: list[torch.Tensor] = []
    choose = batch._choose
    batch._choose = lambda logits, live: (seen.append(logits.clone()), choose(logits, live))[1]
    encoded = bb.encode(PromptRow(TEXTS[0], "en", "es"))
    with torch.inference_mode():
        batch.add([Sequence(0, encoded.input_ids, BASE_SLOT, 4, encoded.decoder_prefix)])
        batch.step()
        assert batch._decoder_args[-1] is None and batch._head.base[-1] is not None
        ref = bb.model(input_ids=torch.tensor([encoded.input_ids]),
                       decoder_input_ids=torch.tensor([list(encoded.decoder_prefix)])).logits[0, -1]
    tol = dict(atol=1e-4, rtol=1e-3) if quantization == "none" else dict(atol=0.3, rtol=0.05)
    torch.testing.assert_close(seen[0][0], ref, **tol)


def test_lean_encoder_equals_transformers_encoder(marian_dir: Path, adapters: Path, fresh_backbone,
                                                  make_cache) -> None:
    bb = fresh_backbone(marian_dir)
    cache = make_cache(bb, adapters, slots=3)
    lease, slots = _slots(cache, ["en2es", None, "en2fr"])
    batch = bb.new_batch(GenerationConfig())
    ids = [bb.encode(PromptRow(t, "en", "es")).input_ids for t in TEXTS[:3]]
    width = max(len(i) for i in ids)
    src = torch.tensor([i + (0,) * (width - len(i)) for i in ids])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])
    with torch.inference_mode(), bb.lora.mapping.use(slots):
        ours = batch._encode(src, mask)
        ref = bb.model.get_encoder()(input_ids=src, attention_mask=mask).last_hidden_state
    lease.__exit__(None, None, None)
    for row, n in enumerate(len(i) for i in ids):
        torch.testing.assert_close(ours[row, :n], ref[row, :n], atol=1e-4, rtol=1e-3)  # float32, ops fused and reordered


def test_grouped_lora_adds_what_each_slot_layer_adds(marian_dir: Path, adapters: Path, fresh_backbone,
                                                     make_cache) -> None:
    """Q, K and V of one layer through GroupedLoRA equal the three SlotLinear LoRA terms, per row: mixed slots with
    bare rows among them, one slot for all, and all bare."""
    from hunyuan_mt.lora.grouped import GroupedLoRA

    bb = fresh_backbone(marian_dir)
    cache = make_cache(bb, adapters, slots=3)
    lease, (es, fr) = _slots(cache, ["en2es", "en2fr"])
    from hunyuan_mt.lora import SlotLinear

    attn = bb.model.get_decoder().layers[0].self_attn
    modules = [attn.q_proj, attn.k_proj, attn.v_proj]
    layers = [m if isinstance(m, SlotLinear) else None for m in modules]
    # q and v only: a group with a gap (added per projection); all: the fused path over Q, K and V
    assert layers[0] is not None and (None in layers) == (adapters.name != "all_targets0")
    widths = [m.out_features for m in modules]
    grouped = GroupedLoRA(layers, widths, bb.lora.mapping)
    torch.manual_seed(0)
    x = torch.randn(5, modules[0].in_features)
    for slots in ([es, BASE_SLOT, fr, fr, es], [fr] * 5, [BASE_SLOT] * 5):
        with torch.inference_mode(), bb.lora.mapping.use(slots):
            ours = grouped.add_to(x, torch.zeros(5, sum(widths)))
            ref = torch.cat([m(x) - m.base(x) if isinstance(m, SlotLinear) else torch.zeros(5, m.out_features)
                             for m in modules], dim=1)
        # The reference is a difference of two layer outputs, so it carries their float32 rounding (~1e-5).
        torch.testing.assert_close(ours, ref, atol=5e-5, rtol=1e-4)
        assert bool((ours[[i for i, s in enumerate(slots) if s == BASE_SLOT]] == 0).all())
    lease.__exit__(None, None, None)


def test_a_step_reuses_its_lora_terms_until_the_rows_or_the_slots_change(marian_dir: Path, adapters: Path,
                                                                         fresh_backbone, make_cache) -> None:
    """The step's LoRA terms are one tuple kept while nothing they are made of changes, so the step does not ask
    every projection again; a write into the slot (another adapter in the one slot) makes new ones, though the
    rows' slot indices are the same as before it, and a row on that slot gets the new adapter's logits."""
    bb = fresh_backbone(marian_dir)
    cache = make_cache(bb, adapters, slots=1)
    lease, (slot,) = _slots(cache, ["en2es"])
    batch = bb.new_batch(GenerationConfig())
    batch.picker.finished = lambda token, row: False
    seen: list[tuple[int, torch.Tensor, list[int]]] = []
    choose = batch._choose

    def record(logits, live):
        seen.append((live[0].seq.tag, logits[0].clone(), list(live[0].tokens.seen)))
        choose(logits, live)

    batch._choose = record
    encoded = bb.encode(PromptRow(TEXTS[0], "en", "es"))

    def reference(slot_: int, history: list[int]) -> torch.Tensor:
        with bb.lora.mapping.use([slot_]):
            return bb.model(input_ids=torch.tensor([encoded.input_ids]),
                            decoder_input_ids=torch.tensor([history])).logits[0, -1]

    with torch.inference_mode():
        batch.add([Sequence(0, encoded.input_ids, slot, 40, encoded.decoder_prefix)])
        batch.step()
        terms = batch._lora_memo[2]
        batch.step()
        assert batch._lora_memo[2] is terms  # same rows, same slots: the same tuple
        # A write into the slot mid-row (the cache's leases keep this from happening to a running row; the rule
        # is what matters): the next step reads what the slot holds now, here nothing.
        bb.lora.clear(slot)
        batch.step()
        cleared = batch._lora_memo[2]
        assert cleared is not terms
        old_a, new_a = ([t[0] if t[0] is not None else t[4][2] for layer in ts for t in layer if t is not None]
                        for ts in (terms, cleared))
        assert new_a and all(not bool(x.any()) for x in new_a) and any(bool(x.any()) for x in old_a)
        batch.drop({0})
        lease.__exit__(None, None, None)
        lease, (again,) = _slots(cache, ["en2fr"])  # evicts en2es: its weights are written into the same slot
        assert again == slot
        batch.add([Sequence(1, encoded.input_ids, slot, 40, encoded.decoder_prefix)])
        batch.step()
        batch.step()
        assert batch._lora_memo[2] is not terms
        fr = [(logits, history) for tag, logits, history in seen if tag == 1]
        assert len(fr) >= 2
        for logits, history in fr:
            torch.testing.assert_close(logits, reference(slot, history), atol=1e-4, rtol=1e-3)
        lease.__exit__(None, None, None)
        lease, _ = _slots(cache, ["en2es"])  # en2es back in the slot, for its reference
        assert not torch.allclose(fr[-1][0], reference(slot, fr[-1][1]), atol=1e-3)
    lease.__exit__(None, None, None)


# ---------------------------------------------------------------------------------------------------- int8

def test_int8_linear_is_close_to_float32_and_each_row_is_its_own() -> None:
    """Close to the float32 layer, and a row's output is exactly what it is alone, however large its neighbours
    (torch's GEMM alone would quantize all rows on the largest one's scale)."""
    from hunyuan_mt.quant.int8 import Int8Linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    q = Int8Linear.from_linear(linear)
    x = torch.randn(7, 64) * torch.tensor([[0.01], [1.0], [30.0], [1.0], [0.2], [5.0], [1.0]])
    err = (q(x) - linear(x)).norm() / linear(x).norm()
    assert err < 0.02
    alone = torch.cat([q(x[i:i + 1]) for i in range(len(x))])
    assert torch.equal(q(x), alone)
    assert (q.in_features, q.out_features) == (64, 48)
    w, b = q.dequantized()
    assert w.shape == (48, 64) and torch.equal(b, linear.bias.detach())


@pytest.mark.parametrize("kernel", ["int_mm", "fbgemm"])
def test_int8_backbone_keeps_its_spec_and_serves_adapters(marian_dir: Path, marian_adapters: Path, fresh_backbone,
                                                          make_cache, kernel: str) -> None:
    """Every Linear becomes int8 (the kernel configured), the adapters validate against the same shapes, and a
    batch of rows on three adapters (LoRA on top) translates."""
    from hunyuan_mt.quant.int8 import Int8Linear
    from hunyuan_mt.quant.fbgemm import FbgemmLinear

    fp32 = fresh_backbone(marian_dir)
    bb = fresh_backbone(marian_dir, quantization="int8", int8_kernel=kernel)
    assert bb.spec == fp32.spec and bb.int8_kernel == bb.info()["int8_kernel"] == kernel
    assert not any(isinstance(m, torch.nn.Linear) for m in bb.model.modules())
    layer = Int8Linear if kernel == "int_mm" else FbgemmLinear
    assert sum(isinstance(m, layer) for m in bb.model.modules()) == len(fp32.spec.shapes)
    cache = make_cache(bb, marian_adapters, slots=3)
    assert cache.registry.usable_pairs() >= {Pair.parse(k) for k in ("en2es", "en2fr")}
    lease, slots = _slots(cache, [None, "en2es", "en2fr"])
    rows = [PromptRow(t, "en", "es") for t in TEXTS[:3]]
    out = bb.generate(rows, slots, GenerationConfig(), 8)
    lease.__exit__(None, None, None)
    assert len(out) == 3 and all(out)


def test_int8_projection_takes_lora_a_into_its_gemm(marian_dir: Path, adapters: Path, fresh_backbone,
                                                    make_cache) -> None:
    """Over int8 weights A's columns ride in the base GEMM: the LoRA term stays close to the one with x @ A in
    float32, rows on the bare backbone get the base output bit for bit, and the widened weight is built once per
    set of slots in use, not at every admission."""
    from hunyuan_mt.quant import invariant
    from hunyuan_mt.decode.dense import Projection, project
    from hunyuan_mt.quant.int8 import int8_linear
    from hunyuan_mt.lora.grouped import GroupedLoRA

    bb = fresh_backbone(marian_dir, quantization="int8", int8_kernel="int_mm")
    cache = make_cache(bb, adapters, slots=3)
    lease, (es, fr) = _slots(cache, ["en2es", "en2fr"])
    attn = bb.model.get_decoder().layers[0].self_attn
    proj = Projection([attn.q_proj, attn.k_proj, attn.v_proj], bb.lora.mapping)
    float_a = GroupedLoRA(proj.lora.layers, proj.widths, bb.lora.mapping)  # the same term with x @ A in float32
    torch.manual_seed(0)
    x = torch.randn(5, attn.q_proj.in_features)
    built = []
    for slots in ([es, BASE_SLOT, fr, fr, es], [fr, es, BASE_SLOT, es, fr], [fr] * 5):
        with torch.inference_mode(), bb.lora.mapping.use(slots):
            lora, exact = proj.lora_tensors(5, 1, x.device), float_a.tensors(5, 1, x.device)
            weight_t, scale, b_q, b_scale = lora[4]
            assert b_q.dtype == torch.int8 and b_q.shape == exact[1].shape and b_scale.shape == b_q.shape[:-1]
            assert lora[0] is None and exact[4] is None  # over int8 weights no float A is kept
            # The group's whole buffer (room for every slot's columns); the columns in use are as many as the scales.
            # (The float A is padded to whole GEMM tiles, `invariant`; B's rows count the columns in use.)
            a_columns = exact[1].shape[-2] * len(exact[3])
            assert exact[0].shape[1] == invariant.round_up(a_columns, invariant.COLUMNS)
            assert weight_t.dtype == torch.int8 and scale.shape[0] == sum(proj.widths) + a_columns
            assert weight_t.is_contiguous() and weight_t.shape[1] >= scale.shape[0]
            fused = project(x, proj.base, lora)
            exact_a = project(x, proj.base, exact)
            base = int8_linear(x, *proj.base)
            # The term alone (GroupedLoRA.add_to) takes h from the same int8 columns as the one GEMM does.
            alone = proj.lora.add_to(x, torch.zeros_like(base))
        built.append(scale)
        assert (fused - exact_a).norm() < 0.05 * (exact_a - base).norm()
        torch.testing.assert_close(alone, fused - base, atol=1e-5, rtol=1e-5)
        bare = [i for i, s in enumerate(slots) if s == BASE_SLOT]
        assert torch.equal(fused[bare], base[bare])
    assert built[0] is built[1] and built[2] is not built[0]  # the same two slots in another order: no rebuild
    lease.__exit__(None, None, None)


def test_an_adapter_back_in_a_slot_is_not_quantized_again(marian_dir: Path, adapters: Path, fresh_backbone,
                                                          make_cache, monkeypatch) -> None:
    """Over int8 weights each adapter's A and B are quantized once, by what the slot holds, not at each write: an
    adapter evicted from the one slot and attached again gets its kept pieces back, and the term it adds is the
    same bit for bit; another adapter in that slot gets its own."""
    from hunyuan_mt.decode.dense import Projection
    from hunyuan_mt.lora import grouped

    bb = fresh_backbone(marian_dir, quantization="int8", int8_kernel="int_mm")
    cache = make_cache(bb, adapters, slots=1)
    attn = bb.model.get_decoder().layers[0].self_attn
    proj = Projection([attn.q_proj, attn.k_proj, attn.v_proj], bb.lora.mapping)
    quantized: list[int] = []
    real = grouped.quantize_columns
    monkeypatch.setattr(grouped, "quantize_columns", lambda a: quantized.append(a.shape[1]) or real(a))
    torch.manual_seed(0)
    x = torch.randn(3, attn.q_proj.in_features)

    def term(pair: str) -> torch.Tensor:
        lease, (slot,) = _slots(cache, [pair])
        try:
            with torch.inference_mode(), bb.lora.mapping.use([slot] * 3):
                return proj.lora.add_to(x, torch.zeros(3, sum(proj.widths)))
        finally:
            lease.__exit__(None, None, None)

    es = term("en2es")
    assert len(quantized) == 1
    fr = term("en2fr")  # takes the one slot from en2es
    assert len(quantized) == 2 and not torch.equal(fr, es)
    assert torch.equal(term("en2es"), es) and len(quantized) == 2  # back in the slot: its pieces were kept
    assert torch.equal(term("en2fr"), fr) and len(quantized) == 2


def test_float32_projections_run_packed_for_onednn(marian_dir: Path, fresh_backbone) -> None:
    """Float32 bases on the CPU are packed once into oneDNN's layout and compute what the layer computes; a weight
    changed in place is packed again rather than served stale."""
    from hunyuan_mt.decode.dense import PackedFloat, Projection, project

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    bb = fresh_backbone(marian_dir)
    fc1 = bb.model.get_decoder().layers[0].fc1
    proj = Projection([fc1], None)
    assert isinstance(proj.base, PackedFloat) and proj.base.weight.is_mkldnn
    torch.manual_seed(0)
    x = torch.randn(3, fc1.in_features)
    with torch.inference_mode():
        torch.testing.assert_close(project(x, proj.base, None), fc1(x), atol=1e-5, rtol=1e-5)
        assert Projection([fc1], None).base.weight is proj.base.weight  # packed once
    with torch.no_grad():
        fc1.weight.mul_(2)
    with torch.inference_mode():
        torch.testing.assert_close(project(x, Projection([fc1], None).base, None), fc1(x), atol=1e-5, rtol=1e-5)


def test_int8_is_refused_off_the_cpu_with_the_reason() -> None:
    from hunyuan_mt.runtime.backbone import _quantization_config
    from hunyuan_mt.config import ModelConfig
    from hunyuan_mt.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        _quantization_config(ModelConfig(quantization="int8"), "cuda:0", torch.bfloat16)
    assert "int8 runs on the CPU" in info.value.message and "8bit" in info.value.message
    with pytest.raises(ConfigError) as info:
        _quantization_config(ModelConfig(quantization="int4"), "cuda:0", torch.bfloat16)
    assert "int4 runs on the CPU" in info.value.message and "4bit (bitsandbytes)" in info.value.message
    with pytest.raises(ConfigError) as info:
        _quantization_config(ModelConfig(quantization="int4"), "cpu", torch.bfloat16)
    assert "int4 takes a float32 model" in info.value.message



def _gemm_speed(int8_us: float, fbgemm_us: float | None = None) -> "object":
    from hunyuan_mt.quant.int8 import GemmSpeed

    return GemmSpeed(int8_us=int8_us, float32_us=100.0, capability="TEST", fbgemm_us=fbgemm_us)


@pytest.mark.parametrize("int8_us, fbgemm_us, runs, kernel, named", [
    (25.0, 60.0, "int8", "int_mm", "torch._int_mm"),    # AVX-512: torch._int_mm's oneDNN kernel
    (25.0, 20.0, "int8", "int_mm", "torch._int_mm"),    # fbgemm not clearly faster: the path measured end to end
    (2300.0, 55.0, "int8", "fbgemm", "fbgemm"),         # AVX2 alone: torch._int_mm is a plain loop
    (2300.0, 140.0, "none", None, "fbgemm"),            # neither beats float32
    (2300.0, None, "none", None, "torch._int_mm"),      # a build without fbgemm
])
def test_auto_quantization_takes_the_faster_int8_kernel_only_where_it_beats_float32(
        marian_dir: Path, fresh_backbone, monkeypatch, int8_us: float, fbgemm_us: float | None, runs: str,
        kernel: str | None, named: str) -> None:
    """`model.quantization: auto` (the CPU profile's default) times both int8 kernels against float32 at load: on
    a CPU without AVX-512 torch._int_mm is a plain loop, ~25× slower, and fbgemm carries int8 there. What runs, and
    why, is what info() (and so /status and the metrics) reports."""
    from hunyuan_mt.quant import int8
    from hunyuan_mt.quant.int8 import Int8Linear
    from hunyuan_mt.quant.layer import Int8Layer

    monkeypatch.setattr(int8, "gemm_speed", lambda threads=None: _gemm_speed(int8_us, fbgemm_us))
    bb = fresh_backbone(marian_dir, quantization="auto")
    info = bb.info()
    assert info["quantization"] == runs and bb.cfg.quantization == runs
    assert info.get("int8_kernel") == kernel == bb.int8_kernel
    quantized = [m for m in bb.model.modules() if isinstance(m, Int8Layer)]
    assert bool(quantized) == (runs == "int8")
    assert all(isinstance(m, Int8Linear) == (kernel == "int_mm") for m in quantized)
    word = "int8" if runs == "int8" else "float32"
    best = fbgemm_us if named == "fbgemm" else int8_us
    assert info["quantization_note"] == (f"auto: {word} (int8 through {named} takes {best / 100:.2g}× float32's "
                                         f"time on this CPU ({best:.0f} vs 100 µs, TEST))")
    assert bb.compile_note() is None  # both compile (int8 as inputs, float32 frozen in)


def test_int8_kernel_can_be_pinned_and_is_checked(marian_dir: Path, fresh_backbone, monkeypatch) -> None:
    """`model.int8_kernel` pins the kernel whatever the probe prefers (reproducing a run, or comparing the two), and
    refuses one the torch build lacks with a message that says what to set."""
    from hunyuan_mt.quant import int8
    from hunyuan_mt.config import ModelConfig
    from hunyuan_mt.errors import ConfigError

    monkeypatch.setattr(int8, "gemm_speed", lambda threads=None: _gemm_speed(25.0, 60.0))
    bb = fresh_backbone(marian_dir, quantization="auto", int8_kernel="fbgemm")
    assert bb.int8_kernel == "fbgemm"
    assert "int8 through fbgemm takes 0.6× float32's time" in bb.info()["quantization_note"]
    monkeypatch.setattr(int8, "gemm_speed", lambda threads=None: _gemm_speed(25.0, None))
    monkeypatch.setattr(int8.int8_fbgemm, "available", lambda: False)  # a build without fbgemm
    with pytest.raises(ConfigError) as info:
        fresh_backbone(marian_dir, quantization="int8", int8_kernel="fbgemm")
    assert "model.int8_kernel: fbgemm is not in this torch build" in info.value.message
    with pytest.raises(ConfigError) as info:
        ModelConfig(int8_kernel="vnni")
    assert "model.int8_kernel" in info.value.message and "auto, int_mm, fbgemm" in info.value.message


def test_int8_asked_for_on_a_slow_cpu_runs_and_says_so(marian_dir: Path, fresh_backbone, monkeypatch,
                                                        caplog) -> None:
    from hunyuan_mt.quant import int8

    monkeypatch.setattr(int8, "gemm_speed", lambda threads=None: _gemm_speed(2300.0, 140.0))
    with caplog.at_level("WARNING", logger="hunyuan_mt.runtime.backbone"):
        bb = fresh_backbone(marian_dir, quantization="int8")
    assert bb.info()["quantization"] == "int8" and bb.int8_kernel == "fbgemm"  # the faster of two slow ones
    assert "int8 through fbgemm takes 1.4× float32's time" in bb.info()["quantization_note"]
    assert any("set model.quantization to auto or none" in r.getMessage() for r in caplog.records)


def test_auto_quantization_is_float_off_the_cpu_or_off_float32() -> None:
    from hunyuan_mt.runtime.backbone import resolve_quantization
    from hunyuan_mt.config import ModelConfig

    auto = ModelConfig(quantization="auto")
    assert resolve_quantization(auto, "cuda:0", torch.bfloat16) == ("none", "auto: none (int8 runs on the CPU only)")
    assert resolve_quantization(auto, "cpu", torch.bfloat16) == ("none", "auto: none (int8 takes a float32 model)")
    assert resolve_quantization(ModelConfig(quantization="4bit"), "cuda:0", torch.bfloat16) == ("4bit", "")


def test_a_model_larger_than_the_caches_gets_int8_whatever_the_small_probe_says(tmp_path: Path, monkeypatch,
                                                                                 caplog) -> None:
    """The probe times GEMMs that fit the caches; a model whose steps read gigabytes is int8 under `auto`, and an
    explicit int8 is not told to switch to float32 (the probe once read fbgemm at 40× float32 while a 1.8B loaded
    on an AVX2-only Zen 3, and advised float32: 7 GB, several times slower). The demo keeps the probe's verdict."""
    from hunyuan_mt.config import ModelConfig
    from hunyuan_mt.quant import fbgemm as int8_fbgemm, int8
    from hunyuan_mt.runtime.backbone import resolve_quantization

    if not int8_fbgemm.available():
        pytest.skip("no fbgemm in this torch build")
    monkeypatch.setattr(int8, "gemm_speed", lambda threads=None: _gemm_speed(15000.0, 370.0))
    large = tmp_path / "large"
    large.mkdir()
    with open(large / "model.safetensors", "wb") as f:
        f.truncate(2 * int8.LARGE_MODEL_BYTES + 1)   # sparse: its size, not its bytes
    with caplog.at_level("WARNING", logger="hunyuan_mt.runtime.backbone"):
        chosen, note = resolve_quantization(ModelConfig(path=str(large), quantization="auto"), "cpu", torch.float32)
        assert chosen == "int8" and note.startswith("auto: int8 (a model larger than the CPU's caches")
        assert resolve_quantization(ModelConfig(path=str(large), quantization="int8"), "cpu", torch.float32) \
            == ("int8", "")
    assert not caplog.records
    small = tmp_path / "small"
    small.mkdir()
    (small / "model.safetensors").write_bytes(b"0" * 1024)
    chosen, note = resolve_quantization(ModelConfig(path=str(small), quantization="auto"), "cpu", torch.float32)
    assert chosen == "none" and note.startswith("auto: float32 (")


def test_the_int8_speed_probe_times_every_kernel() -> None:
    from hunyuan_mt.quant import fbgemm as int8_fbgemm
    from hunyuan_mt.quant.int8 import gemm_speed

    speed = gemm_speed(torch.get_num_threads())
    assert speed.int8_us > 0 and speed.float32_us > 0 and speed.capability
    assert (speed.fbgemm_us is not None) == int8_fbgemm.available()
    assert speed.kernel in ("int_mm", "fbgemm")
    assert speed.best_us == (speed.fbgemm_us if speed.kernel == "fbgemm" else speed.int8_us)
    assert gemm_speed(torch.get_num_threads()) is speed  # timed once per process and thread count


def test_the_probe_lets_kernels_take_turns_and_drops_one_twenty_times_slower() -> None:
    """Each kernel's best of `_ROUNDS` calls, called in turn so that a disturbance hits them alike; a kernel whose
    first call takes 20× float32's warm call is not called again (torch._int_mm's plain loop)."""
    import time

    from hunyuan_mt.quant import int8

    calls: list[str] = []
    kernels = {"float32": lambda: calls.append("f"), "fbgemm": lambda: calls.append("g"),
               "int_mm": lambda: (calls.append("i"), time.sleep(0.05))}
    us = int8._fastest(kernels)
    assert calls == ["f", "g", "i", "f"] + ["f", "g"] * int8._ROUNDS
    assert us["int_mm"] >= 50_000 and 0 < us["float32"] < 50_000 and 0 < us["fbgemm"] < 50_000


def test_the_probe_times_one_thread_and_gives_the_threads_back(monkeypatch) -> None:
    from hunyuan_mt.quant import int8

    seen: list[int] = []
    before = torch.get_num_threads()
    real = int8._fastest
    monkeypatch.setattr(int8, "_fastest", lambda kernels: (seen.append(torch.get_num_threads()), real(kernels))[1])
    int8.gemm_speed.cache_clear()
    try:
        int8.gemm_speed(before)
    finally:
        int8.gemm_speed.cache_clear()  # later callers time the real probe again
    assert seen == [1] and torch.get_num_threads() == before


# ---------------------------------------------------------------------------------------------------- threads

def test_default_threads_follow_the_openmp_runtime(monkeypatch) -> None:
    from hunyuan_mt.host import cpu

    monkeypatch.setattr(cpu, "usable_cores", lambda: 4)
    monkeypatch.setattr(cpu, "intel_openmp_loaded", lambda: True)
    assert cpu.default_threads() == 4
    monkeypatch.setattr(cpu, "intel_openmp_loaded", lambda: False)
    assert cpu.default_threads() == 3
    monkeypatch.setattr(cpu, "usable_cores", lambda: 1)
    assert cpu.default_threads() == 1


def test_a_forward_gets_threads_by_its_size(marian_dir: Path, fresh_backbone) -> None:
    """One row decodes on one thread; 16 rows on the configured threads; the setting is restored after."""
    from hunyuan_mt.decode.batch import DECODE_ROWS_PER_THREAD

    bb = fresh_backbone(marian_dir)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        batch = bb.new_batch(GenerationConfig())
        batch.picker.finished = lambda token, row: False
        used: list[int] = []
        decode = batch._decode

        def spy(last, pos):
            used.append(torch.get_num_threads())
            return decode(last, pos)

        batch._decode = spy
        e = bb.encode(PromptRow(TEXTS[0], "en", "es"))
        with torch.inference_mode():
            batch.add([Sequence(0, e.input_ids, BASE_SLOT, 20, e.decoder_prefix)])
            batch.step()
            batch.add([Sequence(i, e.input_ids, BASE_SLOT, 20, e.decoder_prefix)
                       for i in range(1, 2 * DECODE_ROWS_PER_THREAD)])
            batch.step()
        assert used == [1, 2]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------------- scheduling

def _engine(marian_dir: Path, marian_adapters: Path, fresh_backbone, make_cache, **engine):
    from hunyuan_mt.scheduler.engine import BatchEngine

    bb = fresh_backbone(marian_dir)
    cache = make_cache(bb, marian_adapters, slots=3)
    return BatchEngine(bb, cache, EngineConfig(**engine), GenerationConfig(),
                       LimitsConfig(max_new_tokens=12, **UNGUARDED))


def test_a_lone_request_on_an_idle_engine_starts_at_once(marian_dir: Path, marian_adapters: Path, fresh_backbone,
                                                         make_cache) -> None:
    from hunyuan_mt.scheduler.engine import Row

    engine = _engine(marian_dir, marian_adapters, fresh_backbone, make_cache, max_wait_ms=3000)
    try:
        engine.run([Row(TEXTS[2], "en", "es", Pair.parse("en2es"))])  # first forwards: lazy initialisation
        started = time.monotonic()
        engine.run([Row(TEXTS[3], "en", "es", Pair.parse("en2es"))], timeout=30)
        assert time.monotonic() - started < 1.5  # not the 3 s batching wait
    finally:
        engine.close()


def test_a_drained_batch_gives_its_lora_stacks_back_and_stacks_them_again_alike(
        marian_dir: Path, marian_adapters: Path, fresh_backbone, make_cache) -> None:
    """When the engine's batch drains it drops the LoRA weights it stacked for its mixes of slots (each projection's
    GroupedLoRA; HY-MT1.5-1.8B with 8 adapters: 186 MB resident after a batch of 16), and keeps each adapter's
    own derived pieces; the same mix later stacks again and translates to the same text."""
    from hunyuan_mt.scheduler.engine import Row

    engine = _engine(marian_dir, marian_adapters, fresh_backbone, make_cache)
    rows = [Row(TEXTS[0], "en", "es", Pair.parse("en2es")), Row(TEXTS[1], "en", "de", Pair.parse("en2de")),
            Row(TEXTS[2], "en", "es", Pair.parse("en2es"))]
    try:
        first = engine.run(rows, timeout=60)
        groups = [p.lora for layer in engine._batch._layers for p in engine._batch._projections(layer)
                  if p.lora is not None]
        assert groups
        pieces = [g._pieces for g in groups]
        deadline = time.monotonic() + 10   # the loop releases right after the rows answered, on its own thread
        while any(g._state is not None for g in groups) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(g._state is None for g in groups)
        # The stacks that were copies are gone; a one-slot stack over int8 weights is that adapter's own pieces
        # (no copy), and stays.
        assert all(len(key[0]) == 1 and g._shares_pieces(key[0]) for g in groups for key in g._weights or ())
        assert all(g._pieces is kept for g, kept in zip(groups, pieces))
        assert engine.run(rows, timeout=60) == first
    finally:
        engine.close()


def test_a_lone_pairs_next_request_stacks_nothing_again(marian_dir: Path, marian_adapters: Path, fresh_backbone,
                                                        make_cache, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over int8 weights a batch of one adapter multiplies that adapter's kept pieces as they are: the stack
    survives the drained batch, and the next request of the pair (a server's common case) takes it without
    stacking again, to the same text."""
    from hunyuan_mt.lora import grouped
    from hunyuan_mt.scheduler.engine import BatchEngine, Row

    stacked: list[tuple[int, ...]] = []
    original = grouped.GroupedLoRA._stack_weights

    def counting(self, used):  # noqa: ANN001, ANN202 - the method's own signature
        stacked.append(used)
        return original(self, used)

    monkeypatch.setattr(grouped.GroupedLoRA, "_stack_weights", counting)
    bb = fresh_backbone(marian_dir, quantization="int8")
    engine = BatchEngine(bb, make_cache(bb, marian_adapters, slots=3), EngineConfig(), GenerationConfig(),
                         LimitsConfig(max_new_tokens=12, **UNGUARDED))
    row = [Row(TEXTS[0], "en", "es", Pair.parse("en2es"))]
    try:
        first = engine.run(row, timeout=60)
        groups = [p.lora for layer in engine._batch._layers for p in engine._batch._projections(layer)
                  if p.lora is not None]
        if not any(g.int8_base is not None for g in groups):
            pytest.skip("the projections here are not over torch._int_mm's int8 weights")
        deadline = time.monotonic() + 10
        while any(g._state is not None for g in groups) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stacked and all(len(used) == 1 for used in stacked)
        before = len(stacked)
        assert engine.run(row, timeout=60) == first
        assert len(stacked) == before
    finally:
        engine.close()


def test_an_idle_engine_waits_for_a_submit_under_way(marian_dir: Path, marian_adapters: Path, fresh_backbone,
                                                     make_cache) -> None:
    """A row queued while another caller is still tokenizing waits for it (max_wait_ms), so both share the first
    prefill."""
    from hunyuan_mt.scheduler.engine import Row

    engine = _engine(marian_dir, marian_adapters, fresh_backbone, make_cache, max_wait_ms=3000)
    try:
        engine.run([Row(TEXTS[2], "en", "es", Pair.parse("en2es"))])
        start = len(engine.history)
        tokenizing, release = threading.Event(), threading.Event()
        encode = engine.backbone.encode

        def slow_encode(row):
            if row.text == TEXTS[1]:
                tokenizing.set()
                release.wait(10)
            return encode(row)

        engine.backbone.encode = slow_encode
        slow = threading.Thread(target=lambda: engine.run([Row(TEXTS[1], "en", "es", Pair.parse("en2es"))]))
        slow.start()
        assert tokenizing.wait(10)
        fast = engine.submit([Row(TEXTS[3], "en", "es", Pair.parse("en2es"))])[0]
        time.sleep(0.3)
        assert [h.kind for h in list(engine.history)[start:]] == []  # held while the other submit runs
        release.set()
        fast.result(timeout=30)
        slow.join(30)
        first = list(engine.history)[start]
        assert (first.kind, first.rows) == ("prefill", 2)
    finally:
        engine.backbone.encode = encode
        engine.close()


@pytest.mark.parametrize("join_min", [1, 3])
def test_a_backlog_joins_in_groups(marian_dir: Path, marian_adapters: Path, fresh_backbone, make_cache,
                                   join_min: int) -> None:
    """More rows waiting than the batch holds: they enter once join_min_rows fit (with 1, one by one as rows
    finish), and every row still gets its own output."""
    from hunyuan_mt.scheduler.engine import Row

    engine = _engine(marian_dir, marian_adapters, fresh_backbone, make_cache, max_rows=4, join_min_rows=join_min,
                     max_wait_ms=0)
    try:
        pair = Pair.parse("en2es")
        rows = [Row(f"{TEXTS[i % 6]} {i}", "en", "es", pair, max_new_tokens=2 + (3 * i) % 7) for i in range(14)]
        alone = [engine.run([r])[0] for r in rows]
        start = len(engine.history)
        assert engine.run(rows, timeout=60) == alone
        prefills = [h.rows for h in list(engine.history)[start:] if h.kind == "prefill"]
        assert sum(prefills) == len(rows)
        if join_min == 1:
            assert min(prefills) == 1
        else:
            assert all(n >= 3 for n in prefills[1:-1]) and len(prefills) < len(rows) - 4
    finally:
        engine.close()
