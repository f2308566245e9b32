"""int8 weights on the CPU: every `nn.Linear` of the backbone becomes an int8 layer (`model.quantization: int8`),
multiplied by one of three kernels (`model.int8_kernel`, by default the faster on this CPU, timed by `gemm_speed`,
or for a model too large for the caches chosen by `kernel_for`): `Int8Linear` below, through `torch._int_mm`, where
torch has an int8 kernel for the CPU (AVX-512); `quant.fbgemm.FbgemmLinear`, through fbgemm, on CPUs with AVX2
alone, where `torch._int_mm` is a plain loop; `quant.packed.PackedLinear`, through our own GEMM (`kernels/qgemm.cpp`)
for a large decoder-only model's steps. `model.quantization: int4` is that GEMM's 4-bit weights.

The weights are quantized once, at load, symmetrically with one scale per output row; activations are quantized
per token, symmetrically, at every call (`int8_linear`); `torch._int_mm` multiplies the two in int8 with int32
accumulation (oneDNN on x86), and the product is scaled back per token and per row, the bias added.

Why this path: the int32 accumulation is exact and every scale is a row's own, so a token's output does not
depend on the other tokens of its batch at all (a row computes what it computes alone; tested bit for bit). And it
is four plain tensor operations around one aten GEMM, which `torch.compile` fuses into two kernels around the GEMM
(`decode/compiled.py`). Measured on the 2-core x86 box (one thread, µs per call; BENCHMARKS.md): 384→1152 at one
row 17 (fp32 `F.linear` 42), at 64 rows 142 (fp32 634); the 384→8012 output projection at 64 rows 1009 (fp32
7091). torch's packed dynamic int8 GEMM (fbgemm, `quantized::linear_dynamic`, used before) quantizes its whole input
on one scale, needed two anchor rows and a rescale to stay per token, and is opaque to `torch.compile` (a graph
break at every layer); `torch._weight_int8pack_mm` is weight-only and ran 30-40x slower than fp32 here.

The slot layers keep LoRA's weights in float32 and add B·A·x on top of this module's output, so any mix of
adapters still shares one batch. The lean decode step multiplies them in int8 as well over these bases
(`lora.grouped`: A's columns inside the base GEMM, B per row with its scales folded into h), each slot's pieces
quantized once per write; float32 backbones keep the exact float32 LoRA product.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import fbgemm as int8_fbgemm, packed as int8_packed
from .layer import Int8Layer, stacked_bias, symmetric

log = logging.getLogger(__name__)

#: The largest int8 magnitude used; -128 is left out so the grid is symmetric.
_LEVELS = 127.0


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-row symmetric int8: (weightᵀ as int8 [in, out], float32 scale per row [out])."""
    q, scale = symmetric(weight.detach().to(torch.float32), 1, _LEVELS)
    return q.t().contiguous(), scale.contiguous()


