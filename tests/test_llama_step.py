"""The lean decoder-only step (hunyuan_mt/decode/llama.py) against transformers, in float32 on tiny random models:
greedy tokens equal `generate` (rows alone, together, joining mid-way), LoRA rows equal PEFT's own model, and a
row's logits beside others equal its logits alone to the bit, in float32 and int8, with adapters on every
projection (GQA makes K and V narrower than Q, which the grouped LoRA must take)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tiny_models
from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.runtime.backbone import PromptRow
from hunyuan_mt.config import GenerationConfig
from hunyuan_mt.decode import CausalBatch, LlamaBatch, Sequence, TokenPicker
from hunyuan_mt.decode.llama import lean_note
from row_logits import assert_rows_as_alone

ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPTS = [(5, 9, 12, 40, 3), tuple(range(7, 31)), (30, 31), (44, 45, 46, 47, 48, 49, 50), (60,)]
NEW = 12


def _build(kind: str, out_dir: Path) -> Path:
    """A tiny decoder-only model of `kind` with GQA (4 query heads, 2 key/value heads) as safetensors."""
    if kind == "hunyuan":
        return tiny_models.build_hunyuan(out_dir)
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    tok = tiny_models.build_tokenizer(out_dir, chat_template=tiny_models.CHAT_TEMPLATE)
    config_class, model_class = (LlamaConfig, LlamaForCausalLM) if kind == "llama" else (Qwen3Config,
                                                                                         Qwen3ForCausalLM)
    torch.manual_seed(3)
    cfg = config_class(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                       pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                       tie_word_embeddings=kind == "qwen3", rope_theta=10000.0)
    model = model_class(cfg).eval()
    tiny_models._sharpen(model)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


@pytest.fixture(scope="module", params=["hunyuan", "llama", "qwen3"])
def model_dir(request, tmp_path_factory) -> Path:
    return _build(request.param, tmp_path_factory.mktemp(request.param))


def _run(batch_class, model, sequences: list[Sequence], joins: list[int]) -> dict[int, list[int]]:
    """Greedy tokens of each sequence, sequence i entering at step joins[i]."""
    picker = TokenPicker.for_model(model, GenerationConfig(), None, encoder_decoder=False)
    batch = batch_class(model, None, picker, torch.device("cpu"), 0)
    out: dict[int, list[int]] = {}
    waiting, step = list(range(len(sequences))), 0
    with torch.inference_mode():
        while waiting or len(batch):
            entering = [i for i in waiting if joins[i] <= step]
            waiting = [i for i in waiting if joins[i] > step]
            batch.add([sequences[i] for i in entering])
            for row in batch.pop_finished():
                out[row.seq.tag] = row.generated
            if len(batch):
                batch.step()
            for row in batch.pop_finished():
                out[row.seq.tag] = row.generated
            step += 1
    return out


def test_greedy_tokens_equal_transformers_generate(model_dir: Path, two_threads) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    assert lean_note(model) is None
    reference = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
            reference.append(out[0, len(prompt):].tolist())
    sequences = [Sequence(i, p, 0, NEW) for i, p in enumerate(PROMPTS)]
    for joins in ([0] * len(PROMPTS), [0, 2, 2, 5, 9]):
        lean = _run(LlamaBatch, model, sequences, joins)
        assert [lean[i] for i in range(len(PROMPTS))] == reference, joins
    for i, sequence in enumerate(sequences):
        assert _run(LlamaBatch, model, [Sequence(0, sequence.input_ids, 0, NEW)], [0])[0] == reference[i]


def test_the_backbone_picks_the_lean_step_on_the_cpu_and_says_why_not_elsewhere(hunyuan_dir: Path,
                                                                               fresh_backbone) -> None:
    backbone = fresh_backbone(hunyuan_dir, quantization="none")
    assert backbone.batch_class is LlamaBatch
    model = backbone.model
    model.config.model_type, saved = "gpt_neox", model.config.model_type
    try:
        assert "not one of the Llama-shaped models" in lean_note(model)
    finally:
        model.config.model_type = saved
    half = type(model)(model.config).to(torch.bfloat16)
    assert "float32 (or int8) on the CPU" in lean_note(half)


@pytest.fixture(scope="module")
def all_module_adapters(tmp_path_factory, hunyuan_dir: Path) -> Path:
    """Adapters on every projection of the tiny Hunyuan, ranks 4 and 8 (slots padded to the larger)."""
    root = tmp_path_factory.mktemp("hy_all_adapters")
    for i, pair in enumerate(("en2es", "en2de", "fr2en")):
        tiny_models.make_adapter(hunyuan_dir, root / pair, seed=10 + i, r=4 if i else 8, target_modules=ALL_MODULES)
    return root


def test_lora_rows_equal_peft_on_transformers(hunyuan_dir: Path, all_module_adapters: Path, fresh_backbone,
                                              make_cache, two_threads) -> None:
    """Each row's greedy text through the lean step, rows of three adapters and the bare backbone in one batch,
    equals PEFT's own LoRA layers over transformers' model for that adapter alone."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    backbone = fresh_backbone(hunyuan_dir, quantization="none")
    cache = make_cache(backbone, all_module_adapters, slots=3, pinned=[])
    rows = [PromptRow("Open the file.", "en", "es"), PromptRow("Save the document now.", "en", "de"),
            PromptRow("Bonjour le monde.", "fr", "en"), PromptRow("Hello world.", "en", "es")]
    pairs = ["en2es", "en2de", "fr2en", None]
    with cache.lease([Pair.parse(p) if p else None for p in pairs]) as lease:
        ours = backbone.generate(rows, list(lease.slots), GenerationConfig(), max_new_tokens=10)
    assert backbone.batch_class is LlamaBatch
    for row, pair, text in zip(rows, pairs, ours):
        base = AutoModelForCausalLM.from_pretrained(hunyuan_dir).eval()
        model = PeftModel.from_pretrained(base, all_module_adapters / pair).eval() if pair else base
        ids = torch.tensor([backbone.encode(row).input_ids])
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=10,
                                 do_sample=False, pad_token_id=0)
        assert backbone.decode(out[0, ids.shape[1]:].tolist()) == text, pair


