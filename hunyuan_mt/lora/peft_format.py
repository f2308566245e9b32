"""The PEFT LoRA folder format, as the server reads it: what a backbone offers adapters (`BackboneSpec`), an
adapter's weights in host RAM (`AdapterWeights`), which modules PEFT would target, the per-module scale, and the
A/B pairs of a state dict.

It sits low in the package: the backbone, the slot layers (`lora/`) and the registry all read it, and it imports
nothing of theirs.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..errors import AdapterUnusable
from ..quant.layer import Int8Layer

if TYPE_CHECKING:
    from ..adapters.request import Pair

# "base_model.model.<module path>.lora_A.weight" as PEFT saves it (adapter name stripped).
LORA_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.(?P<part>lora_A|lora_B)\.weight$")


@dataclass(frozen=True)
class BackboneSpec:
    """What validation needs from the backbone: its type and the shape of every Linear layer, no model reference."""

    model_type: str
    #: module path (as in the bare model's named_modules) → (out_features, in_features)
    shapes: dict[str, tuple[int, int]]

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> BackboneSpec:
        shapes: dict[str, tuple[int, int]] = {}
        for name, module in model.named_modules():
            out_f, in_f = getattr(module, "out_features", None), getattr(module, "in_features", None)
            if isinstance(module, (torch.nn.Linear, Int8Layer)) and out_f is not None and in_f is not None:
                shapes[name] = (int(out_f), int(in_f))
            elif type(module).__name__ == "Conv1D":  # GPT-2 style layers store (in, out)
                in_f, out_f = module.weight.shape
                shapes[name] = (int(out_f), int(in_f))
        model_type = getattr(getattr(model, "config", None), "model_type", "") or ""
        return cls(model_type=model_type, shapes=shapes)

    def matching(self, target_modules: list[str] | str | None) -> list[str]:
        """Module paths a PEFT `target_modules` value selects (suffix match for a list, full regex for a string)."""
        if target_modules is None:
            return []
        if isinstance(target_modules, str):
            if target_modules == "all-linear":
                return [n for n in self.shapes if not n.endswith("lm_head")]
            pattern = re.compile(target_modules)
            return [n for n in self.shapes if pattern.fullmatch(n)]
        wanted = set(target_modules)
        return [n for n in self.shapes if n in wanted or n.rsplit(".", 1)[-1] in wanted]


@dataclass
class AdapterWeights:
    """An adapter read into host RAM: what the cache copies into slots and keeps in its RAM tier."""

    pair: "Pair"
    config: Any  # peft.LoraConfig
    state_dict: dict[str, torch.Tensor]
    fingerprint: tuple[int, ...] | None
    #: The same weights scaled and converted for slot copies (lora.PreparedAdapter), made on first attach.
    prepared: Any = None
    #: The safetensors file the tensors were read from (they map its pages), if they were.
    source: Path | None = None

    @property
    def nbytes(self) -> int:
        held = sum(t.numel() * t.element_size() for t in self.state_dict.values())
        return held + (self.prepared.nbytes if self.prepared is not None else 0)


def peft_targets(config: Any, spec: BackboneSpec) -> list[str]:
    """The backbone modules PEFT would give this config a LoRA layer on (target_modules, layers_to_transform,
    layers_pattern, exclude_modules), decided by PEFT's own matcher."""
    from peft.tuners.tuners_utils import check_target_module_exists

    if config.target_modules == "all-linear":
        candidates = spec.matching("all-linear")
        probe = copy.copy(config)
        probe.target_modules = {m.rsplit(".", 1)[-1] for m in candidates}
        return [m for m in candidates if check_target_module_exists(probe, m)]
    return [m for m in spec.shapes if check_target_module_exists(config, m)]


def _pattern_value(patterns: dict[str, Any] | None, module: str, default: Any) -> Any:
    """PEFT's rule for rank_pattern / alpha_pattern: the first key that matches a dotted suffix of `module`."""
    for pattern, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return value
    return default


def configured_rank(config: Any, module: str) -> int:
    """The rank PEFT gives `module`: a matching rank_pattern entry, else r."""
    return int(_pattern_value(getattr(config, "rank_pattern", None), module, config.r))


def lora_scale(config: Any, module: str) -> float:
    """The scaling PEFT applies to `module`'s LoRA product: alpha / r, or alpha / sqrt(r) with rsLoRA, where r and
    alpha follow rank_pattern and alpha_pattern."""
    rank = configured_rank(config, module)
    alpha = float(_pattern_value(getattr(config, "alpha_pattern", None), module, config.lora_alpha))
    return alpha / (rank ** 0.5) if getattr(config, "use_rslora", False) else alpha / rank


def lora_modules(state_dict: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """module path → (lora_A [r, in], lora_B [out, r]) from a PEFT adapter's state dict (adapter name stripped)."""
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state_dict.items():
        match = LORA_KEY.match(key)
        if match is None:
            raise AdapterUnusable(f"unexpected tensor {key!r} (only lora_A/lora_B weights are supported)")
        parts.setdefault(match["module"], {})[match["part"]] = tensor
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for module, found in parts.items():
        if set(found) != {"lora_A", "lora_B"}:
            raise AdapterUnusable(f"module {module!r} lacks {({'lora_A', 'lora_B'} - set(found)).pop()}")
        out[module] = (found["lora_A"], found["lora_B"])
    return out
