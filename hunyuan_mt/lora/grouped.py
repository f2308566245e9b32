"""`GroupedLoRA`: the LoRA term of several slot layers that read the same input (Q, K and V), in one pass.

The lean decode step (`decode/marian.py`) runs a fused base projection (one GEMM for Q, K and V) and adds this on
top. With U distinct adapter slots among the rows and P projections in the group, the rows' A matrices are laid
side by side, `A = [A(u, p)]` of shape [in, U·P·r], and each projection p has `B_p = [B(u, p)]` stacked [U·r, out]:

    h = x @ A                      one GEMM for every slot and projection
    h *= mask                      each row keeps the columns of its own slot (mixed batches only)
    y_p += h_p @ B_p               one bmm over the projections

A row on the bare backbone keeps no column, so it gets exactly the base output. Compared with gathering per-row
copies of A and B (`SlotLinear`'s bmm path, which reads every row's own matrices at every step), this reads each
slot's weights once per step and runs plain GEMMs; the price is U times the (small) LoRA arithmetic for every row,
measured in BENCHMARKS.md. All rows on one slot is the same with U = 1 and no mask; all on the bare backbone adds
nothing.

The stacked matrices are rebuilt when the slot mapping's version changes (rows joined or left, a slot was written),
which is what `SlotLinear` keys its gathers on too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .mapping import BASE_SLOT, SlotMapping
from .slots import SlotLinear


@dataclass
class _Stacked:
    key: tuple[int, int, int]
    a: torch.Tensor                 # [in, U·P·r]
    b: torch.Tensor                 # [P, U·r, out] (P > 1) or [U·r, out]
    mask: torch.Tensor | None       # [tokens, U·P·r] for a mixed batch


class GroupedLoRA:
    """The LoRA term of `layers` (SlotLinear or None where a projection has no slot layer), added to the fused
    output of their base projections, whose widths are `widths`."""

    def __init__(self, layers: Sequence[SlotLinear | None], widths: Sequence[int], mapping: SlotMapping) -> None:
        self.layers = list(layers)
        self.widths = list(widths)
        self.mapping = mapping
        self.present = [i for i, layer in enumerate(self.layers) if layer is not None]
        self._state: _Stacked | None = None

    def add_to(self, x: torch.Tensor, y: torch.Tensor, tokens_per_row: int = 1) -> torch.Tensor:
        """y [N, Σwidths] += LoRA(x [N, in]); N is rows × tokens_per_row, rows in the mapping's order."""
        if not self.present or self.mapping.uniform == BASE_SLOT:
            return y
        st = self._stacked(x.shape[0], tokens_per_row, x.device)
        h = torch.mm(x, st.a)
        if st.mask is not None:
            h.mul_(st.mask)
        if len(self.present) == 1:
            i = self.present[0]
            offset = sum(self.widths[:i])
            y[:, offset:offset + self.widths[i]].addmm_(h, st.b)
            return y
        n, p = x.shape[0], len(self.present)
        r = self.layers[self.present[0]].rank
        u = h.shape[1] // (p * r)
        hp = h.view(n, u, p, r).permute(2, 0, 1, 3).reshape(p, n, u * r)
        delta = torch.bmm(hp, st.b)  # [P, N, out]
        if len(self.present) == len(self.layers) and len(set(self.widths)) == 1:
            y.view(n, p, self.widths[0]).add_(delta.transpose(0, 1))
        else:
            for j, i in enumerate(self.present):
                offset = sum(self.widths[:i])
                y[:, offset:offset + self.widths[i]].add_(delta[j])
        return y

    def _stacked(self, tokens: int, per_row: int, device: torch.device) -> _Stacked:
        mapping = self.mapping
        key = (mapping.version, tokens, mapping.structure)
        st = self._state
        if st is not None and st.key == key:
            return st
        layers = [self.layers[i] for i in self.present]
        if mapping.uniform is not None:
            used = [mapping.uniform]
        else:
            used = sorted({s for s in mapping.slots if s != BASE_SLOT})
        # [in, U·P·r], columns ordered (slot, projection, rank)
        a = torch.cat([layer.a_t[s] for s in used for layer in layers], dim=1)
        if len(layers) == 1:
            b = torch.cat([layers[0].b_t[s] for s in used], dim=0)
        else:
            b = torch.stack([torch.cat([layer.b_t[s] for s in used], dim=0) for layer in layers])
        mask = None
        if mapping.uniform is None:
            width = len(layers) * layers[0].rank
            rows = torch.tensor(mapping.slots, device=device)
            if per_row > 1:
                rows = rows.repeat_interleave(per_row)
            owner = torch.tensor(used, device=device).repeat_interleave(width)  # slot of each column
            mask = (rows[:, None] == owner[None, :]).to(a.dtype)
        st = self._state = _Stacked(key, a.contiguous(), b.contiguous(), mask)
        return st
