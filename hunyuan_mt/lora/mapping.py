"""The row → slot index of the forward pass in flight, set once per step and read by every `SlotLinear`.

One `SlotMapping` per model. Whoever runs a forward (the decode loop, `Backbone.generate`) sets it first, under the
backbone's `model_lock`, so every layer of that forward sees the same rows. Slot 0 is the bare backbone: its
tensors stay zero, so a row on it gets exactly the base layer's output.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import torch

#: The slot of rows that use no adapter. Never written: its A and B stay zero.
BASE_SLOT = 0


class SlotMapping:
    """Per-row slot indices for the current forward, plus the two cases that need no gather."""

    def __init__(self) -> None:
        self.rows = 0
        #: The one slot every row uses, or None for a mixed batch. BASE_SLOT here skips the LoRA math entirely.
        self.uniform: int | None = BASE_SLOT
        self._slots: tuple[int, ...] = ()
        #: (rows in the forward, device) → index tensor; rebuilt after every `set`.
        self._indices: dict[tuple[int, torch.device], torch.Tensor] = {}
        #: (version, used slots, rank, tokens per row, padding, device, dtype) → `column_mask`; one entry is kept.
        self._mask: tuple[tuple[Any, ...], torch.Tensor] | None = None
        #: Changes whenever the rows' slots or the weights in the slots change. Layers keep the per-row weights
        #: they gathered for one version: a decode loop whose rows stay put gathers once, not at every step.
        self.version = 0
        #: Writes per slot (`invalidate(slot)`), not changed when rows come and go: what is stacked from the slots'
        #: weights alone (lora.GroupedLoRA) is kept across admissions and across writes to other slots (a 3-slot
        #: LRU under many pairs writes a slot at nearly every admission).
        self.writes: dict[int, int] = {}
        self._all_writes = 0
        #: Changes whenever the slot layers' buffers are reallocated or modules are wrapped (SlotLoRA.ensure):
        #: CUDA graphs captured before read the old buffers and must be captured again.
        self.structure = 0
        #: Graph mode: a static index buffer the layers read at every call (no gathered weights kept in Python).
        self.static: torch.Tensor | None = None

    def set(self, slots: Sequence[int]) -> None:
        """Rows of the next forward, in batch order: row i reads slot `slots[i]`."""
        slots = tuple(int(s) for s in slots)
        self.static = None
        if slots == self._slots:
            return
        self._slots = slots
        self.version += 1
        self.rows = len(self._slots)
        distinct = set(self._slots)
        self.uniform = next(iter(distinct)) if len(distinct) == 1 else (BASE_SLOT if not distinct else None)
        self._indices = {}

    def clear(self) -> None:
        self.set(())

    def invalidate(self, slot: int | None = None) -> None:
        """The weights in `slot` (None: any slot, e.g. the layers grew) changed: layers must gather again."""
        self.version += 1
        if slot is None:
            self._all_writes += 1
        else:
            self.writes[slot] = self.writes.get(slot, 0) + 1

    def written(self, slot: int) -> tuple[int, int]:
        """A token that changes whenever `slot`'s weights may have changed."""
        return self.writes.get(slot, 0), self._all_writes

    def set_static(self, indices: torch.Tensor) -> None:
        """Graph mode: every layer gathers from `indices` (a buffer updated in place between replays) at every
        call, so a captured graph follows whatever slots the buffer holds."""
        self.static = indices
        self.rows = indices.shape[0]
        self.uniform = None
        self._slots = ()
        self._indices = {}
        self.version += 1

    @contextlib.contextmanager
    def use(self, slots: Sequence[int]) -> Iterator[None]:
        """Set the mapping for one forward or one `generate`, and fall back to the bare backbone afterwards."""
        self.set(slots)
        try:
            yield
        finally:
            self.clear()

    @property
    def slots(self) -> tuple[int, ...]:
        return self._slots

    def column_mask(self, used: Sequence[int], rank: int, per_row: int, padding: int, device: torch.device,
                    dtype: torch.dtype) -> torch.Tensor:
        """[rows × per_row + padding, len(used) × rank]: 1 where a token's row is on the slot that owns the column
        (columns run slot by slot, `rank` each), 0 elsewhere and on padding tokens. Every grouped LoRA term of a
        forward reads the same tensor (`lora.GroupedLoRA`), built once per mapping version."""
        key = (self.version, tuple(used), rank, per_row, padding, device, dtype)
        if self._mask is not None and self._mask[0] == key:
            return self._mask[1]
        rows = torch.tensor(self._slots, device=device)
        if per_row > 1:
            rows = rows.repeat_interleave(per_row)
        if padding:
            rows = torch.cat([rows, rows.new_full((padding,), -1)])  # -1: no slot owns a column
        owner = torch.tensor(list(used), device=device).repeat_interleave(rank)
        mask = (rows[:, None] == owner[None, :]).to(dtype)
        self._mask = (key, mask)
        return mask

    def indices(self, batch: int, device: torch.device) -> torch.Tensor:
        """Slot index per row of a layer input whose first dimension is `batch`.

        `batch` may be a whole multiple of the rows: transformers' beam search repeats each row `num_beams` times
        (repeat_interleave), so row i's copies stay next to each other.
        """
        if self.static is not None:
            return self.static
        key = (batch, device)
        found = self._indices.get(key)
        if found is not None:
            return found
        if not self.rows or batch % self.rows:
            raise RuntimeError(f"slot mapping holds {self.rows} rows, but a layer saw a batch of {batch}; "
                               "set the mapping for every forward")
        idx = torch.tensor(self._slots, dtype=torch.long)
        if batch != self.rows:
            idx = idx.repeat_interleave(batch // self.rows)
        idx = idx.to(device)
        self._indices[key] = idx
        return idx
