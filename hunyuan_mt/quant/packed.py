"""8-bit and 4-bit weights multiplied by our own GEMM (`kernels/qgemm.cpp`), for the decode steps of a decoder-only
model too large for the CPU's caches (HY-MT1.5-1.8B, Hunyuan-MT-7B).

Why: such a step reads every weight once per token, so its speed is the rate at which the weights come from memory.
fbgemm (`quant.fbgemm`) read HY-MT1.5-1.8B's 1.7 GB of int8 at ~14 GB/s of the 2-core box's 22.5 and, at 16 rows,
read and then computed; qgemm.cpp multiplies each 64-column block by up to 4 rows while it is in registers. And
4-bit weights (one scale per column and group of 128 inputs, symmetric ±7) halve the bytes: the only way past the
bandwidth bound of int8 (the target of 5× transformers' speed, bench/hunyuan_cpu.py).

The arithmetic and the packed layout are described in qgemm.cpp. A row's result depends only on that row (each
row quantized on its own grid, exact int32 sums, the threads splitting columns), and is the same bits whichever of
the kernel's three paths (AVX-512 VNNI, AVX2, plain C++) runs it (tests/test_qgemm.py compares them). The 8-bit
grid is fbgemm's (±63), so `model.int8_kernel: qgemm` keeps the model's precision.

4-bit weights are what `model.quantization: int4` loads: rounded to the nearest of 15 levels per group, with no
calibration (no GPTQ or AWQ), so the model's translations move more than with int8 (measured on the demo in
BENCHMARKS.md). The token table and the norms stay as they were.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from .. import kernels
from .layer import Int8Layer, stacked_bias, symmetric

#: Output columns of the kernel's superblock (qgemm.cpp's kBlock).
BLOCK = 64
#: Inputs per 4-bit group where the width allows (else the largest multiple of 8 dividing it, up to this).
GROUP = 128
#: (levels, offset) per bit width: the symmetric grid's largest magnitude and what is added to store it unsigned.
GRID = {8: (63, 64), 4: (7, 8)}


def available() -> bool:
    """Whether the kernel is built here (our CPU kernels build: a compiler and ninja)."""
    return kernels.qgemm() is not None


def isa() -> str:
    """The kernel's path on this CPU: "avx512_vnni", "avx2" or "scalar" (HMT_QGEMM_ISA caps it)."""
    return str(torch.ops.hmt_cpu.qgemm_isa()) if available() else "unavailable"


def fits(in_features: int, bits: int) -> bool:
    """Whether a layer reading `in_features` can be packed at `bits` (the kernel steps 4 or 8 inputs at a time)."""
    return in_features > 0 and in_features % (4 if bits == 8 else 8) == 0


def group_for(in_features: int, bits: int) -> int:
    """Inputs per scale group: all of them at 8 bits (one scale per column), else 128 or the largest multiple of
    8 up to 128 that divides the width."""
    if bits == 8:
        return in_features
    return next(g for g in range(min(GROUP, in_features), 0, -8) if in_features % g == 0)


