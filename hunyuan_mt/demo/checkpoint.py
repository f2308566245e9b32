"""Hand-over between the machine that trains and the one that ships.

The training machine (maybe a GPU box with other library versions) writes plain tensors and JSON; `export` then
rebuilds the backbone and every adapter with this project's pinned transformers and peft and saves them in their
standard formats: `models/demo/` (config, safetensors, tokenizer) and `adapters/<src>2<tgt>/` (PEFT LoRA folders).
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict
from pathlib import Path

import torch
from peft import PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file
from transformers import GenerationConfig, MarianMTModel, PreTrainedTokenizerFast

from .tokenizer import load_tokenizer
from .trainer import ModelSize, build_config, lora_config

# Tied to model.shared; transformers ties them again when the model is built.
_TIED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")


def save_checkpoint(model: PeftModel, tokenizer: PreTrainedTokenizerFast, size: ModelSize, directions: list[str],
                    folder: Path, extra: dict | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.backend_tokenizer.save(str(folder / "tokenizer.json"))
    adapters: dict[str, torch.Tensor] = {}
    for direction in directions:
        for key, value in get_peft_model_state_dict(model, adapter_name=direction).items():
            adapters[f"{direction}::{key}"] = value.detach().float().cpu().contiguous()
    save_file(adapters, str(folder / "adapters.safetensors"))
    backbone: dict[str, torch.Tensor] = {}
    for key, value in model.get_base_model().state_dict().items():
        if "lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        if key in _TIED:
            continue
        backbone[key] = value.detach().float().cpu().clone().contiguous()
    save_file(backbone, str(folder / "backbone.safetensors"))
    meta = {"size": asdict(size), "vocab_size": len(tokenizer), "pad_id": tokenizer.pad_token_id,
            "eos_id": tokenizer.eos_token_id, "directions": directions, **(extra or {})}
    (folder / "checkpoint.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")


def load_backbone_from_checkpoint(folder: Path) -> tuple[MarianMTModel, PreTrainedTokenizerFast, dict]:
    meta = json.loads((folder / "checkpoint.json").read_text(encoding="utf-8"))
    tokenizer = load_tokenizer(folder / "tokenizer.json")
    config = build_config(ModelSize(**meta["size"]), meta["vocab_size"], meta["pad_id"], meta["eos_id"])
    model = MarianMTModel(config)
    missing, unexpected = model.load_state_dict(load_file(str(folder / "backbone.safetensors")), strict=False)
    if unexpected or set(missing) - set(_TIED):
        raise ValueError(f"checkpoint does not fit the model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = GenerationConfig(
        decoder_start_token_id=meta["pad_id"], pad_token_id=meta["pad_id"], eos_token_id=meta["eos_id"],
        bad_words_ids=[[meta["pad_id"]]], num_beams=1, max_new_tokens=128)
    return model.eval(), tokenizer, meta


def adapter_state(folder: Path, direction: str) -> dict[str, torch.Tensor]:
    prefix = f"{direction}::"
    return {k[len(prefix):]: v for k, v in load_file(str(folder / "adapters.safetensors")).items()
            if k.startswith(prefix)}


def load_multi_lora(folder: Path) -> tuple[PeftModel, PreTrainedTokenizerFast, dict]:
    """Backbone plus every direction's adapter from a checkpoint, ready to train further."""
    from .trainer import multi_lora_model

    base, tokenizer, meta = load_backbone_from_checkpoint(folder)
    model = multi_lora_model(base, list(meta["directions"]), meta["size"]["lora_rank"])
    for direction in meta["directions"]:
        set_peft_model_state_dict(model, adapter_state(folder, direction), adapter_name=direction)
    return model, tokenizer, meta


def checkpoint_from_export(model_dir: Path, adapters_dir: Path, folder: Path, directions: list[str],
                           extra: dict | None = None) -> ModelSize:
    """A training checkpoint rebuilt from a shipped build (models/demo + adapters/), so that a later build can
    continue training it instead of starting from nothing. Returns the model's size as read from its config (the
    training settings in it are ModelSize's defaults; the build's overrides apply on top)."""
    from .trainer import multi_lora_model

    base = MarianMTModel.from_pretrained(str(model_dir), dtype=torch.float32)
    config = base.config
    rank = json.loads((adapters_dir / directions[0] / "adapter_config.json").read_text(encoding="utf-8"))["r"]
    size = ModelSize(d_model=config.d_model, layers=config.encoder_layers, heads=config.encoder_attention_heads,
                     ffn=config.encoder_ffn_dim, vocab=config.vocab_size, lora_rank=rank)
    tokenizer = load_tokenizer(model_dir / "tokenizer.json")
    model = multi_lora_model(base, directions, size.lora_rank)
    for direction in directions:
        state = load_file(str(adapters_dir / direction / "adapter_model.safetensors"))
        # PEFT saves without the adapter name; set_peft_model_state_dict puts it back.
        result = set_peft_model_state_dict(model, state, adapter_name=direction)
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"{direction}: unexpected adapter keys {result.unexpected_keys[:3]}")
    save_checkpoint(model, tokenizer, size, directions, folder, extra=extra)
    return size


def export(folder: Path, model_dir: Path, adapters_dir: Path) -> tuple[MarianMTModel, PreTrainedTokenizerFast, dict]:
    """Write the standard folders; returns the backbone as served (read back from disk), tokenizer and checkpoint
    metadata. The backbone's weights are stored in fp16, half the bytes of fp32; the config keeps float32 as the
    dtype to load them in, so a CPU loads fp32 weights (fp16 matmuls are slow there) and a GPU picks its own."""
    model, tokenizer, meta = load_backbone_from_checkpoint(folder)
    generation = model.generation_config
    model_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).save_pretrained(str(model_dir))
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    config["dtype"] = "float32"
    (model_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    model = MarianMTModel.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    model.generation_config = generation
    tokenizer.save_pretrained(str(model_dir))
    rank = meta["size"]["lora_rank"]
    for direction in meta["directions"]:
        peft_model = get_peft_model(copy.deepcopy(model), lora_config(rank))
        result = set_peft_model_state_dict(peft_model, adapter_state(folder, direction))
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"{direction}: unexpected adapter keys {result.unexpected_keys[:3]}")
        peft_model.peft_config["default"].base_model_name_or_path = "models/demo"
        # The embeddings belong to the backbone; never copy them into an adapter (PEFT guesses "resized" when the
        # base_model_name_or_path folder holds a different model).
        peft_model.save_pretrained(str(adapters_dir / direction), save_embedding_layers=False)
        # PEFT's generated model card is all placeholders; metadata.json says what the adapter is.
        (adapters_dir / direction / "README.md").unlink(missing_ok=True)
    return model, tokenizer, meta
