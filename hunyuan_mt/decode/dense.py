"""`Projection`: one or more linear layers that read the same input, run as one GEMM, plus their LoRA term.

The lean decode step calls these instead of the model's modules: Q, K and V of a self-attention layer become one
projection (one GEMM instead of three, and three fewer module calls), the cross-attention's K and V another. The
base weights are the model's own: in float32 the fused matrix is built once and the original layers' weights are
re-pointed at views of it (no second copy in memory); int8 layers (`int8.Int8Linear`) are fused into one int8
layer. A fusion is made once per set of layers and reused by every batch. The LoRA term comes from the slot layers
that wrap those modules (`lora.GroupedLoRA`).

Float32 weights on the CPU are also kept packed in oneDNN's blocked layout (`PackedFloat`), the form torch's own
compiler freezes CPU linears into (`torch.ops.mkldnn._linear_pointwise`). Measured on the 2-core box (12 GEMMs of
384→1152/384, µs, 2 threads): 1 row 987 → 420, 4 rows 1971 → 498, 64 rows 5020 → 2495 against `F.linear` (MKL),
and a row's result does not depend on the rows beside it in more of the shapes than with `F.linear` (BENCHMARKS.md).
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple, Sequence

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from ..quant import invariant
from ..quant.int8 import Int8Linear, int8_linear, weight_and_bias
from ..quant.fbgemm import FbgemmBase, FbgemmLinear, fbgemm_linear, linear_op
from ..quant.packed import PackedBase, PackedLinear, qgemm_linear
from ..quant.layer import Int8Layer, Int8Part, stacked_bias
from ..lora.grouped import GroupedLoRA, LoRATensors, add_low_rank, apply_lora
from ..lora.mapping import SlotMapping
from ..lora.slots import SlotLinear


def _base(module: nn.Module) -> nn.Module:
    return module.base if isinstance(module, SlotLinear) else module


class PackedFloat(NamedTuple):
    """A float32 linear on the CPU with its weight in oneDNN's blocked layout (an extra copy, packed once)."""

    weight: torch.Tensor
    bias: torch.Tensor | None


#: The row count oneDNN packs for; measured fastest at every count from 1 to 64 on the 2-core box.
_PACK_ROWS = 64

#: Packed copies by the float weight they were made from (and that weight's version, so an in-place change to
#: the model's weights repacks instead of computing with stale ones).
#: (Keyed by identity: a tensor's `==` is elementwise, which a plain WeakKeyDictionary would call on a collision.)
_PACKED: Any = WeakIdKeyDictionary()


def packed(weight: torch.Tensor, bias: torch.Tensor | None) -> "PackedFloat | tuple[torch.Tensor, Any]":
    """The float base as `project` takes it: packed for oneDNN where that applies (float32 on a CPU with oneDNN),
    else (weight, bias) for `F.linear`."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return weight, bias
    found = _PACKED.get(weight)
    version = -1 if weight.is_inference() else weight._version  # inference tensors keep no version counter
    if found is None or found[0] != version:
        with torch.no_grad():
            found = (version, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_ROWS))
        _PACKED[weight] = found
    return PackedFloat(found[1], bias)


class Projection:
    """x [N, in] → y [N, Σ out] = the fused base layers + the rows' LoRA terms."""

    def __init__(self, modules: Sequence[nn.Module], mapping: SlotMapping | None,
                 bias: torch.Tensor | None = None) -> None:
        """`bias`: a bias for a layer that has none of its own (Marian's final logits bias for its output
        projection): added by the GEMM, where a separate add of a [rows, vocab] block cost a pass over it (and, in
        the compiled float32 step, oneDNN's broadcast binary post-op: 6.1 against 4.8 ms for 64 rows × 8,012
        outputs on the 2-core AVX2 box)."""
        bases = [_base(m) for m in modules]
        self.widths = [int(b.out_features) for b in bases]
        weight, own_bias, q = _fused(bases)
        if q is not None:
            own_bias = q.bias
        if bias is not None and own_bias is not None:
            raise ValueError("Projection: an extra bias is for a layer without one")
        bias = own_bias if bias is None else bias
        #: The base layer as `project` takes it: (int8 weightᵀ, scales, bias) for torch._int_mm, fbgemm's handle,
        #: bias and op (`FbgemmBase`), qgemm's packed weight (`PackedBase`), or (float weight, bias).
        self.base: tuple[Any, ...] = (packed(weight, bias) if q is None else FbgemmBase(q.scale, bias, linear_op())
                                      if isinstance(q, FbgemmLinear) else q.base()._replace(bias=bias)
                                      if isinstance(q, PackedLinear) else (q.weight_t, q.scale, bias))
        #: The base unpacked: what a compiled step freezes (and packs itself); the int8 layer as it is.
        self.plain: tuple[Any, ...] = self.base if q is not None else (weight, bias)
        slots = [m if isinstance(m, SlotLinear) else None for m in modules]
        # LoRA's A joins the base GEMM over torch._int_mm's weight; over qgemm's packed one both sides run in
        # qgemm too (a step there is never compiled, so eager alone decides a row's bits); over fbgemm's it stays
        # float32, as the compiled step multiplies it.
        int8_base = (q.weight_t, q.scale) if isinstance(q, Int8Linear) else None
        self.lora = (GroupedLoRA(slots, self.widths, mapping, int8_base, packed=isinstance(q, PackedLinear))
                     if mapping is not None and any(slots) else None)

    def lora_tensors(self, tokens: int, per_row: int, device: torch.device, complete: bool = False,
                     padding: int = 0) -> Any:
        return None if self.lora is None else self.lora.tensors(tokens, per_row, device, complete, padding)

    def __call__(self, x: torch.Tensor, tokens_per_row: int = 1) -> torch.Tensor:
        return project(x, self.base, self.lora_tensors(x.shape[0], tokens_per_row, x.device))


