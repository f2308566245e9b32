"""Slot LoRA layers against the plain reference: PEFT's own LoRA layers, one adapter at a time.

Every row of a mixed batch (any mix of adapters, ranks, alphas, module subsets and the bare backbone) must give
the logits and the greedy output that PEFT gives for that row with its adapter alone. Slot 0 must give exactly
the bare backbone's output.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel

import tiny_models
from hunyuan_mt.adapters.registry import AdapterRegistry, read_adapter
from hunyuan_mt.adapters.request import Pair
from hunyuan_mt.runtime.backbone import PromptRow
from hunyuan_mt.config import GenerationConfig
from hunyuan_mt.lora import BASE_SLOT, SlotLoRA, SlotMapping, prepare

GREEDY = GenerationConfig()
TEXTS = ["Hello world, how are you today?", "Open the file, save the document and close the window.",
         "Hola mundo", "The quick brown fox.", "Datei öffnen", "Bonjour le monde."]


@pytest.fixture(params=["marian", "hunyuan"])
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture()
def varied_adapters(tmp_path: Path, arch: str, request: pytest.FixtureRequest) -> tuple[Path, Path]:
    """Adapters that differ in everything slot layers must reconcile: rank, alpha, rsLoRA, patterns, modules."""
    model_dir = request.getfixturevalue(f"{arch}_dir")
    root = tmp_path / "adapters"
    tiny_models.make_adapter(model_dir, root / "en2es", seed=1, r=4, alpha=16)
    tiny_models.make_adapter(model_dir, root / "en2de", seed=2, r=2, alpha=3)
    tiny_models.make_adapter(model_dir, root / "en2fr", seed=3, r=8, alpha=8, use_rslora=True,
                             target_modules=("q_proj", "v_proj", "k_proj"))
    tiny_models.make_adapter(model_dir, root / "en2zh", seed=4, r=4, alpha=16, target_modules=("q_proj",))
    tiny_models.make_adapter(model_dir, root / "zh2en", seed=5, r=4, alpha=8, target_modules=("q_proj", "v_proj"),
                             rank_pattern={"v_proj": 6}, alpha_pattern={"q_proj": 2})
    return model_dir, root


KEYS = ["en2es", "en2de", None, "en2fr", "en2zh", "zh2en", "en2es", None]


def _rows() -> list[PromptRow]:
    out = []
    for i, key in enumerate(KEYS):
        src, tgt = ("en", "es") if key is None else (Pair.parse(key).src, Pair.parse(key).tgt)
        out.append(PromptRow(TEXTS[i % len(TEXTS)], src, tgt))
    return out


def _peft(ref_bb, root: Path) -> PeftModel:
    keys = sorted({k for k in KEYS if k is not None})
    peft = PeftModel.from_pretrained(ref_bb.model, root / keys[0], adapter_name=keys[0])
    for key in keys[1:]:
        peft.load_adapter(root / key, adapter_name=key)
    peft.eval()
    return peft


def _forward_logits(bb, model, rows: list[PromptRow]) -> torch.Tensor:
    """Last-position logits of one forward over `rows` (right-padded for encoder-decoder, left for decoder-only),
    through `model` (the slot-layer backbone or a PeftModel)."""
    encoded = [bb.encode(r) for r in rows]
    batch = bb.tokenizer.pad([{"input_ids": list(e.input_ids)} for e in encoded], return_tensors="pt")
    kwargs = {}
    if bb.arch == "encoder-decoder":
        kwargs["decoder_input_ids"] = torch.tensor([list(e.decoder_prefix) for e in encoded])
    with torch.inference_mode():
        return model(**batch, **kwargs).logits[:, -1, :]


def test_mixed_rows_match_peft_alone(arch: str, varied_adapters, fresh_backbone, make_cache) -> None:
    model_dir, root = varied_adapters
    bb = fresh_backbone(model_dir)
    cache = make_cache(bb, root, slots=5)
    rows = _rows()
    pairs = [None if k is None else Pair.parse(k) for k in KEYS]
    with cache.lease(pairs) as lease:
        assert sorted(set(lease.slots)) == [0, 1, 2, 3, 4, 5]
        ours_text = bb.generate(rows, lease.slots, GREEDY, max_new_tokens=12)
        with bb.model_lock:
            bb.lora.mapping.set(lease.slots)
            ours_logits = _forward_logits(bb, bb.model, rows)
            bb.lora.mapping.clear()
    assert cache.stats().layers["rank"] == 8  # padded to the largest rank among them

    ref_bb = fresh_backbone(model_dir)
    peft = _peft(ref_bb, root)
    ref_bb.model = peft  # _hf_generate runs whatever model the backbone holds: here PEFT, one adapter per call
    for i, (row, key) in enumerate(zip(rows, KEYS)):
        if key is None:
            with peft.disable_adapter():
                ref_logits = _forward_logits(ref_bb, peft, [row])
                ref_text = ref_bb._hf_generate([ref_bb.encode(row)], [BASE_SLOT], GREEDY, 12)
        else:
            peft.set_adapter(key)
            ref_logits = _forward_logits(ref_bb, peft, [row])
            ref_text = ref_bb._hf_generate([ref_bb.encode(row)], [BASE_SLOT], GREEDY, 12)
        torch.testing.assert_close(ours_logits[i], ref_logits[0], rtol=1e-4, atol=1e-3, msg=f"row {i} ({key})")
        assert ours_text[i] == ref_text[0], (i, key)
    # The adapters really differ: the same text under each gives distinct logits.
    same = [PromptRow(TEXTS[0], "en", "es")] * 6
    with cache.lease([None] + [Pair.parse(k) for k in ("en2es", "en2de", "en2fr", "en2zh", "zh2en")]) as lease:
        with bb.model_lock:
            bb.lora.mapping.set(lease.slots)
            logits = _forward_logits(bb, bb.model, same)
            bb.lora.mapping.clear()
    assert len({tuple(row.argsort()[-5:].tolist()) for row in logits}) > 1
    assert all(not torch.allclose(logits[0], logits[j]) for j in range(1, 6))


def test_bare_rows_get_exactly_the_base_output(fresh_backbone, make_cache, marian_dir, marian_adapters) -> None:
    bb = fresh_backbone(marian_dir)
    rows = [PromptRow(t, "en", "es") for t in TEXTS[:4]]
    plain = _forward_logits(bb, bb.model, rows)  # no slot layers yet
    cache = make_cache(bb, marian_adapters, slots=3)
    with cache.lease([None, Pair.parse("en2de"), None, Pair.parse("en2fr")]) as lease:
        with bb.model_lock:
            bb.lora.mapping.set([BASE_SLOT] * 4)  # all bare: the slot layers add nothing at all
            assert torch.equal(_forward_logits(bb, bb.model, rows), plain)
            bb.lora.mapping.set(lease.slots)  # mixed: the bare rows add exact zeros
            mixed = _forward_logits(bb, bb.model, rows)
            bb.lora.mapping.clear()
    assert torch.equal(mixed[0], plain[0]) and torch.equal(mixed[2], plain[2])
    assert not torch.allclose(mixed[1], plain[1])


def _layer_setup(marian_dir: Path, marian_adapters: Path, fresh_backbone):
    bb = fresh_backbone(marian_dir)
    registry = AdapterRegistry(marian_adapters, bb.spec)
    registry.scan()
    weights = {i.key: read_adapter(i) for i in registry.infos()}
    prepared = {k: prepare(w, torch.float32) for k, w in weights.items()}
    return bb, prepared


def test_slot_copy_clear_and_overwrite_are_seen_at_once(fresh_backbone, marian_dir, marian_adapters) -> None:
    bb, prepared = _layer_setup(marian_dir, marian_adapters, fresh_backbone)
    rows = [PromptRow(t, "en", "es") for t in TEXTS[:2]]
    plain = _forward_logits(bb, bb.model, rows)
    lora = SlotLoRA(bb.model, bb.spec.shapes, torch.float32)
    lora.ensure(prepared["en2es"].modules, 16, 2)
    lora.load(1, prepared["en2es"])
    lora.load(2, prepared["en2de"])
    lora.mapping.set([1, 2])
    first = _forward_logits(bb, bb.model, rows)
    # Same mapping, new weights in slot 2: the per-row weights the layers gathered must not be reused.
    lora.load(2, prepared["en2fr"])
    second = _forward_logits(bb, bb.model, rows)
    assert torch.equal(first[0], second[0]) and not torch.allclose(first[1], second[1])
    lora.clear(2)
    cleared = _forward_logits(bb, bb.model, rows)
    assert torch.equal(cleared[0], first[0])
    lora.mapping.set([BASE_SLOT, BASE_SLOT])
    lora.remove()
    assert torch.equal(_forward_logits(bb, bb.model, rows), plain)  # unwrapped: the plain model again
    with pytest.raises(IndexError, match=r"slot 3 does not exist: adapter slots are 1..0"):
        lora.load(3, prepared["en2es"])


def test_layers_grow_and_keep_what_slots_hold(fresh_backbone, marian_dir, marian_adapters, tmp_path) -> None:
    bb, prepared = _layer_setup(marian_dir, marian_adapters, fresh_backbone)
    rows = [PromptRow(TEXTS[0], "en", "es")]
    lora = SlotLoRA(bb.model, bb.spec.shapes, torch.float32)
    lora.ensure([m for m in prepared["en2es"].modules if m.endswith("q_proj")], 2, 1)
    assert not lora.fits(prepared["en2es"])
    with pytest.raises(ValueError, match="does not fit the slot layers"):
        lora.load(1, prepared["en2es"])
    assert lora.ensure(prepared["en2es"].modules, 4, 1) is True
    lora.load(1, prepared["en2es"])
    lora.mapping.set([1])
    before = _forward_logits(bb, bb.model, rows)
    wider = tiny_models.make_adapter(marian_dir, tmp_path / "it2en", seed=9, r=8,
                                     target_modules=("q_proj", "v_proj", "out_proj"))
    registry = AdapterRegistry(tmp_path, bb.spec)
    registry.scan()
    big = prepare(read_adapter(registry.get(Pair.parse("it2en"))), torch.float32)
    assert lora.ensure(big.modules, big.rank, 3) is True
    assert (lora.capacity, lora.rank) == (3, 8)
    assert torch.equal(_forward_logits(bb, bb.model, rows), before)  # slot 1 kept its adapter through the growth
    lora.load(3, big)
    assert lora.ensure(big.modules, 8, 3) is False  # nothing to do: "did it change anything"
    assert wider.is_dir()


def test_mapping_follows_beam_expansion_and_refuses_mismatch() -> None:
    mapping = SlotMapping()
    mapping.set([1, 2])
    assert mapping.indices(6, torch.device("cpu")).tolist() == [1, 1, 1, 2, 2, 2]
    assert mapping.indices(2, torch.device("cpu")).tolist() == [1, 2]
    with pytest.raises(RuntimeError, match="slot mapping holds 2 rows, but a layer saw a batch of 3"):
        mapping.indices(3, torch.device("cpu"))
    version = mapping.version
    mapping.set([1, 2])  # same rows: layers keep what they gathered
    assert mapping.version == version
    mapping.set([2, 1])
    assert mapping.version == version + 1 and mapping.uniform is None
    mapping.set([3, 3])
    assert mapping.uniform == 3
    mapping.clear()
    assert mapping.uniform == BASE_SLOT


def test_marian_rows_that_join_on_their_start_token_match_peft(fresh_backbone, make_cache, marian_dir,
                                                               marian_adapters, monkeypatch) -> None:
    """Without target-language tokens (Marian's own vocabularies) a row's prefix is the start token alone: it
    joins with only its encoder run and takes its first token in a shared decode step. Still PEFT's output."""
    bb = fresh_backbone(marian_dir)
    ref_bb = fresh_backbone(marian_dir)
    for b in (bb, ref_bb):
        monkeypatch.setattr(b, "target_token_id", lambda tgt: None)
    cache = make_cache(bb, marian_adapters, slots=4)
    keys = ["en2es", "en2de", None, "en2fr", "zh2en", "en2es"]
    rows = [PromptRow(TEXTS[i], "en", "es") for i in range(len(keys))]
    assert all(len(bb.encode(r).decoder_prefix) == 1 for r in rows)
    with cache.lease([None if k is None else Pair.parse(k) for k in keys]) as lease:
        ours = bb.generate(rows, lease.slots, GREEDY, max_new_tokens=12)
    peft = PeftModel.from_pretrained(ref_bb.model, marian_adapters / "en2es", adapter_name="en2es")
    for key in ("en2de", "en2fr", "zh2en"):
        peft.load_adapter(marian_adapters / key, adapter_name=key)
    ref_bb.model = peft
    for i, (r, key) in enumerate(zip(rows, keys)):
        if key is None:
            with peft.disable_adapter():
                ref = ref_bb._hf_generate([ref_bb.encode(r)], [BASE_SLOT], GREEDY, 12)
        else:
            peft.set_adapter(key)
            ref = ref_bb._hf_generate([ref_bb.encode(r)], [BASE_SLOT], GREEDY, 12)
        assert ours[i] == ref[0], (i, key)


def test_column_mask_follows_the_rule_for_every_mix() -> None:
    """Each token's mask row is 1 exactly on the columns of its row's slot (when that slot is in `used`), 0 on the
    padding, for random mixes, tokens per row and padding; a new mix gets a new mask."""
    import random

    rng = random.Random(3)
    mapping = SlotMapping()
    for _ in range(200):
        slots = [rng.randrange(0, 5) for _ in range(rng.randrange(1, 9))]
        used = sorted(rng.sample(range(1, 5), rng.randrange(1, 5)))
        rank, per_row, padding = rng.choice([1, 2, 4]), rng.choice([1, 3]), rng.randrange(0, 3)
        mapping.set(slots)
        mask = mapping.column_mask(used, rank, per_row, padding, torch.device("cpu"), torch.float32)
        tokens = [s for s in slots for _ in range(per_row)] + [None] * padding
        expected = torch.tensor([[1.0 if s == used[c // rank] else 0.0 for c in range(len(used) * rank)]
                                 for s in tokens])
        assert torch.equal(mask, expected), (slots, used, rank, per_row, padding)


def test_slots_in_use_follow_the_rows_and_what_the_slots_hold() -> None:
    """`in_use` (asked by every grouped LoRA term of a forward, kept per version) names the slots the rows read and
    what each holds: a new mix, a write into a slot and a new name for what a slot holds each show at once."""
    mapping = SlotMapping()
    mapping.set([2, 0, 1, 2])
    assert mapping.in_use() == ((1, 2), (("slot", 1, (0, 0)), ("slot", 2, (0, 0))))
    mapping.hold(2, ("adapter", 7))
    assert mapping.in_use()[1][1] == ("adapter", 7)
    mapping.invalidate(2)  # the slot was written again: until its writer names it, a write count names it
    assert mapping.in_use()[1][1] == ("slot", 2, (1, 0))
    mapping.set([1, 1])
    assert mapping.in_use() == ((1,), (("slot", 1, (0, 0)),))
    mapping.set([0, 0])
    assert mapping.in_use()[0] == (0,)  # every row on the bare backbone
