"""`SlotLinear`: a base linear layer plus the LoRA weights of every slot, stacked.

    y = base(x) + bmm(bmm(x, A[idx]ᵀ), B[idx]ᵀ)

`A` and `B` of every slot are preallocated buffers, stored transposed (`a_t[slots, in, r]`, `b_t[slots, r, out]`)
so that gathering the rows' slots yields the layout `bmm` takes without another copy; the adapter's scaling is
folded into B when it is copied in. Adapters of a smaller rank are zero-padded to `r`, and a slot whose adapter does not target this layer
is all zeros, so one product serves any mix. Two cases skip the gather: every row on the bare backbone (the base
output, untouched) and every row on one slot (two plain matmuls).

The plain-torch reference the fast path is tested against is PEFT's own LoRA layer (tests/test_lora_slots.py).
"""

from __future__ import annotations

import torch
from torch import nn

from .mapping import BASE_SLOT, SlotMapping


class SlotLinear(nn.Module):
    """Wraps one target module. `copies`/`clear` are used only by `SlotLoRA` (for the adapter cache)."""

    def __init__(self, base: nn.Module, in_features: int, out_features: int, mapping: SlotMapping, slots: int,
                 rank: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.base = base
        self.in_features = in_features
        self.out_features = out_features
        self.mapping = mapping
        # Buffers, not parameters: they move with .to() but are never trained or saved with the model.
        self.register_buffer("a_t", torch.zeros(slots, in_features, rank, dtype=dtype, device=device),
                             persistent=False)
        self.register_buffer("b_t", torch.zeros(slots, rank, out_features, dtype=dtype, device=device),
                             persistent=False)
        #: (mapping version, batch, Aᵀ per row [B, in, r], Bᵀ per row [B, r, out]): reused while the rows and the
        #: slot weights stay the same, which is every decode step between two admissions.
        self._gathered: tuple[int, int, torch.Tensor, torch.Tensor] | None = None

    @property
    def slots(self) -> int:
        return self.a_t.shape[0]

    @property
    def rank(self) -> int:
        return self.a_t.shape[2]

    def copies(self, slot: int, a: torch.Tensor, b: torch.Tensor
               ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Copying one adapter into `slot` (a is A [r, in], b is B [out, r], r ≤ the slot rank), as
        (targets: this slot's A and B, their sources, tensors to zero): `SlotLoRA.load` runs those of every layer in one foreach call
        each, then invalidates the slot in the mapping."""
        r = a.shape[0]
        targets, sources = [self.a_t[slot, :, :r], self.b_t[slot, :r]], [a.t(), b.t()]
        zeros = [self.a_t[slot, :, r:], self.b_t[slot, r:]] if r < self.rank else []
        return targets, sources, zeros

    def clear(self, slot: int) -> None:
        self.a_t[slot].zero_()
        self.b_t[slot].zero_()

    def resize(self, slots: int, rank: int) -> None:
        """Grow to at least `slots` slots and rank `rank`, keeping what every slot holds (zero-padded)."""
        if slots <= self.slots and rank <= self.rank:
            return
        slots, rank = max(slots, self.slots), max(rank, self.rank)
        a = self.a_t.new_zeros(slots, self.in_features, rank)
        b = self.b_t.new_zeros(slots, rank, self.out_features)
        a[: self.slots, :, : self.rank] = self.a_t
        b[: self.slots, : self.rank] = self.b_t
        self.a_t, self.b_t = a, b
        self._gathered = None

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        y = self.base(x, *args, **kwargs)
        mapping = self.mapping
        uniform = mapping.uniform
        if uniform == BASE_SLOT:
            self._gathered = None
            return y
        # In the wider of the input's and the slots' dtypes: bfloat16 slots under a float32 model (cache.slot_dtype)
        # multiply in float32, a bfloat16 model's input with its own slots in bfloat16.
        compute = torch.promote_types(x.dtype, self.a_t.dtype)
        xc = x if x.dtype == compute else x.to(compute)
        if uniform is not None:
            self._gathered = None
            delta = torch.matmul(torch.matmul(xc, self.a_t[uniform].to(compute)), self.b_t[uniform].to(compute))
            return y + delta.to(y.dtype)
        batch = x.shape[0]
        if mapping.static is not None:
            # Graph mode: gather at every call, from the static index buffer (recorded once, replayed per step).
            idx = mapping.static
            x3 = xc.reshape(batch, -1, self.in_features)
            delta = torch.bmm(torch.bmm(x3, self.a_t.index_select(0, idx).to(compute)),
                              self.b_t.index_select(0, idx).to(compute))
            return y + delta.reshape(y.shape).to(y.dtype)
        gathered = self._gathered
        if gathered is None or gathered[0] != mapping.version or gathered[1] != batch:
            idx = mapping.indices(batch, x.device)
            gathered = self._gathered = (mapping.version, batch, self.a_t.index_select(0, idx).to(compute),
                                         self.b_t.index_select(0, idx).to(compute))
        x3 = xc.reshape(batch, -1, self.in_features)
        delta = torch.bmm(torch.bmm(x3, gathered[2]), gathered[3])
        return y + delta.reshape(y.shape).to(y.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, slots={self.slots}, rank={self.rank}"