def quantize_matrix_rows(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8 of a matrix laid out [k, out] (a LoRA B as the slot layers store it): (int8 [k, out],
    float32 scale per row [k]). A row's scale multiplies the input's column k, so the caller folds it into the input
    before quantizing that per token (lora.grouped)."""
    return symmetric(b, 1, _LEVELS)


def quantize_columns(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-column symmetric int8 of a matrix laid out [in, out] (a LoRA A as the slot layers store it): (int8 [in,
    out], float32 scale per column [out]). The same grid as `quantize_rows`, without its transposes."""
    return symmetric(a, 0, _LEVELS)


def int8_linear(x: torch.Tensor, weight_t: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    """x [N, in] (float32) @ dequantized(weight_t) + bias, activations quantized per token.

    Each token is scaled onto the int8 grid by its own largest magnitude, so its rounding depends on it alone;
    the int32 product is exact; the result is scaled back by the token's step and each output row's scale.
    Plain tensor operations only: the lean decode step runs this eagerly or compiled."""
    y = int8_matmul(x, weight_t) * scale
    return y if bias is None else y + bias


def int8_matmul(x: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    """x [N, in] (float32) @ weight_t (int8 [in, out]) with x quantized per token: the int32 product scaled back by
    each token's step (the caller applies the weight's own scales, per column or folded into x)."""
    step = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-30) / _LEVELS
    q = torch.round(x / step).to(torch.int8)
    return torch._int_mm(q, weight_t).to(torch.float32) * step


class Int8Linear(Int8Layer):
    """A linear layer with int8 weights (per-row scales) and a float32 bias, on the CPU."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = int(weight.shape[0]), int(weight.shape[1])
        weight_t, scale = quantize_rows(weight)
        # Buffers: they follow .to() like the float weights did, and are never saved with the model.
        self.register_buffer("weight_t", weight_t, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.float32).contiguous(),
                             persistent=False)

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> "Int8Linear":
        return cls(weight, bias)

    @classmethod
    def stacked(cls, layers: "list[Int8Linear]") -> "Int8Linear":
        """One layer computing `layers` side by side (Q, K and V in one GEMM): their int8 columns and scales are
        concatenated as they are, so the fused layer computes exactly what each computes."""
        fused = cls.__new__(cls)
        Int8Layer.__init__(fused)
        fused.in_features = layers[0].in_features
        fused.out_features = sum(layer.out_features for layer in layers)
        fused.register_buffer("weight_t", torch.cat([layer.weight_t for layer in layers], dim=1).contiguous(),
                              persistent=False)
        fused.register_buffer("scale", torch.cat([layer.scale for layer in layers]), persistent=False)
        fused.register_buffer("bias", stacked_bias([(layer.bias, layer.out_features) for layer in layers]),
                              persistent=False)
        return fused

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, in] (float32) @ Wᵀ + b; the lean decode step calls this (or `int8_linear`) directly."""
        return int8_linear(x, self.weight_t, self.scale, self.bias)

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.weight_t.t().to(torch.float32) * self.scale[:, None], self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-row scales"


def available() -> bool:
    """Whether this torch build multiplies int8 matrices on the CPU, with either kernel."""
    return int_mm_available() or int8_fbgemm.available()


def int_mm_available() -> bool:
    """Whether this torch build has `torch._int_mm` on the CPU."""
    if not hasattr(torch, "_int_mm"):
        return False
    try:
        torch._int_mm(torch.ones(1, 8, dtype=torch.int8), torch.ones(8, 8, dtype=torch.int8))
    except (RuntimeError, NotImplementedError):
        return False
    return True


#: fbgemm is chosen over torch._int_mm only when its probe takes less than this share of torch._int_mm's.
_FBGEMM_MARGIN = 0.5

#: The int8 kernels: torch's `_int_mm` (oneDNN; fast with AVX-512), fbgemm (`quant.fbgemm`; built for AVX2) and
#: ours (`quant.packed`, qgemm.cpp: for models too large for the caches; `kernel_for`).
KERNELS = ("int_mm", "fbgemm", "qgemm")


@dataclass(frozen=True)
class GemmSpeed:
    """How the int8 GEMMs compare with float32's on this CPU, as timed by `gemm_speed`."""

    int8_us: float  # torch._int_mm
    float32_us: float  # the float32 path the engine runs (packed for oneDNN where it can be)
    capability: str  # torch's CPU instruction set (AVX2, AVX512, ...)
    fbgemm_us: float | None = None  # fbgemm's path (None: this torch build has no fbgemm)
    pinned: str | None = None  # the kernel configured (model.int8_kernel), None: the faster

    @property
    def kernel(self) -> str:
        """The int8 kernel that runs: the one pinned, else the faster here ("int_mm" or "fbgemm")."""
        if self.pinned is not None:
            return self.pinned
        # torch._int_mm's path also runs LoRA's A inside the base GEMM and calls no Python per GEMM, which this
        # probe does not time; where it has a kernel it was measured end to end (BENCHMARKS.md), so fbgemm takes
        # over only where it is clearly faster (on AVX2 alone: ~40×).
        return ("fbgemm" if self.fbgemm_us is not None and self.fbgemm_us < _FBGEMM_MARGIN * self.int8_us
                else "int_mm")

    @property
    def best_us(self) -> float:
        return self.fbgemm_us if self.kernel == "fbgemm" else self.int8_us  # type: ignore[return-value]

    @property
    def ratio(self) -> float:
        """The faster int8 kernel's time ÷ float32's: below 1 where int8 pays."""
        return self.best_us / self.float32_us

    @property
    def fast(self) -> bool:
        return self.ratio < 1.0

    def describe(self) -> str:
        name = "torch._int_mm" if self.kernel == "int_mm" else "fbgemm"
        return (f"int8 through {name} takes {self.ratio:.2g}× float32's time on this CPU "
                f"({self.best_us:.0f} vs {self.float32_us:.0f} µs, {self.capability})")


#: (rows, in, out) of the probe: a decode step's GEMM of a small model, small enough that torch._int_mm's plain
#: loop on an AVX2-only CPU (~25× float32) costs tens of milliseconds once per process.
_PROBE = (48, 384, 768)


#: Linear weights (int8 bytes) beyond which a model's decode steps are bound by reading them from memory, not by
#: the probe's cache-resident GEMM: there fbgemm's weight, packed once at load, reads at ~3× the rate of
#: torch._int_mm, which has oneDNN reorder its operand at every call (a gate projection of HY-MT1.5-1.8B, 2048 →
#: 6144, cold, 2 threads on an Intel Xeon with AMX: 1 row 0.63 against 1.99 ms, 16 rows 1.34 against 2.10, 64 rows
#: 3.37 against 3.33; BENCHMARKS.md), and our qgemm, where the CPU has AVX-512 VNNI, reads faster still. The demo
#: model (about 13M parameters) keeps the probe's choice.
LARGE_MODEL_BYTES = 256 * 2**20


def kernel_for(speed: GemmSpeed, weight_bytes: int) -> str:
    """The int8 kernel for a model with `weight_bytes` of int8 linear weights: the pinned one; for a model too
    large for the CPU's caches, fbgemm or our qgemm, whichever `large_gemm_speed` timed faster on this CPU at the
    rows a server's decode steps run (one stream and a batch); else the probe's faster one."""
    if speed.pinned is None and weight_bytes > LARGE_MODEL_BYTES:
        if int8_packed.available() and int8_fbgemm.available():
            large = large_gemm_speed(torch.get_num_threads())
            log.info("int8 kernel for a large model: %s", large.describe())
            return large.kernel
        if int8_packed.available():
            return "qgemm"
        if int8_fbgemm.available():
            return "fbgemm"
    return speed.kernel


@dataclass(frozen=True)
class LargeGemmSpeed:
    """fbgemm's and qgemm's 8-bit GEMMs timed on this CPU over more weights than its caches hold (`large_gemm_speed`):
    ms per pass at each row count."""

    fbgemm_ms: dict[int, float]
    qgemm_ms: dict[int, float]
    isa: str  # qgemm's path here

    @property
    def kernel(self) -> str:
        """The faster over the rows timed together: qgemm where the product of its times is the smaller (each row
        count weighs the same, whatever its absolute time)."""
        ours = fbgemm = 1.0
        for rows in self.fbgemm_ms:
            ours *= self.qgemm_ms[rows]
            fbgemm *= self.fbgemm_ms[rows]
        return "qgemm" if ours < fbgemm else "fbgemm"

    def describe(self) -> str:
        cells = ", ".join(f"{rows} rows {self.qgemm_ms[rows]:.1f} vs {self.fbgemm_ms[rows]:.1f} ms"
                          for rows in self.fbgemm_ms)
        return f"{self.kernel} (qgemm's {self.isa} path against fbgemm: {cells})"


#: (in, out) of each layer `large_gemm_speed` multiplies, and how many: 64 MB of int8, twice the L3 of the 2-core
#: boxes, so that its one-row pass is bound by memory as a large model's step is.
_LARGE_PROBE = (2048, 8192, 4)
#: The rows a server's decode steps run: one stream, and the batch of 16 the concurrency benchmark sends.
_LARGE_ROWS = (1, 16)


@functools.lru_cache(maxsize=None)
def large_gemm_speed(threads: int | None = None) -> LargeGemmSpeed:
    """Time fbgemm and qgemm (8-bit) on `_LARGE_PROBE`'s weights at `_LARGE_ROWS` rows, on the threads the model
    runs (the argument only keys the cache): the kernels take turns, each row count's best of 5 passes. About a
    second, once per process, before a large model is quantized. The choice was a rule before (qgemm where the CPU
    has AVX-512 VNNI, fbgemm elsewhere): on an AVX2-only AMD Zen 3 that rule kept fbgemm, whose 16-row step was
    slower than one stream's rate times 16 (BENCHMARKS.md)."""
    inner, out, count = _LARGE_PROBE
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-63, 64, (out, inner), dtype=torch.int8, generator=gen)
    scale = torch.full((out,), 1e-3)
    fbgemm_layers = [int8_fbgemm.FbgemmLinear(q, scale, None) for _ in range(count)]
    ours = [int8_packed.PackedLinear(q, scale[:, None], inner, None) for _ in range(count)]
    xs = {rows: torch.randn(rows, inner, generator=gen) for rows in _LARGE_ROWS}
    times: dict[str, dict[int, float]] = {"fbgemm": {}, "qgemm": {}}
    kinds = {"fbgemm": fbgemm_layers, "qgemm": ours}
    for rows, x in xs.items():
        best = {name: float("inf") for name in kinds}
        for _ in range(5):
            for name, layers in kinds.items():
                t0 = time.perf_counter()
                for layer in layers:
                    layer.matmul(x)
                best[name] = min(best[name], (time.perf_counter() - t0) * 1e3)
        for name in kinds:
            times[name][rows] = best[name]
    return LargeGemmSpeed(times["fbgemm"], times["qgemm"], int8_packed.isa())


@functools.lru_cache(maxsize=None)
def gemm_speed(threads: int | None = None) -> GemmSpeed:
    """Time both int8 kernels against float32 as the engine runs it (oneDNN's packed weight where there is one), on
    one thread (the argument only keys the cache).

    torch._int_mm ran ~4× faster than float32 where torch has an int8 kernel for the CPU (the 2-core AVX-512 box of
    2026-12-01, BENCHMARKS.md); on an AVX2-only CPU (AMD Zen 3, 2026-12-02) it is a plain loop, 20 ms against
    0.8 ms at 64×384×1152, while fbgemm's probe took 0.37-0.63× float32's time there (int8_fbgemm). See
    `_fastest` for how they are timed."""
    rows, inner, out = _PROBE
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(out, inner, generator=gen) * 0.05
    x = torch.randn(rows, inner, generator=gen)

    kernels: dict[str, Any] = {}
    if torch.backends.mkldnn.is_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
        kernels["float32"] = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    else:
        weight_t = weight.t().contiguous()
        kernels["float32"] = lambda: torch.mm(x, weight_t)
    # The int8 GEMMs alone, on activations already on their grid: the compiled step fuses the per-token scaling
    # around them into the neighbouring loops, so timing it here (eager) would charge int8 for what it does not
    # cost there.
    if int_mm_available():
        weight_q, _ = quantize_rows(weight)
        q = torch.round(x / (x.abs().amax(dim=1, keepdim=True) / _LEVELS)).to(torch.int8)
        kernels["int_mm"] = lambda: torch._int_mm(q, weight_q)
    if int8_fbgemm.available():
        layer = int8_fbgemm.FbgemmLinear(*int8_fbgemm.quantize_rows(weight), None)
        unit = x / x.abs().amax(dim=1, keepdim=True)
        op = int8_fbgemm.linear_op()  # the op the layers will call
        kernels["fbgemm"] = lambda: op(unit, layer.scale)
    # On one thread: which kernel is faster is a question of the CPU's instructions, and with two the timing
    # mostly measured how fast the OpenMP worker woke (see `_fastest`).
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        us = _fastest(kernels)
    finally:
        torch.set_num_threads(threads_before)
    int_mm_us, fbgemm_us = us.get("int_mm", float("inf")), us.get("fbgemm")
    float32_us = us["float32"]
    return GemmSpeed(int_mm_us, float32_us, torch.backends.cpu.get_cpu_capability(), fbgemm_us)


#: Rounds of `_fastest`: each kernel's best of this many calls, the kernels taking turns.
_ROUNDS = 9


def _fastest(kernels: dict[str, Any]) -> dict[str, float]:
    """µs per call of each kernel (the first is float32's), at its best of `_ROUNDS` calls after a first one, the
    kernels called in turn so that a disturbance hits them alike. A kernel whose first call already takes 20×
    float32's (torch._int_mm's plain loop) is not called again.

    Timed on two threads, one kernel after the other at a best of three (before), fbgemm's probe moved between
    0.4× and 1.6× float32's time on the 2-core box (2026-12-02, the service starting in bench.peer, where the
    language detector's helper process loads beside it), so `model.quantization: auto` could have picked float32,
    which decodes slower there; taking turns, best of 9, still 0.52–0.95× on two threads, but 0.57–0.75× on one
    (0.64–0.65× beside a busy process)."""
    first: dict[str, float] = {}
    for name, fn in kernels.items():
        t0 = time.perf_counter()
        fn()  # kernel selection, allocation, fbgemm's code generation
        first[name] = (time.perf_counter() - t0) * 1e6
    reference = next(iter(kernels))
    t0 = time.perf_counter()
    kernels[reference]()  # float32's first call set up oneDNN's primitive: the limit is a warm call's
    limit = 20 * (time.perf_counter() - t0) * 1e6
    timed = {name: fn for name, fn in kernels.items() if first[name] <= limit}
    best = {name: float("inf") for name in timed}
    for _ in range(_ROUNDS):
        for name, fn in timed.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], (time.perf_counter() - t0) * 1e6)
    return {name: best.get(name, first[name]) for name in kernels}


