"""Float GEMMs whose result for a row does not depend on the rows and columns beside it (invariant 5, to the bit).

A row of a running batch shares its GEMMs with whatever else is running, so the matrices' shapes follow the
batch: how many rows (tokens), how many LoRA columns (the adapters in use), how many key columns (the longest
source, the oldest history). MKL and oneDNN pick their code by shape: a row or column that falls in a partial
tile at the edge of the matrix is computed by another kernel, which sums in another order and rounds differently.
That is a last-bit difference; the int8 step (the CPU default) rounds each activation to 8 bits, so it moved whole
logits (by up to 0.15) and changed 1 to 2 of 160 translations (`python -m bench.invariance`).

Measured on the 2-core AVX2 box, a row's result alone against beside others (300 random cases each, a script,
2026-12-02; tests/test_batch_invariance.py checks the padded forms):
- `x @ A` (LoRA's A side): 152–194 differed; 0 with the rows padded to a multiple of `ROWS` and the columns to a
  multiple of `COLUMNS` (rows alone were not enough where a slot's columns were 8 wide: 266 differed).
- `y += h @ B` (LoRA's B side, h zero outside the row's slot): 177–183 differed; 0 with the rows padded.
- The attention scores `q @ kᵀ` over a wider key matrix: 193 differed; 0 over whole blocks of `COLUMNS` keys,
  wherever the row's columns sit among them.
- The attention's softmax: 27 differed in float32, 0 summed in float64 (decode/marian.py `_attend`).
- The attention's `p @ v` over zero-padded columns: 0 differed as it was.
- `F.linear` over float32 weights as they are (MKL): a frozen compiled step's eager prefill of two decoder tokens
  gave a row other logits beside a second row (tests/test_compiled_step.py); padded rows: the same bits.

Padding costs a copy of the (small) operands, made only when they are not whole already (in a compiled graph, where
the sizes are symbolic, the pad is always there; inductor fuses it into the loop that produces the operand).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

#: Rows of a GEMM operand are padded to a multiple of this.
ROWS = 8
#: Columns (GEMM outputs, attention keys) are padded to a multiple of this.
COLUMNS = 16


def round_up(n: Any, multiple: int) -> Any:
    """`n` rounded up to a multiple (a SymInt in a compiled graph stays one)."""
    return (n + multiple - 1) // multiple * multiple


def padded(t: torch.Tensor, dim: int, multiple: int, value: float = 0.0) -> torch.Tensor:
    """`t` padded with `value` at the end of `dim` (negative) to a multiple of `multiple`."""
    extra = round_up(t.shape[dim], multiple) - t.shape[dim]
    if isinstance(extra, int) and not extra:
        return t  # eager and already whole (in a compiled graph a dynamic size is a SymInt: always the pad)
    return F.pad(t, (0, 0) * (-1 - dim) + (0, extra), value=value)


def mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [N, k] @ w [k, m], each row's result independent of N (w's columns: a multiple of `COLUMNS`, or
    padded by the caller once)."""
    n = x.shape[0]
    return torch.mm(padded(x, -2, ROWS), w)[:n]


def bmm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [P, N, k] @ w [P, k, m], each row's result independent of N."""
    n = x.shape[1]
    return torch.bmm(padded(x, -2, ROWS), w)[:, :n]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear with each row's result independent of the rows beside it, where that needs padding: float32 on the
    CPU outside a compiled graph (MKL; the unpacked weights a frozen compiled step leaves its eager calls, e.g. a
    prefill of several decoder tokens). A compiled graph packs the weight for oneDNN, whose rows are independent
    as they are; other devices and dtypes run F.linear as it is."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or torch.compiler.is_compiling():
        return F.linear(x, weight, bias)
    n = x.shape[0]
    return F.linear(padded(x, -2, ROWS), weight, bias)[:n]