def quantize(weight: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(integer weight [out, in] on the symmetric grid of `bits`, float32 scales [out, groups], group)."""
    levels, _ = GRID[bits]
    out, inner = weight.shape
    group = group_for(inner, bits)
    q, scale = symmetric(weight.detach().to(torch.float32).reshape(out, inner // group, group), 2, levels)
    return q.reshape(out, inner), scale, group


def pack(q: torch.Tensor, scale: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's (packed uint8 weight, scales [superblocks, groups, 64]) for `q` [out, in] and `scale`
    [out, groups]; the columns are padded to a multiple of 64 with zero weights."""
    _, offset = GRID[bits]
    out, inner = q.shape
    padded = -(-out // BLOCK) * BLOCK
    u = torch.full((padded, inner), offset, dtype=torch.int16)
    u[:out] = q.to(torch.int16) + offset
    s = torch.zeros(padded, scale.shape[1], dtype=torch.float32)
    s[:out] = scale
    scales = s.view(padded // BLOCK, BLOCK, -1).permute(0, 2, 1).contiguous().view(-1)
    blocks = padded // BLOCK
    if bits == 8:
        # [superblock, column block j, column c, k/4, k%4] → [superblock, k/4, j, c, k%4]
        packed = u.view(blocks, 4, 16, inner // 4, 4).permute(0, 3, 1, 2, 4)
    else:
        nib = u.view(blocks, 4, 16, inner // 8, 2, 4)
        packed = (nib[:, :, :, :, 0] | (nib[:, :, :, :, 1] << 4)).permute(0, 3, 1, 2, 4)
    return packed.to(torch.uint8).contiguous().view(-1), scales


def unpack(packed: torch.Tensor, scales: torch.Tensor, out: int, inner: int, bits: int,
           group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`pack`'s inverse: (q [out, in] int8, scale [out, groups])."""
    _, offset = GRID[bits]
    blocks = -(-out // BLOCK)
    u = packed.to(torch.int16)
    if bits == 8:
        cols = u.view(blocks, inner // 4, 4, 16, 4).permute(0, 2, 3, 1, 4).reshape(blocks * BLOCK, inner)
    else:
        b = u.view(blocks, inner // 8, 4, 16, 4).permute(0, 2, 3, 1, 4)
        cols = torch.stack([b & 15, b >> 4], dim=4).reshape(blocks * BLOCK, inner)
    s = scales.view(blocks, inner // group, BLOCK).permute(0, 2, 1).reshape(blocks * BLOCK, inner // group)
    return (cols[:out] - offset).to(torch.int8), s[:out].contiguous()


class PackedBase(NamedTuple):
    """A `dense.Projection`'s base when its weights are packed for qgemm: what `qgemm_linear` takes."""

    packed: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None
    n: int
    bits: int
    group: int


def qgemm_linear(x: torch.Tensor, base: PackedBase) -> torch.Tensor:
    """x [N, in] float32 @ the packed weightᵀ + bias (qgemm.cpp)."""
    return torch.ops.hmt_cpu.qgemm(x, base.packed, base.scales, base.bias, base.n, base.bits, base.group)


class PackedLinear(Int8Layer):
    """A linear layer whose weight lives only in qgemm's packed form, 8 or 4 bits, on the CPU."""

    #: The width in bits; a subclass per width, so that `quantize_linears` and `stacked` make layers of one kind.
    bits = 8

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, group: int, bias: torch.Tensor | None) -> None:
        """`q` [out, in] on the grid of `bits` and its `scale` [out, groups] (`quantize`)."""
        super().__init__()
        if not available():
            raise RuntimeError("the qgemm kernel could not be built here (a C++ compiler and ninja are needed); "
                               "set model.int8_kernel to fbgemm or int_mm, or model.quantization to int8")
        self.out_features, self.in_features = int(q.shape[0]), int(q.shape[1])
        self.group = group
        packed, scales = pack(q, scale, self.bits)
        self.register_buffer("packed", packed, persistent=False)
        self.register_buffer("scales", scales, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.float32).contiguous(),
                             persistent=False)

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> "PackedLinear":
        q, scale, group = quantize(weight, cls.bits)
        return cls(q, scale, group, bias)

    @classmethod
    def stacked(cls, layers: "list[PackedLinear]") -> "PackedLinear":
        """One layer computing `layers` side by side: their integer rows and scales as they are."""
        parts = [layer.rows() for layer in layers]
        return cls(torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts]), layers[0].group,
                   stacked_bias([(layer.bias, layer.out_features) for layer in layers]))

    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(the integer weight [out, in], its scales [out, groups]), unpacked."""
        return unpack(self.packed, self.scales, self.out_features, self.in_features, self.bits, self.group)

    def base(self) -> PackedBase:
        return PackedBase(self.packed, self.scales, self.bias, self.out_features, self.bits, self.group)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return qgemm_linear(x, self.base())

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        q, scale = self.rows()
        weight = q.to(torch.float32).view(self.out_features, -1, self.group) * scale[..., None]
        return weight.view(self.out_features, self.in_features), self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, {self.bits}-bit, "
                f"{'per-row scales' if self.group == self.in_features else f'scales per {self.group} inputs'} "
                "(qgemm)")


class Packed4Linear(PackedLinear):
    """`PackedLinear` at 4 bits (scales per column and group of 128 inputs)."""

    bits = 4


def layer_class(bits: int) -> Any:
    return PackedLinear if bits == 8 else Packed4Linear