@pytest.mark.parametrize("weights", ["none", "int8", "qgemm", "int4"])
def test_mixed_rows_have_the_logits_they_have_alone(weights: str, hunyuan_dir: Path,
                                                    all_module_adapters: Path, fresh_backbone, make_cache,
                                                    two_threads) -> None:
    """Invariant 5 for the lean decoder-only step: rows of three adapters (ranks 8 and 4) and the bare backbone,
    joining at different steps, get at every step the logits each gets alone, to the bit: float32, int8 (the
    probe's kernel, and our qgemm) and qgemm's 4-bit weights."""
    from hunyuan_mt.quant import packed as int8_packed

    if weights in ("qgemm", "int4") and not int8_packed.available():
        pytest.skip("the CPU kernels cannot be built here")
    kwargs = {"qgemm": dict(quantization="int8", int8_kernel="qgemm")}.get(weights, dict(quantization=weights))
    backbone = fresh_backbone(hunyuan_dir, cpu_threads=2, **kwargs)
    assert backbone.batch_class is LlamaBatch
    if weights in ("qgemm", "int4"):
        bits = 4 if weights == "int4" else 8
        layers = [m for m in backbone.model.modules() if isinstance(m, int8_packed.PackedLinear)]
        assert layers and all(m.bits == bits for m in layers) and backbone.int8_kernel == "qgemm"
    cache = make_cache(backbone, all_module_adapters, slots=3, pinned=[])
    pairs = ["en2es", "en2de", "fr2en"]
    texts = {"en2es": ["Open the file.", "Save the document before closing the window?"],
             "en2de": ["The printer is out of paper."], "fr2en": ["Impossible d'ouvrir le fichier."],
             None: ["Hello world, how are you today?"]}
    with cache.lease([Pair.parse(p) for p in pairs]) as lease:
        slot = dict(zip(pairs, lease.slots))
        items = [(PromptRow(text, *(pair or "en2es").split("2")), slot.get(pair, 0))
                 for pair, group in texts.items() for text in group]
        assert_rows_as_alone(backbone, items, joins=[0, 2, 0, 4, 1])


