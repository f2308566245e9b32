"""int8 weights through fbgemm, for CPUs where `torch._int_mm` has no kernel (AVX2 without AVX-512).

`int8.Int8Linear` multiplies with `torch._int_mm`, which oneDNN runs fast where the CPU has AVX-512 (VNNI); on an
AVX2-only CPU (AMD Zen 1-3, older Intel) torch falls back to a plain loop, ~25× slower than float32. torch's
other int8 GEMM, fbgemm (the engine of its quantized-tensor ops), is built for AVX2: on the 2-core AMD Zen 3 box
(2 threads, µs per call, float32 packed for oneDNN against this module's path) the output head 384→8012 takes
155 against 372 at one row and 2,061 against 4,181 at 64 rows; 384→1152 54 against 86 and 378 against 458.

Why this path keeps a row's result its own:
- fbgemm quantizes its input on one scale for the whole batch, which would make a row's rounding depend on its
  neighbours. Here every token is divided by its own largest magnitude first, so every value lies in [-1, 1] and
  is quantized on the same fixed grid (scale 1/127, zero point 128): the per-token symmetric 8-bit grid of the
  `torch._int_mm` path, then scaled back by the token's magnitude. The int32 accumulation is exact and fbgemm
  dequantizes element by element, so a row's output is the same bit for bit alone or in any batch (tested). The
  float32 parts of a step around it (LoRA, attention) are kept batch-independent to the bit too (`invariant`):
  int8 rounding amplified their last-bit differences into another token in 1 of 96 requests before.
- AVX2 has no int8 dot product: fbgemm multiplies unsigned activations by signed weights pairwise into int16
  (`vpmaddubsw`), which saturates when both products of a pair are large (255 · 127 · 2 > 32,767: a row of ones
  came back 3.0 instead of 384). The weights are therefore quantized to ±63 (7 bits, one scale per output row):
  2 · 255 · 63 fits. Measured on a 384→1152 layer with an outlier input channel, relative error against float32:
  this grid 0.033, the `torch._int_mm` path's 8-bit grid 0.031, 8-bit weights here 0.044 (saturated), 7-bit
  activations with 8-bit weights instead 0.062.

fbgemm keeps its weights prepacked in a C++ object that neither `torch.export` nor AOTInductor can hold, so the GEMM
is a custom operator, `hmt::fbgemm_linear(x, handle)`: the handle is the layer's row scales (a float32 tensor
[out]), whose storage identifies the packed weight in this module's table and whose length gives the output
width. The compiled decode step calls it like an aten op (through AOTInductor's proxy executor), and inductor fuses
the normalisation before it and the rescale after it into the neighbouring loops. Where our CPU kernels build
(`kernels`), the step calls `hmt_cpu::fbgemm_linear` instead: the same fbgemm call made from C++, its table kept in
step with this one, without the round trip through Python at every layer (`linear_op`).

The slot layers' LoRA stays float32 on top of these bases (`lora.grouped`, float path): fbgemm's packed weight
cannot take appended A columns as the `torch._int_mm` path's widened weight does.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from typing import Any, NamedTuple

import torch

from .. import kernels
from .layer import Int8Layer, stacked_bias, symmetric

#: The largest weight magnitude on the grid: 7 bits, so AVX2's pairwise int16 products cannot saturate.
_WEIGHT_LEVELS = 63.0

#: The activations' fixed grid after each token is scaled into [-1, 1]: 8-bit unsigned, symmetric about 128.
_X_SCALE = 1.0 / 127.0
_X_ZERO = 128

#: Packed weights by the storage of their handle (the layer's scale tensor): (a weak reference to the handle, the
#: packed weight). An entry goes when its handle is freed, so a later tensor at the same address finds nothing.
_TABLE: dict[int, tuple[Any, Any]] = {}
_TABLE_LOCK = threading.Lock()


def available() -> bool:
    """Whether this torch build has fbgemm's quantized engine (x86 builds do)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


#: The C++ op (`kernels.fbgemm_linear`) once its table holds every packed weight of `_TABLE`; False where the
#: kernels are not built (or switched off); None until the first `linear_op()` decides.
_NATIVE: Any = None


class FbgemmBase(NamedTuple):
    """A `dense.Projection`'s base when its weights are fbgemm's: the handle (the row scales), the bias, and the
    op that multiplies (`linear_op()`: which one is part of a compiled package's key)."""

    handle: torch.Tensor
    bias: torch.Tensor | None
    op: Any


def _forget(key: int) -> None:
    with _TABLE_LOCK:
        _TABLE.pop(key, None)
        if _NATIVE:
            torch.ops.hmt_cpu.fbgemm_forget(key)


def _register(handle: torch.Tensor, packed: Any) -> None:
    key = handle.data_ptr()
    with _TABLE_LOCK:
        _TABLE[key] = (weakref.ref(handle), packed)
        if _NATIVE:
            torch.ops.hmt_cpu.fbgemm_register(handle, packed)
    weakref.finalize(handle, _forget, key)


def linear_op() -> Any:
    """The op a layer multiplies with, `op(x, handle)`: `hmt_cpu::fbgemm_linear` (C++) where our CPU kernels are
    built, else `hmt::fbgemm_linear` (Python). Both make the same fbgemm call, so the results are the same bits; the
    C++ one saves a round trip through Python per layer (at one row a quarter of a compiled step)."""
    global _NATIVE
    if _NATIVE is None:
        native = kernels.fbgemm_linear() or False  # built or loaded outside the table's lock (~25 s the first time)
        if not native and kernels.state() == "deferred":
            # Built by another process meanwhile (prebuild.py): the Python op serves until they are activated.
            return torch.ops.hmt.fbgemm_linear
        with _TABLE_LOCK:
            if _NATIVE is None:
                if native:
                    for ref, packed in _TABLE.values():
                        handle = ref()
                        if handle is not None:
                            torch.ops.hmt_cpu.fbgemm_register(handle, packed)
                _NATIVE = native
    return _NATIVE or torch.ops.hmt.fbgemm_linear


