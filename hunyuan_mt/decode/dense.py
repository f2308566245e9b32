"""`Projection`: one or more linear layers that read the same input, run as one GEMM, plus their LoRA term.

The lean decode step calls these instead of the model's modules: Q, K and V of a self-attention layer become one
projection (one GEMM instead of three, and three fewer module calls), the cross-attention's K and V another. The
base weights are the model's own: in float32 the fused matrix is built once and the original layers' weights are
re-pointed at views of it (no second copy in memory); int8 layers (`int8.Int8Linear`) are fused into one int8
layer. A fusion is made once per set of layers and reused by every batch. The LoRA term comes from the slot layers that wrap those modules (`lora.GroupedLoRA`).
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..int8 import Int8Linear, int8_linear, weight_and_bias
from ..lora.grouped import GroupedLoRA, LoRATensors, apply_lora
from ..lora.mapping import SlotMapping
from ..lora.slots import SlotLinear


def _base(module: nn.Module) -> nn.Module:
    return module.base if isinstance(module, SlotLinear) else module


class Projection:
    """x [N, in] → y [N, Σ out] = the fused base layers + the rows' LoRA terms."""

    def __init__(self, modules: Sequence[nn.Module], mapping: SlotMapping | None) -> None:
        bases = [_base(m) for m in modules]
        self.widths = [int(b.out_features) for b in bases]
        weight, bias, q = _fused(bases)
        #: The base layer as `project` takes it: (int8 weightᵀ, scales, bias) or (float weight, bias).
        self.base: tuple[torch.Tensor | None, ...] = (q.weight_t, q.scale, q.bias) if q is not None else (weight, bias)
        slots = [m if isinstance(m, SlotLinear) else None for m in modules]
        self.lora = GroupedLoRA(slots, self.widths, mapping) if mapping is not None and any(slots) else None

    def lora_tensors(self, tokens: int, per_row: int, device: torch.device, complete: bool = False,
                     padding: int = 0) -> Any:
        return None if self.lora is None else self.lora.tensors(tokens, per_row, device, complete, padding)

    def __call__(self, x: torch.Tensor, tokens_per_row: int = 1) -> torch.Tensor:
        return project(x, self.base, self.lora_tensors(x.shape[0], tokens_per_row, x.device))


def project(x: torch.Tensor, base: tuple[torch.Tensor | None, ...], lora: LoRATensors | None) -> torch.Tensor:
    """A `Projection`'s arithmetic as a pure function of tensors (the compiled decode step runs it too)."""
    y = int8_linear(x, *base) if len(base) == 3 else F.linear(x, *base)
    return y if lora is None else apply_lora(x, y, lora)


#: Fused bases, by their first layer: every running batch and every rebuild after the slot layers change reuses
#: them (an int8 fusion requantizes and repacks, a float32 one re-points the layers' parameters).
_FUSED: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple[int, ...], Any]]" = weakref.WeakKeyDictionary()


def _fused(bases: list[nn.Module]) -> tuple[torch.Tensor | None, torch.Tensor | None, Int8Linear | None]:
    """(weight, bias, None) in float32 or (None, None, int8 layer) for the layers, rows stacked."""
    if len(bases) == 1:
        base = bases[0]
        return (None, None, base) if isinstance(base, Int8Linear) else (base.weight, base.bias, None)
    ids = tuple(id(b) for b in bases)
    found = _FUSED.get(bases[0])
    if found is not None and found[0] == ids:
        return found[1]
    if all(isinstance(b, Int8Linear) for b in bases):
        result: Any = (None, None, Int8Linear.stacked(bases))
    elif any(isinstance(b, Int8Linear) for b in bases):
        parts = [weight_and_bias(b) for b in bases]
        bias = None if all(p[1] is None for p in parts) else torch.cat(
            [p[1] if p[1] is not None else p[0].new_zeros(p[0].shape[0]) for p in parts])
        result = (None, None, Int8Linear(torch.cat([p[0] for p in parts]), bias))
    else:
        result = (*_fuse_float(bases), None)
    _FUSED[bases[0]] = (ids, result)
    return result


def _fuse_float(bases: list[nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for the layers, rows stacked; the layers' own parameters become views of it, so the
    model holds no second copy."""
    weights = [b.weight for b in bases]
    fused_w = torch.cat([w.detach() for w in weights])
    _repoint(weights, fused_w)
    biases = [b.bias for b in bases]
    if all(b is None for b in biases):
        return fused_w, None
    fused_b = torch.cat([b.detach() if b is not None else w.new_zeros(w.shape[0]) for b, w in zip(biases, weights)])
    if all(b is not None for b in biases):
        _repoint(biases, fused_b)
    return fused_w, fused_b


def _repoint(params: list[torch.Tensor], fused: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.shape[0]
            p.data = fused[offset:offset + n]
            offset += n