@pytest.mark.parametrize("weights", ["fbgemm", "qgemm", "float32"])
def test_a_prefill_in_groups_and_pieces_gives_every_row_the_logits_and_tokens_of_one_prefill(
        hunyuan_dir: Path, all_module_adapters: Path, fresh_backbone, make_cache, weights: str) -> None:
    """A wide model prefills entering rows in groups of `prefill_tokens` padded tokens (fbgemm is faster at that
    size), and a longer prompt in pieces of that many tokens (the engine decodes between two pieces): the groups
    run with their own rows' adapters, and every row's first logits and greedy tokens are the ones of a single
    prefill, to the bit, the cut prompt's included."""
    from hunyuan_mt.decode.llama import _prefill_groups

    quantized = dict(quantization="int8", int8_kernel=weights) if weights != "float32" else {}
    backbone = fresh_backbone(hunyuan_dir, cpu_threads=2, **quantized)
    cache = make_cache(backbone, all_module_adapters, slots=3, pinned=[])
    pairs = ["en2es", "en2de", "fr2en"]
    long_prompt = tuple(range(3, 60))    # 57 tokens: pieces of 16, 16, 16 and 9 at a budget of 16
    prompts = PROMPTS + [long_prompt]
    with cache.lease([Pair.parse(p) for p in pairs]) as lease:
        slots = list(lease.slots) + [0]
        sequences = [Sequence(i, p, slots[i % 4], NEW) for i, p in enumerate(prompts)]
        # 5, 24, 2, 7, 1 and 57 tokens: blocks of 16, 32, 16, 16, 16, 64 → groups within 32 padded tokens.
        assert [[s.tag for s in g] for g in _prefill_groups(sequences, 32)] == [[0], [1], [2, 3], [4], [5]]
        runs = {}
        for budget in (None, 32, 16):
            batch = backbone.new_batch(GenerationConfig())
            assert isinstance(batch, LlamaBatch)
            batch.prefill_tokens = budget
            first: dict[int, torch.Tensor] = {}
            forwards: list[list[int]] = []
            batch.before_forward = lambda kind, tags: forwards.append(list(tags)) if kind == "prefill" else None
            choose = batch._choose
            batch._choose = lambda logits, live: first.update(
                {r.seq.tag: logits[i].clone() for i, r in enumerate(live) if r.seq.tag not in first}) or choose(
                logits, live)
            out: dict[int, list[int]] = {}
            with backbone.model_lock, torch.inference_mode():
                batch.add(list(sequences))
                while True:
                    out.update({r.seq.tag: list(r.generated) for r in batch.pop_finished()})
                    if not len(batch):
                        break
                    batch.step()
            runs[budget] = (first, out, forwards)
        whole, tokens, forwards = runs[None]
        assert forwards == [[0, 1, 2, 3, 4, 5]] and len(whole) == len(prompts)
        assert runs[32][2] == [[0], [1], [2, 3], [4], [5], [5]]
        assert runs[16][2] == [[0], [1], [1], [2], [3], [4], [5], [5], [5], [5]]
        for budget in (32, 16):
            first, out, _ = runs[budget]
            assert all(torch.equal(whole[tag], first[tag]) for tag in whole), budget
            assert out == tokens and all(len(t) == NEW for t in tokens.values())


@pytest.mark.parametrize("kernel", ["int_mm", "fbgemm", "qgemm"])
def test_int8_token_table_shares_the_tied_projection_and_serves_both_forwards(model_dir: Path, kernel: str,
                                                                            fresh_backbone) -> None:
    """With int8 weights the token table is the tied torch._int_mm output projection's own int8 rows (no second
    copy; within a row's quantization step of the float table), or else the checkpoint's own rows read from
    its file (fbgemm and qgemm pack their weights; exactly the float table); and transformers' forward
    over the same modules picks the lean step's greedy tokens."""
    from hunyuan_mt.quant.int8 import Int8Linear
    from hunyuan_mt.quant.embedding import FileTable, Int8Embedding

    backbone = fresh_backbone(model_dir, quantization="int8", int8_kernel=kernel)
    table = backbone.model.get_input_embeddings()
    head = backbone.model.get_output_embeddings()
    shared = bool(backbone.model.config.tie_word_embeddings) and isinstance(head, Int8Linear)
    from transformers import AutoModelForCausalLM

    float_table = AutoModelForCausalLM.from_pretrained(model_dir).get_input_embeddings().weight
    ids = torch.tensor([[3, 17, 40], [5, 6, 7]])
    if shared:
        assert isinstance(table, Int8Embedding) and table.by_column
        assert table.table.data_ptr() == head.weight_t.data_ptr()
        step = (float_table.abs().amax(dim=1) / 127)[ids][..., None]
        assert ((table(ids) - float_table[ids]).abs() <= step / 2 + 1e-6).all()
    else:
        assert isinstance(table, FileTable) and table.source.parent == model_dir
        assert torch.equal(table(ids), float_table[ids])
    sequences = [Sequence(i, p, 0, NEW) for i, p in enumerate(PROMPTS[:3])]
    lean = _run(LlamaBatch, backbone.model, sequences, [0, 1, 1])
    with torch.inference_mode():
        for i, prompt in enumerate(PROMPTS[:3]):
            out = backbone.model.generate(torch.tensor([prompt]), max_new_tokens=NEW, min_new_tokens=NEW,
                                          do_sample=False, eos_token_id=None, pad_token_id=0)
            assert out[0, len(prompt):].tolist() == lean[i]