def project(x: torch.Tensor, base: tuple[torch.Tensor | None, ...], lora: LoRATensors | None) -> torch.Tensor:
    """A `Projection`'s arithmetic as a pure function of tensors (the compiled decode step runs it too)."""
    if lora is not None and lora[4] is not None:
        # int8 base with A's columns appended (lora.grouped): one GEMM gives the base output and h = x @ A.
        out, (wide, scale) = base[0].shape[1], lora[4][:2]
        both = int8_linear(x, wide[:, :scale.shape[0]], scale, None)
        y = both[:, :out] if base[2] is None else both[:, :out] + base[2]
        return add_low_rank(both[:, out:], y, lora)
    if isinstance(base, PackedFloat):
        y = torch.ops.mkldnn._linear_pointwise(x, base.weight, base.bias, "none", [], "")
    elif isinstance(base, FbgemmBase):
        y = fbgemm_linear(x, base.handle, base.bias, base.op)
    elif isinstance(base, PackedBase):
        y = qgemm_linear(x, base)
    else:
        y = int8_linear(x, *base) if len(base) == 3 else invariant.linear(x, *base)
    return y if lora is None else apply_lora(x, y, lora)


#: Fused bases, by their first layer: every running batch and every rebuild after the slot layers change reuses
#: them (an int8 fusion requantizes and repacks, a float32 one re-points the layers' parameters).
_FUSED: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple[int, ...], Any]]" = weakref.WeakKeyDictionary()


def _fused(bases: list[nn.Module]) -> tuple[torch.Tensor | None, torch.Tensor | None, Any]:
    """(weight, bias, None) in float32 or (None, None, int8 layer) for the layers, rows stacked."""
    whole = _whole_of(bases)
    if whole is not None:
        return None, None, whole
    if len(bases) == 1:
        base = bases[0]
        return (None, None, base) if isinstance(base, Int8Layer) else (base.weight, base.bias, None)
    ids = tuple(id(b) for b in bases)
    found = _FUSED.get(bases[0])
    if found is not None and found[0] == ids:
        return found[1]
    kinds = {type(b) for b in bases}
    quantized = [b for b in bases if isinstance(b, Int8Layer)]
    if len(kinds) == 1 and quantized:
        result: Any = (None, None, quantized[0].stacked(bases))
    elif quantized:
        parts = [weight_and_bias(b) for b in bases]
        bias = stacked_bias([(b, w.shape[0]) for w, b in parts])
        result = (None, None, quantized[0].from_float(torch.cat([w for w, _ in parts]), bias))
    else:
        result = (*_fuse_float(bases), None)
    _FUSED[bases[0]] = (ids, result)
    return result


def _whole_of(bases: list[nn.Module]) -> Int8Layer | None:
    """The fused int8 layer `bases` are, in order, every part of (`quant.layer.fuse_siblings` made it at load), or
    None."""
    if not all(isinstance(b, Int8Part) and b.whole is bases[0].whole for b in bases):
        return None
    whole = bases[0].whole
    edges = [0] + [b.stop for b in bases]
    return whole if [b.start for b in bases] == edges[:-1] and edges[-1] == whole.out_features else None


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
