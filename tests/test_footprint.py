"""A backbone's memory footprint is read from its safetensors headers before loading (footprint.py): a model that
cannot fit is refused with one line, and a half-precision checkpoint headed for int8 on the CPU is loaded in its
own precision and quantized layer by layer (half the peak), computing what a float32 load computes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from hunyuan_mt.host import footprint
from hunyuan_mt.runtime.backbone import Backbone, PromptRow
from hunyuan_mt.config import GenerationConfig, ModelConfig
from hunyuan_mt.errors import ModelUnavailable


def test_estimate_counts_int8_linears_float_embeddings_and_a_tied_copy(hunyuan_dir: Path) -> None:
    from safetensors import safe_open

    shapes = {}
    with safe_open(str(hunyuan_dir / "model.safetensors"), framework="pt") as f:
        for key in f.keys():
            shapes[key] = f.get_slice(key).get_shape()
    params = sum(torch.Size(s).numel() for s in shapes.values())
    linear = {k: s for k, s in shapes.items() if len(s) == 2 and "embed" not in k}
    int8_bytes = sum(o * i + o * 4 for o, i in linear.values())
    rest = 4 * (params - sum(o * i for o, i in linear.values()))
    found = footprint.estimate(hunyuan_dir, int8=True)
    assert (found.params, found.resident) == (params, int8_bytes + rest)
    assert footprint.estimate(hunyuan_dir, int8=False).resident == 4 * params
    vocab, hidden = shapes["model.embed_tokens.weight"]
    tied = footprint.estimate(hunyuan_dir, int8=True, tied_output=True)
    assert tied.resident == found.resident + vocab * hidden + vocab * 4
    # A decoder-only model's table in int8 (quant/embedding.py), shared with the tied projection's rows.
    table = footprint.estimate(hunyuan_dir, int8=True, int8_table=True)
    assert table.resident == found.resident - 4 * vocab * hidden + vocab * hidden + vocab * 4
    assert footprint.estimate(hunyuan_dir, int8=True, tied_output=True, int8_table=True).resident == table.resident


def test_a_model_that_does_not_fit_is_refused_in_one_line(hunyuan_dir: Path, monkeypatch) -> None:
    import psutil

    class Tight:
        available = 2 * 2**20

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Tight())
    with pytest.raises(ModelUnavailable) as err:
        Backbone.load_uncached(ModelConfig(path=str(hunyuan_dir), warmup=False, quantization="int8"))
    message = str(err.value)
    assert "\n" not in message
    assert "needs about" in message and "GiB of memory with int8 weights" in message
    assert "has 0.0 GiB available" in message and "configs/hy-mt1.5-1.8b.yaml" in message


def test_a_bfloat16_checkpoint_loads_in_half_precision_for_int8(hunyuan_dir: Path, tmp_path: Path,
                                                                monkeypatch) -> None:
    """The bfloat16 copy of a checkpoint, loaded for int8, is read in bfloat16 (the loader is asked for it), ends
    float32 outside its int8 layers, and translates as the float32 checkpoint of the same bfloat16 values does."""
    from transformers import AutoModelForCausalLM

    half_dir, wide_dir = tmp_path / "bf16", tmp_path / "f32"
    model = AutoModelForCausalLM.from_pretrained(hunyuan_dir).to(torch.bfloat16)
    model.save_pretrained(half_dir, safe_serialization=True)
    model.to(torch.float32).save_pretrained(wide_dir, safe_serialization=True)
    for folder in (half_dir, wide_dir):
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
            if (hunyuan_dir / name).exists():
                shutil.copy(hunyuan_dir / name, folder / name)
    asked: list[torch.dtype] = []
    real = AutoModelForCausalLM.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        asked.append(kwargs.get("dtype"))
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(spy))
    half = Backbone.load_uncached(ModelConfig(path=str(half_dir), warmup=False, quantization="int8"))
    wide = Backbone.load_uncached(ModelConfig(path=str(wide_dir), warmup=False, quantization="int8"))
    assert asked == [torch.bfloat16, torch.float32]
    # The token table gives float32 vectors: int8 rows and float32 scales, or the file's own bfloat16 rows.
    assert half.model.model.embed_tokens(torch.tensor([3, 4])).dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in half.model.parameters())
    # RoPE's frequencies are computed, not stored: a half-precision load must not round them.
    assert torch.equal(half.model.model.rotary_emb.inv_freq, wide.model.model.rotary_emb.inv_freq)
    rows = [PromptRow("Open the file.", "en", "es"), PromptRow("Hello world, how are you today?", "en", "de")]
    assert half.generate(rows, [0, 0], GenerationConfig(), 12) == wide.generate(rows, [0, 0], GenerationConfig(), 12)