def test_int8_siblings_are_one_layer_the_step_and_the_model_forward_share(hunyuan_dir: Path, fresh_backbone,
                                                                       monkeypatch) -> None:
    """With int8 weights Q/K/V and gate/up are fused at load and the model keeps their parts, not a second copy:
    the lean step multiplies by the fused layer itself, and transformers' forward (beam search) runs it once per
    group, each part reading its own columns of what the layers computed apart."""
    from hunyuan_mt.decode.dense import Projection
    from hunyuan_mt.quant.layer import Int8Layer, Int8Part

    backbone = fresh_backbone(hunyuan_dir, quantization="int8")
    inner = backbone.model.model
    for layer in inner.layers:
        sa, mlp = layer.self_attn, layer.mlp
        qkv, gate_up = [sa.q_proj, sa.k_proj, sa.v_proj], [mlp.gate_proj, mlp.up_proj]
        for group in (qkv, gate_up):
            assert all(isinstance(p, Int8Part) and p.whole is group[0].whole for p in group)
            assert [p.start for p in group] == [0] + [p.stop for p in group[:-1]]
            assert Projection(group, None).base == Projection([group[0].whole], None).base
        assert not isinstance(sa.o_proj, Int8Part) and not isinstance(mlp.down_proj, Int8Part)
    # The fused layers are no modules of the model (counted once through their parts, matched by no adapter name):
    # its int8 layers with weights of their own are o, down and the output projection.
    own = [m for m in backbone.model.modules() if isinstance(m, Int8Layer) and not isinstance(m, Int8Part)]
    assert len(own) == 2 * len(inner.layers) + 1
    # The parts compute what the unfused layers did: against the float model's layers quantized one by one.
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(hunyuan_dir).model.layers[0].self_attn
    x = torch.randn(3, reference.q_proj.in_features)
    layer_cls = type(inner.layers[0].self_attn.q_proj.whole)
    for name in ("q_proj", "k_proj", "v_proj"):
        alone = layer_cls.from_linear(getattr(reference, name))
        assert torch.equal(getattr(inner.layers[0].self_attn, name)(x), alone(x))
    calls = []
    whole = inner.layers[0].self_attn.q_proj.whole
    monkeypatch.setattr(type(whole), "matmul", lambda self, x, _m=type(whole).matmul: calls.append(self) or _m(
        self, x))
    with torch.inference_mode():
        backbone.model(input_ids=torch.tensor([[5, 9, 12]]))
    assert calls.count(whole) == 1 and len(calls) == 4 * len(inner.layers) + 1   # qkv, o, gate_up, down; head
    assert whole.__dict__.get("_shared") is None   # the last part let go of the shared product


def test_kv_cache_float16_keeps_greedy_tokens(hunyuan_dir: Path, fresh_backbone, two_threads) -> None:
    """The cache in float16 (`model.kv_cache`), widened by the kernel as it reads: the same greedy tokens as the
    float32 cache on the tiny model, and the cache tensors really are float16."""
    rows = [PromptRow(t, "en", "es") for t in ("Open the file.", "Save the document before closing the window?")]
    wide = fresh_backbone(hunyuan_dir, quantization="none", kv_cache="float32")
    half = fresh_backbone(hunyuan_dir, quantization="none", kv_cache="float16")
    assert half.kv_cache_dtype() == torch.float16
    batch = half.new_batch(GenerationConfig())
    with torch.inference_mode():
        batch.add([Sequence(0, half.encode(rows[0]).input_ids, 0, 4)])
    assert batch.cache.k[0].dtype == torch.float16
    assert half.generate(rows, [0, 0], GenerationConfig(), 12) == wide.generate(rows, [0, 0], GenerationConfig(), 12)


