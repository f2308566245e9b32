"""int8 weights on the CPU: every `nn.Linear` of the backbone becomes an `Int8Linear` (`model.quantization: int8`).

The weights are quantized once, at load, symmetrically with one scale per output row, and packed for torch's own
dynamic int8 GEMM (fbgemm/onednn, `torch.ops.quantized.linear_dynamic`): activations are quantized per call, the
product accumulates in int32 and comes back as float32 with the bias added. On the 2-core x86 box this ran the
demo's projections 3.5-7x faster than fp32 `F.linear` (384x1152 at 32 rows: 64 vs 244 µs; the 384x8012 output
projection: 330 vs 2413 µs). torchao's int8 paths and `torch._weight_int8pack_mm` were measured too: the latter
is weight-only and ran 30-40x slower than fp32 here; torchao would be one more dependency for the same kernels.

LoRA stays in float32 on top: the slot layers add B·A·x to this module's output, so any mix of adapters still
shares one batch. Only the base weights change precision.
"""

from __future__ import annotations

import logging
import warnings
from typing import Iterable

import torch
from torch import nn

log = logging.getLogger(__name__)


def _quantize_rows(weight: torch.Tensor) -> torch.Tensor:
    """Per-output-row symmetric int8 (a qint8 tensor, as linear_prepack takes it)."""
    w = weight.detach().to(torch.float32).contiguous()
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12).to(torch.float64)
    zero = torch.zeros(w.shape[0], dtype=torch.long)
    with warnings.catch_warnings():
        # torch marks quantized tensor creation deprecated (the packed GEMM itself is not); the packed weight is
        # all this module keeps.
        warnings.simplefilter("ignore", UserWarning)
        return torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)


class Int8Linear(nn.Module):
    """A linear layer with int8 weights (per-row scales) and a float32 bias, on the CPU."""

    #: BackboneSpec and the slot layers read shapes from these, as from nn.Linear.
    in_features: int
    out_features: int

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = int(weight.shape[0]), int(weight.shape[1])
        b = None if bias is None else bias.detach().to(torch.float32).contiguous()
        self._packed = torch.ops.quantized.linear_prepack(_quantize_rows(weight), b)

    @classmethod
    def from_linear(cls, linear: nn.Module) -> "Int8Linear":
        return cls(linear.weight, getattr(linear, "bias", None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch.ops.quantized.linear_dynamic(x.reshape(-1, shape[-1]).to(torch.float32), self._packed, True)
        return y.view(*shape[:-1], self.out_features)

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(float32 weight [out, in], bias): what fusing several layers into one starts from."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            qweight, bias = torch.ops.quantized.linear_unpack(self._packed)
            return qweight.dequantize(), bias

    @property
    def nbytes(self) -> int:
        return self.out_features * self.in_features + 8 * self.out_features

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-row scales"


def available() -> bool:
    """Whether this torch build has the packed int8 GEMM (x86 fbgemm/onednn or ARM qnnpack)."""
    engines = set(torch.backends.quantized.supported_engines) - {"none"}
    return bool(engines) and hasattr(torch.ops.quantized, "linear_dynamic")


def weight_and_bias(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A linear layer's float32 weight and bias, whether it is nn.Linear or Int8Linear."""
    if isinstance(module, Int8Linear):
        return module.dequantized()
    return module.weight.detach().to(torch.float32), (None if module.bias is None else module.bias.detach())


def quantize_linears(model: nn.Module, skip: Iterable[str] = ()) -> int:
    """Replace every nn.Linear of `model` (but the paths in `skip`) by an Int8Linear. Returns how many.

    Tied output projections (Marian's lm_head shares the token embeddings) get their own int8 copy; the
    embedding table stays float32 for look-ups.
    """
    skipped = set(skip)
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear) and name not in skipped]
    for name, linear in targets:
        parent_path, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        setattr(parent, attr, Int8Linear.from_linear(linear))
    log.info("int8 weights: %d linear layers quantized (per-row scales)", len(targets))
    return len(targets)