def _packed(handle: torch.Tensor) -> Any:
    found = _TABLE.get(handle.data_ptr())
    if found is None or found[0]() is None:
        raise RuntimeError("hmt::fbgemm_linear: no packed weight for this handle (not made by FbgemmLinear)")
    return found[1]


_LIB = torch.library.Library("hmt", "DEF")
_LIB.define("fbgemm_linear(Tensor x, Tensor handle) -> Tensor")


_LINEAR = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32.default


def _fbgemm_linear_cpu(x: torch.Tensor, handle: torch.Tensor) -> torch.Tensor:
    # x: [N, in], every value in [-1, 1] (fbgemm_linear scales each token so); the result is dequantized float32.
    # With __torch_function__ on, torch looks the attribute up on every argument, and on the packed weight (a
    # TorchScript object) that lookup throws and catches a C++ exception: 23 → 13 µs a call for a small GEMM
    # (perf: a third of the call in the unwinder). Nothing here is a tensor subclass.
    with torch._C.DisableTorchFunction():
        return _LINEAR(x, _X_SCALE, _X_ZERO, _packed(handle))


# A plain kernel registration (not torch.library.custom_op, whose Python wrapper cost ~45 µs a call here against
# ~8 µs): the op has no autograd, it serves inference only.
_LIB.impl("fbgemm_linear", _fbgemm_linear_cpu, "CPU")


@torch.library.register_fake("hmt::fbgemm_linear")
def _fbgemm_linear_fake(x: torch.Tensor, handle: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], handle.shape[0])


def fbgemm_linear(x: torch.Tensor, handle: torch.Tensor, bias: torch.Tensor | None, op: Any = None) -> torch.Tensor:
    """x [N, in] (float32) @ the layer's int8 weightᵀ + bias, each token quantized on its own scale (see the module
    docstring), multiplied by `op` (`linear_op()` unless given). Plain tensor operations around the custom op: the
    lean decode step runs this eagerly or compiled."""
    step = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-30)
    y = (op or linear_op())(x / step, handle) * step
    return y if bias is None else y + bias


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-row symmetric int8 on the ±63 grid: (int8 weight [out, in], float32 scale per row [out])."""
    q, scale = symmetric(weight.detach().to(torch.float32), 1, _WEIGHT_LEVELS)
    return q, scale.contiguous()


def _pack(q: torch.Tensor, scale: torch.Tensor) -> Any:
    """fbgemm's packed weight for int8 rows `q` [out, in] with row scales `scale` (no bias: it is added after the
    rescale)."""
    with warnings.catch_warnings():
        # The quantized-tensor constructors warn that they are deprecated; fbgemm's packing takes nothing else.
        warnings.simplefilter("ignore", UserWarning)
        qw = torch._make_per_channel_quantized_tensor(q, scale.to(torch.float64), torch.zeros(q.shape[0],
                                                      dtype=torch.long), 0)
        return torch.ops.quantized.linear_prepack(qw, None)


class FbgemmLinear(Int8Layer):
    """A linear layer with int8 weights (per-row scales, ±63) multiplied by fbgemm, and a float32 bias, on the
    CPU. The int8 weight lives only in fbgemm's packed form."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        """`q` [out, in] int8 on the ±63 grid and its row `scale` [out] (`quantize_rows`)."""
        super().__init__()
        self.out_features, self.in_features = int(q.shape[0]), int(q.shape[1])
        # Buffers follow the module like the float weights did, and are never saved with the model. The scales are
        # the packed weight's handle, so each layer gets storage of its own (never a view of another's).
        self.register_buffer("scale", scale.to(torch.float32).contiguous().clone(), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.float32).contiguous(),
                             persistent=False)
        self._packed = _pack(q, self.scale)
        _register(self.scale, self._packed)

    def _apply(self, fn: Any, recurse: bool = True) -> "FbgemmLinear":
        # .to() and friends may replace the scale tensor: the packed weight follows its new handle. A move that
        # keeps the tensor (.to() onto where it is) registers nothing, so a handle carries one finalizer.
        before = self.scale
        super()._apply(fn, recurse)
        if self.scale is not before:
            _register(self.scale, self._packed)
        return self

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> "FbgemmLinear":
        return cls(*quantize_rows(weight), bias)

    @classmethod
    def stacked(cls, layers: "list[FbgemmLinear]") -> "FbgemmLinear":
        """One layer computing `layers` side by side (Q, K and V in one GEMM): their int8 rows and scales as they
        are, so the fused layer computes exactly what each computes."""
        return cls(torch.cat([layer.int8_rows() for layer in layers]), torch.cat([layer.scale for layer in layers]),
                   stacked_bias([(layer.bias, layer.out_features) for layer in layers]))

    def int8_rows(self) -> torch.Tensor:
        """The int8 weight [out, in] (unpacked from fbgemm's copy)."""
        weight, _ = torch.ops.quantized.linear_unpack(self._packed)
        return weight.int_repr()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return fbgemm_linear(x, self.scale, self.bias)

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.int8_rows().to(torch.float32) * self.scale[:, None], self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-row scales (fbgemm)"