def test_the_model_forward_path_stays_for_what_the_lean_step_does_not_cover(hunyuan_dir: Path) -> None:
    """A decoder-only model outside the lean step's table still runs the iteration-level loop over its own
    forward (CausalBatch)."""
    from transformers import AutoModelForCausalLM

    from hunyuan_mt.decode import running_batch_class

    model = AutoModelForCausalLM.from_pretrained(hunyuan_dir).eval()
    assert running_batch_class(model, "decoder-only")[0] is LlamaBatch
    model.config.model_type, saved = "olmo", model.config.model_type
    try:
        assert running_batch_class(model, "decoder-only")[0] is CausalBatch
    finally:
        model.config.model_type = saved


@pytest.fixture(scope="module")
def compiled_hunyuan(hunyuan_dir: Path, all_module_adapters: Path):
    """The tiny Hunyuan in int8 with its decode step compiled ahead of time (~50 s the first time on 2 cores), and
    the slots of three adapters on every projection. Through fbgemm, as HY-MT1.5-1.8B runs on every CPU (over 256 MB
    of int8 weights): fused Q/K/V and gate/up parts, and a token table read from the checkpoint file before the
    step (the step takes vectors)."""
    from hunyuan_mt.adapters.cache import AdapterCache
    from hunyuan_mt.adapters.registry import AdapterRegistry
    from hunyuan_mt.runtime.backbone import Backbone
    from hunyuan_mt.config import CacheConfig, ModelConfig

    threads = torch.get_num_threads()
    backbone = Backbone.load_uncached(ModelConfig(path=str(hunyuan_dir), warmup=False, quantization="int8",
                                                  int8_kernel="fbgemm", cpu_threads=2))
    registry = AdapterRegistry(all_module_adapters, backbone.spec)
    registry.scan()
    cache = AdapterCache(backbone, registry, CacheConfig(adapters_dir=str(all_module_adapters), slots=3))
    cache.start()
    lease = cache.lease([Pair.parse(k) for k in ("en2es", "en2de", "fr2en")])
    slots = list(lease.__enter__().slots)
    assert backbone.compile_step(), backbone.compiled[0].error
    yield backbone, slots
    lease.__exit__(None, None, None)
    torch.set_num_threads(threads)


def test_the_compiled_step_computes_what_the_eager_one_does(compiled_hunyuan) -> None:
    """Compiled (one package for every batch) and eager give the same greedy text for rows of three adapters and
    the bare backbone, and a row's compiled logits beside others equal its compiled logits alone, to the bit."""
    from hunyuan_mt.decode.compiled import CompiledLlamaStep

    backbone, slots = compiled_hunyuan
    step = backbone.compiled[0]
    assert isinstance(step, CompiledLlamaStep) and step.active and step.graphs == 1
    rows = [PromptRow(t, "en", "es") for t in ("Hello world, how are you today?", "Open the file.", "Save.",
                                                "Bonjour le monde")]
    row_slots = [slots[0], slots[1], 0, slots[2]]
    compiled = backbone.generate(rows, row_slots, GenerationConfig(), 10)
    saved, backbone.compiled = backbone.compiled, None
    try:
        eager = backbone.generate(rows, row_slots, GenerationConfig(), 10)
    finally:
        backbone.compiled = saved
    assert compiled == eager
    assert_rows_as_alone(backbone, list(zip(rows, row_slots)), joins=[0, 2, 0, 3], compiled=True)
    assert step.graphs == 1  # no second compile for other row counts, widths or adapter mixes


