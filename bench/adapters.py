"""Adapters folders for the benchmark: the demo's trained adapters plus generated extra pairs.

The demo ships fewer than the 38 (or 200) pairs the benchmark registers. Extra pairs are copies of a trained
adapter with its weights perturbed by a few percent (same target modules, rank and shapes, so attaching one costs
exactly what attaching a real one costs, and its outputs stay close to a real translation, so generation lengths
stay realistic). With no trained adapter to copy, they are random LoRA weights shaped from the backbone's
safetensors header. They live under `bench/results/tmp/` (git-ignored) and are never committed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"


def trained_adapters(root: Path | None) -> list[Path]:
    """Adapter folders under `root` that look like PEFT LoRA folders, sorted by name."""
    if root is None or not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / CONFIG).is_file() and (p / WEIGHTS).is_file())


def _stamp(model_dir: Path, templates: list[Path], pairs: list[str], noise: float) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([str(model_dir.resolve()), pairs, noise]).encode())
    for t in templates + [model_dir / "model.safetensors"]:
        if t.exists():
            st = (t / WEIGHTS if t.is_dir() else t).stat()
            h.update(f"{t.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def prepare_adapters(out_dir: Path, model_dir: Path, template_root: Path | None, pairs: list[str],
                     noise: float = 0.03) -> Path:
    """Fill `out_dir` with one adapter folder per pair (reused when already built for the same inputs).

    A pair that exists under `template_root` is copied unchanged; any other pair is a perturbed copy of the
    trained adapters in turn (seeded by the pair's name), or random LoRA weights when there is none.
    """
    templates = trained_adapters(template_root)
    stamp = _stamp(model_dir, templates, pairs, noise)
    stamp_file = out_dir / ".bench-stamp"
    if stamp_file.is_file() and stamp_file.read_text() == stamp:
        return out_dir
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    by_name = {t.name: t for t in templates}
    for i, pair in enumerate(pairs):
        dest = out_dir / pair
        if pair in by_name:
            shutil.copytree(by_name[pair], dest)
            continue
        seed = int.from_bytes(hashlib.sha256(pair.encode()).digest()[:4], "little")
        if templates:
            _perturbed_copy(templates[i % len(templates)], dest, pair, seed, noise)
        else:
            random_adapter(model_dir, dest, pair, seed)
    stamp_file.write_text(stamp)
    return out_dir


def _perturbed_copy(template: Path, dest: Path, pair: str, seed: int, noise: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    tensors = load_file(str(template / WEIGHTS))
    out = {k: (v * (1 + noise * torch.randn(v.shape, generator=gen, dtype=torch.float32).to(v.dtype))).contiguous()
           for k, v in tensors.items()}
    dest.mkdir(parents=True)
    save_file(out, str(dest / WEIGHTS))
    shutil.copy2(template / CONFIG, dest / CONFIG)
    _write_metadata(dest, pair, f"perturbed copy of {template.name} (noise {noise})")


def random_adapter(model_dir: Path, dest: Path, pair: str, seed: int, r: int = 8,
                   targets: tuple[str, ...] = ("q_proj", "v_proj")) -> None:
    """LoRA weights shaped from the backbone's safetensors header (no model is built)."""
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                module, _, leaf = key.rpartition(".")
                if leaf != "weight" or module.rsplit(".", 1)[-1] not in targets:
                    continue
                out_f, in_f = f.get_slice(key).get_shape()
                tensors[f"base_model.model.{module}.lora_A.weight"] = torch.randn(r, in_f, generator=gen) / in_f**0.5
                tensors[f"base_model.model.{module}.lora_B.weight"] = torch.randn(out_f, r, generator=gen) * 0.01
    if not tensors:
        raise ValueError(f"{model_dir}: no {'/'.join(targets)} weights to shape a LoRA adapter from")
    cfg = json.loads((model_dir / "config.json").read_text())
    dest.mkdir(parents=True)
    save_file(tensors, str(dest / WEIGHTS))
    (dest / CONFIG).write_text(json.dumps({
        "peft_type": "LORA", "task_type": "SEQ_2_SEQ_LM" if cfg.get("is_encoder_decoder") else "CAUSAL_LM",
        "r": r, "lora_alpha": 2 * r, "lora_dropout": 0.0, "target_modules": sorted(targets), "bias": "none",
        "fan_in_fan_out": False, "base_model_name_or_path": str(model_dir), "inference_mode": True,
        "init_lora_weights": True, "use_rslora": False, "use_dora": False, "modules_to_save": None,
    }, indent=2))
    _write_metadata(dest, pair, "random LoRA weights (no trained adapter to copy)")


def _write_metadata(dest: Path, pair: str, note: str) -> None:
    (dest / "metadata.json").write_text(json.dumps({"pair": pair, "synthetic": True, "benchmark": note}, indent=2))


def adapter_bytes(folder: Path) -> int:
    """Size of the adapter's weights file (what one resident adapter costs, roughly)."""
    return (folder / WEIGHTS).stat().st_size
