"""`GroupedLoRA`: the LoRA term of several slot layers that read the same input (Q, K and V), in one pass.

The lean decode step (`decode/marian.py`) runs a fused base projection (one GEMM for Q, K and V) and adds this on
top. With U distinct adapter slots among the rows and P projections in the group, the rows' A matrices are laid
side by side, `A = [A(p, u)]` of shape [in, P·U·r] (columns ordered projection, slot, rank), and each projection p
has `B_p = [B(p, u)]` stacked [U·r, out]:

    h = x @ A                      one GEMM for every slot and projection
    h_p *= mask                    each row keeps the columns of its own slot (mixed batches only; one mask
                                   [tokens, U·r] per forward, shared by every projection: `SlotMapping.column_mask`)
    y_p += h_p @ B_p               one bmm over the projections

A row on the bare backbone keeps no column, so it gets exactly the base output. Compared with gathering per-row
copies of A and B (`SlotLinear`'s bmm path, which reads every row's own matrices at every step), this reads each
slot's weights once per step and runs plain GEMMs; the price is U times the (small) LoRA arithmetic for every row,
measured in BENCHMARKS.md. All rows on one slot is the same with U = 1 and no mask; all on the bare backbone adds
nothing.

`GroupedLoRA.tensors` builds (A, B, mask) and `apply_lora` does the arithmetic: a pure function of tensors, so the
compiled decode step (`decode/compiled.py`) runs the same code. That step asks for `complete` tensors: a mask
even when every row is on one slot, and the bare backbone's zero slot when every row is on it, so that one
compiled graph serves every mix (a mask of ones and a zero product change no bit of the result).

The stacked matrices are rebuilt when the slot mapping's version changes (rows joined or left, a slot was written),
which is what `SlotLinear` keys its gathers on too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .mapping import BASE_SLOT, SlotMapping
from .slots import SlotLinear

#: (A [in, P·U·r], B [P, U·r, out] or [U·r, out] when P = 1, mask [tokens, U·r] or None, layout).
LoRATensors = tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None", tuple[tuple[int, int], ...]]


@dataclass
class _Stacked:
    key: tuple[int, int, int, bool, int]
    tensors: LoRATensors | None


class GroupedLoRA:
    """The LoRA term of `layers` (SlotLinear or None where a projection has no slot layer), added to the fused
    output of their base projections, whose widths are `widths`."""

    def __init__(self, layers: Sequence[SlotLinear | None], widths: Sequence[int], mapping: SlotMapping) -> None:
        self.layers = list(layers)
        self.widths = list(widths)
        self.mapping = mapping
        self.present = [i for i, layer in enumerate(self.layers) if layer is not None]
        #: (output offset, width) of each projection that has a slot layer, in the group's output.
        self.layout = tuple((sum(self.widths[:i]), self.widths[i]) for i in self.present)
        self._state: _Stacked | None = None

    def add_to(self, x: torch.Tensor, y: torch.Tensor, tokens_per_row: int = 1) -> torch.Tensor:
        """y [N, Σwidths] += LoRA(x [N, in]); N is rows × tokens_per_row, rows in the mapping's order."""
        tensors = self.tensors(x.shape[0], tokens_per_row, x.device)
        return y if tensors is None else apply_lora(x, y, tensors)

    def tensors(self, tokens: int, per_row: int, device: torch.device, complete: bool = False,
                padding: int = 0) -> LoRATensors | None:
        """What `apply_lora` takes for the mapping's rows, or None when there is nothing to add (unless
        `complete`: see the module docstring). `padding` rows of zeros follow the mapping's rows in the mask (the
        compiled step's padding rows)."""
        if not self.present:
            return None
        mapping = self.mapping
        if mapping.uniform == BASE_SLOT and not complete:
            return None
        key = (mapping.version, tokens, mapping.structure, complete, padding)
        st = self._state
        if st is None or st.key != key:
            st = self._state = _Stacked(key, self._stack(per_row, device, complete, padding))
        return st.tensors

    def _stack(self, per_row: int, device: torch.device, complete: bool, padding: int) -> LoRATensors:
        mapping = self.mapping
        layers = [self.layers[i] for i in self.present]
        rank = layers[0].rank
        used = [mapping.uniform] if mapping.uniform is not None else sorted(set(mapping.slots) - {BASE_SLOT})
        a = torch.cat([layer.a_t[s] for layer in layers for s in used], dim=1)
        if len(layers) == 1:
            b = torch.cat([layers[0].b_t[s] for s in used], dim=0)
        else:
            b = torch.stack([torch.cat([layer.b_t[s] for s in used], dim=0) for layer in layers])
        mask = None
        if mapping.uniform is None or complete:
            mask = mapping.column_mask(used, rank, per_row, padding, device, a.dtype)
        return a.contiguous(), b.contiguous(), mask, self.layout


def apply_lora(x: torch.Tensor, y: torch.Tensor, tensors: LoRATensors) -> torch.Tensor:
    """y [N, out] += the LoRA term of x [N, in] (in place; returns y)."""
    a, b, mask, layout = tensors
    h = torch.mm(x, a)
    if len(layout) == 1:
        if mask is not None:
            h = h * mask
        offset, width = layout[0]
        y[:, offset:offset + width].addmm_(h, b)
        return y
    n, p = x.shape[0], len(layout)
    hp = h.view(n, p, -1)
    if mask is not None:
        hp = hp * mask[:, None, :]
    delta = torch.bmm(hp.transpose(0, 1), b)  # [P, N, out]
    width = layout[0][1]
    if all(w == width for _, w in layout) and layout[-1][0] + width == y.shape[1] and p * width == y.shape[1]:
        y.view(n, p, width).add_(delta.transpose(0, 1))
    else:
        for j, (offset, w) in enumerate(layout):
            y[:, offset:offset + w].add_(delta[j])
    return y