def test_grouped_lora_over_narrow_key_value_heads_keeps_one_unpadded_copy(hunyuan_dir: Path,
                                                                          all_module_adapters: Path, fresh_backbone,
                                                                          make_cache) -> None:
    """Q, K and V of different widths (GQA): their stacked B lies side by side without zero padding, each projection
    adds what its slot layer adds, and the stacks kept for the sets of slots in use take at most every slot's
    weights once (counted in entries, four float32 copies of a 1.8B's adapters stayed resident after mixed
    traffic)."""
    from hunyuan_mt.lora import SlotLinear
    from hunyuan_mt.lora.grouped import GroupedLoRA, _tensor_bytes

    backbone = fresh_backbone(hunyuan_dir, quantization="none")
    cache = make_cache(backbone, all_module_adapters, slots=3, pinned=[])
    with cache.lease([Pair.parse(p) for p in ("en2es", "en2de", "fr2en")]) as lease:
        es, de, fr = lease.slots
        attn = backbone.model.model.layers[0].self_attn
        modules = [attn.q_proj, attn.k_proj, attn.v_proj]
        widths = [m.out_features for m in modules]
        assert len(set(widths)) > 1 and all(isinstance(m, SlotLinear) for m in modules)
        grouped = GroupedLoRA(modules, widths, backbone.lora.mapping)
        x = torch.randn(5, modules[0].in_features, generator=torch.Generator().manual_seed(0))
        mixes = ([es, 0, fr, de, es], [es, fr, es, fr, es], [de] * 5, [fr, de, fr, de, fr], [es, de, es, de, es],
                 [es, 0, fr, de, es])
        for slots in mixes:
            with torch.inference_mode(), backbone.lora.mapping.use(slots):
                tensors = grouped.tensors(5, 1, x.device)
                ours = grouped.add_to(x, torch.zeros(5, sum(widths)))
                ref = torch.cat([m(x) - m.base(x) for m in modules], dim=1)
            torch.testing.assert_close(ours, ref, atol=5e-5, rtol=1e-4)
            used = len(set(slots) - {0})
            assert tensors[1].dim() == 2 and tensors[1].shape[1] == sum(widths)   # side by side, no padding
            assert tensors[1].shape[0] == used * modules[0].a_t.shape[2]
            kept = grouped._weights
            assert sum(_tensor_bytes(v) for v in kept.values()) <= kept.maxsize == grouped._stack_budget()
        # The set of every slot fits the budget and is kept: the first mix again takes the stack it made.
        with torch.inference_mode(), backbone.lora.mapping.use(list(mixes[0])):
            assert grouped.tensors(5, 1, x.device)[1].data_ptr() in {v[1].data_ptr() for v in kept.values()}


def test_over_qgemm_weights_both_lora_sides_run_in_qgemm(hunyuan_dir: Path, all_module_adapters: Path,
                                                       fresh_backbone, make_cache) -> None:
    """Over qgemm's packed weights the LoRA term runs in qgemm too (float32 GEMMs of a LoRA's shapes ran at 6-11
    GMAC/s on an AVX2 core, a quarter of qgemm's rate): A as one packed weight of every slot's columns, B one per
    projection. The term stays close to the float32 one, a row on the bare backbone gets nothing added, a row's term
    is the same bits alone and beside rows of other adapters, and each adapter is quantized once."""
    from hunyuan_mt.quant import packed as int8_packed
    from hunyuan_mt.decode.dense import Projection
    from hunyuan_mt.quant.packed import PackedBase
    from hunyuan_mt.lora.grouped import GroupedLoRA

    if not int8_packed.available():
        pytest.skip("the qgemm kernel is not built here")
    backbone = fresh_backbone(hunyuan_dir, quantization="int8", int8_kernel="qgemm")
    cache = make_cache(backbone, all_module_adapters, slots=3, pinned=[])
    with cache.lease([Pair.parse(p) for p in ("en2es", "en2de", "fr2en")]) as lease:
        es, de, fr = lease.slots
        attn = backbone.model.model.layers[0].self_attn
        proj = Projection([attn.q_proj, attn.k_proj, attn.v_proj], backbone.lora.mapping)
        exact = GroupedLoRA(proj.lora.layers, proj.widths, backbone.lora.mapping)   # float32, as over fbgemm
        assert proj.lora.packed and not exact.packed
        x = torch.randn(5, attn.q_proj.in_features, generator=torch.Generator().manual_seed(0))
        alone = {}
        for slot in (es, de, fr):
            with torch.inference_mode(), backbone.lora.mapping.use([slot]):
                alone[slot] = proj.lora.add_to(x[:1], torch.zeros(1, sum(proj.widths)))
        for slots in ([es, 0, fr, de, es], [de] * 5, [fr, de, fr, de, fr]):
            with torch.inference_mode(), backbone.lora.mapping.use(slots):
                a, b, _, layout, fused = proj.lora_tensors(5, 1, x.device)
                assert isinstance(a, PackedBase) and fused is None
                assert len(b) == len(layout) and all(isinstance(piece, PackedBase) for piece in b)
                ours = proj.lora.add_to(x, torch.zeros(5, sum(proj.widths)))
                ref = exact.add_to(x, torch.zeros(5, sum(proj.widths)))
            for row, slot in enumerate(slots):
                if slot == 0:
                    assert bool((ours[row] == 0).all())
                    continue
                assert (ours[row] - ref[row]).norm() < 0.05 * ref[row].norm()
                if row == 0:
                    assert torch.equal(ours[:1], alone[slot])  # x[0] alone on its slot: the same bits
        assert len(proj.lora._pieces) == 3  # one quantization per adapter, whatever the mixes
        # A drained batch drops its stacks (LeanBatch.release_idle): stacked again from the kept pieces, alike.
        proj.lora.release_stacks()
        assert proj.lora._weights is None and len(proj.lora._pieces) == 3
        with torch.inference_mode(), backbone.lora.mapping.use(slots):
            assert torch.equal(proj.lora.add_to(x, torch.zeros(5, sum(proj.widths))), ours)


