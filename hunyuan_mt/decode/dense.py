"""`Projection`: one or more linear layers that read the same input, run as one GEMM, plus their LoRA term.

The lean decode step calls these instead of the model's modules: Q, K and V of a self-attention layer become one
projection (one GEMM instead of three, and three fewer module calls), the cross-attention's K and V another. The
base weights are the model's own: in float32 the fused matrix is built once and the original layers' weights are
re-pointed at views of it (no second copy in memory); int8 layers (`int8.Int8Linear`) are fused into one int8
layer. The LoRA term comes from the slot layers that wrap those modules (`lora.GroupedLoRA`).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..int8 import Int8Linear, weight_and_bias
from ..lora.grouped import GroupedLoRA
from ..lora.mapping import SlotMapping
from ..lora.slots import SlotLinear


def _base(module: nn.Module) -> nn.Module:
    return module.base if isinstance(module, SlotLinear) else module


class Projection:
    """x [N, in] → y [N, Σ out] = the fused base layers + the rows' LoRA terms."""

    def __init__(self, modules: Sequence[nn.Module], mapping: SlotMapping | None) -> None:
        bases = [_base(m) for m in modules]
        self.widths = [int(b.out_features) for b in bases]
        self.int8: Int8Linear | None = None
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        if any(isinstance(b, Int8Linear) for b in bases):
            if len(bases) == 1:
                self.int8 = bases[0]
            else:
                parts = [weight_and_bias(b) for b in bases]
                bias = None if all(p[1] is None for p in parts) else torch.cat(
                    [p[1] if p[1] is not None else p[0].new_zeros(p[0].shape[0]) for p in parts])
                self.int8 = Int8Linear(torch.cat([p[0] for p in parts]), bias)
        else:
            self.weight, self.bias = _fuse_float(bases)
        slots = [m if isinstance(m, SlotLinear) else None for m in modules]
        self.lora = GroupedLoRA(slots, self.widths, mapping) if mapping is not None and any(slots) else None

    def __call__(self, x: torch.Tensor, tokens_per_row: int = 1) -> torch.Tensor:
        if self.int8 is not None:
            y = self.int8.matmul(x)
        else:
            y = F.linear(x, self.weight, self.bias)
        if self.lora is not None:
            self.lora.add_to(x, y, tokens_per_row)
        return y


def _fuse_float(bases: list[nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for the layers, rows stacked; the layers' own parameters become views of it."""
    if len(bases) == 1:
        b = bases[0]
        return b.weight, b.bias
    weights = [b.weight for b in bases]
    if _back_to_back(weights):
        # Fused before (the slot layers were rebuilt since): the weights already lie back to back.
        fused_w = _spanning(weights)
    else:
        fused_w = torch.cat([w.detach() for w in weights])
        _repoint(weights, fused_w)
    biases = [b.bias for b in bases]
    if all(b is None for b in biases):
        return fused_w, None
    parts = [b.detach() if b is not None else w.new_zeros(w.shape[0]) for b, w in zip(biases, weights)]
    if all(b is not None for b in biases) and _back_to_back(biases):
        return fused_w, biases[0].detach().as_strided((sum(b.shape[0] for b in biases),), (1,))
    fused_b = torch.cat(parts)
    if all(b is not None for b in biases):
        _repoint(biases, fused_b)
    return fused_w, fused_b


def _back_to_back(tensors: list[torch.Tensor]) -> bool:
    """Whether the tensors are consecutive pieces of one storage (views `_repoint` made)."""
    ptr, storage = tensors[0].data_ptr(), tensors[0].untyped_storage().data_ptr()
    for t in tensors:
        if not t.is_contiguous() or t.data_ptr() != ptr or t.untyped_storage().data_ptr() != storage:
            return False
        ptr += t.numel() * t.element_size()
    return True


def _spanning(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One tensor over the rows of back-to-back 2-D tensors."""
    first = tensors[0].detach()
    return first.as_strided((sum(t.shape[0] for t in tensors), first.shape[1]), (first.shape[1], 1))


def _repoint(params: list[torch.Tensor], fused: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.shape[0]
            p.data = fused[offset:offset + n]
            offset += n