def weight_and_bias(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A linear layer's float32 weight and bias, whether it is nn.Linear or an int8 layer."""
    if isinstance(module, Int8Layer):
        return module.dequantized()
    return module.weight.detach().to(torch.float32), (None if module.bias is None else module.bias.detach())


def quantize_linears(model: nn.Module, kernel: str = "int_mm", bits: int = 8) -> int:
    """Replace every nn.Linear of `model` by an int8 layer multiplied by `kernel` (Int8Linear for "int_mm",
    int8_fbgemm.FbgemmLinear for "fbgemm", int8_packed.PackedLinear for "qgemm"), or with `bits=4` by qgemm's 4-bit
    layer (`model.quantization: int4`). Returns how many.

    Tied output projections (Marian's lm_head shares the token embeddings) get their own int8 copy; the
    embedding table stays float32 for look-ups.
    """
    if kernel not in KERNELS:
        raise ValueError(f"int8 kernel {kernel!r}: one of {', '.join(KERNELS)}")
    if bits == 4 and kernel != "qgemm":
        raise ValueError("4-bit weights are multiplied by qgemm only")
    layer: Any = (Int8Linear if kernel == "int_mm" else int8_fbgemm.FbgemmLinear if kernel == "fbgemm"
                  else int8_packed.layer_class(bits))
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    for name, linear in targets:
        parent_path, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        # A width qgemm cannot step through (not a multiple of 4 or 8 inputs) goes to fbgemm at 8 bits.
        kind = (layer if kernel != "qgemm" or int8_packed.fits(linear.in_features, bits)
                else int8_fbgemm.FbgemmLinear)
        setattr(parent, attr, kind.from_linear(linear))
    log.info("%d-bit weights: %d linear layers quantized (%s, %s)", bits, len(targets), kernel,
             "per-row scales" if bits == 8 else f"scales per {int8_packed.GROUP} inputs")
    return len(targets)