def test_bfloat16_slots_halve_the_slots_and_keep_rows_their_own(hunyuan_dir: Path, all_module_adapters: Path,
                                                                 fresh_backbone, make_cache, two_threads) -> None:
    """cache.slot_dtype: bfloat16 keeps adapters in half the bytes (the re-attach copy stays the file's pages, not
    a converted copy); the lean step multiplies them in float32: a row's logits are the same bits alone and beside
    rows of other adapters, and the same bits as float32 slots holding the adapters rounded to bfloat16."""
    backbone = fresh_backbone(hunyuan_dir, quantization="none", cpu_threads=2)
    pairs = [Pair.parse(p) for p in ("en2es", "en2de", "fr2en")]
    sizes, logits = {}, {}
    for dtype in ("float32", "bfloat16"):
        cache = make_cache(backbone, all_module_adapters, slots=3, pinned=[], slot_dtype=dtype)
        lora = backbone.lora
        with cache.lease(pairs) as lease:
            layer = next(iter(lora.layers.values()))
            assert layer.a_t.dtype == getattr(torch, dtype)
            held = [slot.weights for slot in cache._slots if slot.weights is not None]
            assert len(held) == 3 and all(w.prepared is not None for w in held)
            for weights in held:   # the file's own float32 pages and the scales to apply in the slot
                assert all(a.dtype == torch.float32 for a, _ in weights.prepared.tensors.values())
                assert weights.prepared.scales
            sizes[dtype] = lora.info()["bytes"]
            if dtype == "float32":
                # The reference: float32 slots holding each weight rounded to bfloat16 (the scales, alpha / r, are
                # powers of two here, so B·scale rounds as B does).
                with torch.no_grad():
                    for slot_layer in lora.layers.values():
                        slot_layer.a_t.copy_(slot_layer.a_t.to(torch.bfloat16))
                        slot_layer.b_t.copy_(slot_layer.b_t.to(torch.bfloat16))
            slots = list(lease.slots) + [0]
            sequences = [Sequence(i, p, slots[i % 4], 1) for i, p in enumerate(PROMPTS)]
            firsts = []
            for group in (sequences, *[[s] for s in sequences]):
                batch = backbone.new_batch(GenerationConfig())
                choose = batch._choose
                batch._choose = lambda out, live, _c=choose: firsts.append(out.clone()) or _c(out, live)
                with backbone.model_lock, torch.inference_mode():
                    batch.add(list(group))
            together, alone = firsts[0], torch.cat(firsts[1:])
            assert torch.equal(together, alone), dtype
            logits[dtype] = together
    assert sizes["bfloat16"] * 2 == sizes["float32"]
    assert torch.equal(logits["bfloat16"], logits["float32"])   # float32 products of the same rounded weights
