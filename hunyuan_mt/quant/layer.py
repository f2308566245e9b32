"""What both int8 layers share (`int8.Int8Linear` through torch._int_mm, `quant.fbgemm.FbgemmLinear` through
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


class Int8Part(Int8Layer):
    """Output rows `start:stop` of a fused int8 layer (`fuse_siblings`): what was one of the model's linear layers
    (a Q, K or V projection) after it joined its siblings in one GEMM.

    The lean decode steps multiply by the whole (`dense.Projection` finds it); transformers' own forward (beam
    search through `generate`) still calls each part. The first part computes the whole product and the siblings
    called next with the same input tensor read their columns from it, so that path pays one GEMM too."""

    def __init__(self, whole: Int8Layer, start: int, stop: int, last: bool) -> None:
        super().__init__()
        # A plain attribute, not a submodule: the model holds each fused layer once, under no name of its own
        # (the adapter code matches modules by name, and counting the model's int8 bytes must not see it twice).
        self.__dict__["whole"] = whole
        self.start, self.stop, self.last = start, stop, last
        self.in_features, self.out_features = whole.in_features, stop - start
        self.register_buffer("bias", None if whole.bias is None else whole.bias[start:stop], persistent=False)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return self.whole.matmul(x)[:, self.start:self.stop]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        whole = self.whole
        shared = whole.__dict__.get("_shared")
        # The same tensor object (held by the memo, so never another one at its address): siblings of one call.
        if shared is None or shared[0] is not x:
            shared = (x, whole(x))
            whole.__dict__["_shared"] = shared
        if self.last:
            whole.__dict__["_shared"] = None   # the group is done; nothing is kept between forwards
        return shared[1][..., self.start:self.stop]

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        weight, _ = self.whole.dequantized()
        return weight[self.start:self.stop], self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rows {self.start}:{self.stop} " \
               f"of a fused int8 layer"


def fuse_siblings(model: nn.Module, groups: Sequence[tuple[str, tuple[str, ...]]]) -> int:
    """For each `(parent, children)` of `groups` (("self_attn", ("q_proj", "k_proj", "v_proj")): every module named
    `parent` whose `children` are int8 layers of one kind reading the same width), stack the children into one int8
    layer (their `stacked`: exactly what each computes) and put `Int8Part`s of it in their places, so the model
    keeps one copy where the lean step's fused GEMM would otherwise be a second (1.0 of HY-MT1.5-1.8B's 1.7 GB).
    Returns how many fused layers were made."""
    made = 0
    for name, module in list(model.named_modules()):
        for parent, children in groups:
            if name.rpartition(".")[2] != parent:
                continue
            layers = [getattr(module, child, None) for child in children]
            kinds = {type(layer) for layer in layers}
            if (len(kinds) != 1 or not isinstance(layers[0], Int8Layer) or isinstance(layers[0], Int8Part)
                    or len({layer.in_features for layer in layers}) != 1):
                continue
            whole = type(layers[0]).stacked(layers)
            start = 0
            for i, (child, layer) in enumerate(zip(children, layers)):
                setattr(module, child, Int8Part(whole, start, start + layer.out_features, i == len(layers) - 1))
                start += layer.out_features
            made += 1
    return made
