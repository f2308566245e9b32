"""What both int8 layers share (`int8.Int8Linear` through torch._int_mm, `int8_fbgemm.FbgemmLinear` through
fbgemm): the symmetric per-slice grid, the layer's shape and forward, and the bias of several layers fused into one
GEMM. Below both kernel modules, so each imports it and neither imports the other for it."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


def symmetric(m: torch.Tensor, dim: int, levels: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 of `m` with one scale per slice along `dim` (the slice's largest magnitude over `levels`):
    (int8 like m, float32 scales with `dim` removed)."""
    scale = (m.abs().amax(dim=dim, keepdim=True) / levels).clamp(min=1e-12)
    return torch.round(m / scale).to(torch.int8), scale.squeeze(dim)


class Int8Layer(nn.Module):
    """A linear layer with int8 weights on the CPU; subclasses give `matmul` (x [N, in] float32 → [N, out]),
    `from_float`, `stacked` and `dequantized`."""

    #: BackboneSpec and the slot layers read shapes from these, as from nn.Linear.
    in_features: int
    out_features: int
    bias: torch.Tensor | None

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> "Int8Layer":
        raise NotImplementedError

    @classmethod
    def from_linear(cls, linear: nn.Module) -> "Int8Layer":
        return cls.from_float(linear.weight, getattr(linear, "bias", None))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(float32 weight [out, in], bias), e.g. for merging an adapter into a float copy."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return self.matmul(x.reshape(-1, shape[-1]).to(torch.float32)).view(*shape[:-1], self.out_features)


def stacked_bias(parts: Sequence[tuple[torch.Tensor | None, int]]) -> torch.Tensor | None:
    """The bias of layers fused side by side, from each one's (bias or None, width): zeros where a layer has none,
    None when none has one."""
    if all(bias is None for bias, _ in parts):
        return None
    like = next(bias for bias, _ in parts if bias is not None)
    return torch.cat([bias if bias is not None else like.new_zeros(width) for bias, width in parts])
