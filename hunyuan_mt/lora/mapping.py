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
        #: (slots used, rank, device, dtype) → the one-hot table `column_mask` indexes.
        self._tables: dict[tuple[Any, ...], torch.Tensor] = {}
        #: Changes whenever the rows' slots or the weights in the slots change. Layers keep the per-row weights
        #: they gathered for one version: a decode loop whose rows stay put gathers once, not at every step.
        self.version = 0
        #: Writes per slot (`invalidate(slot)`), not changed when rows come and go: what is stacked from the slots'
        #: weights alone (lora.GroupedLoRA) is kept across admissions and across writes to other slots (a 3-slot
        #: LRU under many pairs writes a slot at nearly every admission).
        self.writes: dict[int, int] = {}
        self._all_writes = 0
        #: What each slot holds, where its writer names it (`SlotLoRA.load`: the adapter's serial). What is derived
        #: from one adapter's weights alone (GroupedLoRA's int8 pieces) is kept by this name, so an adapter that
        #: comes back, into any slot, is not quantized again: under 16 clients over 20 routes, quantizing at each
        #: of the 3-slot LRU's writes took 12 % of the decode thread (py-spy).
        self.holds: dict[int, Any] = {}
        #: (version, `in_use()`): every grouped LoRA term of a forward asks for the same answer.
        self._in_use: tuple[int, tuple[tuple[int, ...], tuple[Any, ...]]] | None = None
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
            self.holds.clear()
        else:
            self.writes[slot] = self.writes.get(slot, 0) + 1
            self.holds.pop(slot, None)

    def hold(self, slot: int, name: Any) -> None:
        """The writer of `slot` names what it now holds (see `holds`)."""
        self.holds[slot] = name
        self.version += 1

    def in_use(self) -> tuple[tuple[int, ...], tuple[Any, ...]]:
        """The slots the rows read, sorted (the bare backbone's left out unless every row is on it), and what each
        holds (`content`). Kept per version: after a change of the rows every grouped term of the next forward
        asks, and working it out each time cost a few microseconds a term."""
        memo = self._in_use
        if memo is not None and memo[0] == self.version:
            return memo[1]
        used = (self.uniform,) if self.uniform is not None else tuple(sorted(set(self._slots) - {BASE_SLOT}))
        found = (used, tuple(self.content(s) for s in used))
        self._in_use = (self.version, found)
        return found

    def written(self, slot: int) -> tuple[int, int]:
        """A token that changes whenever `slot`'s weights may have changed."""
        return self.writes.get(slot, 0), self._all_writes

    def content(self, slot: int) -> Any:
        """A name for what `slot` holds: the writer's name for it (`holds`), else a token that changes whenever its
        weights may have changed."""
        found = self.holds.get(slot)
        return found if found is not None else ("slot", slot, self.written(slot))

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
        # Two tensor calls, not six: the decode loop builds a mask whenever its rows change (under many clients
        # nearly every step), and each call gives the GIL up to whatever else runs (measured in BENCHMARKS.md,
        # 2026-12-02). A row indexes a table whose row u has ones in slot u's columns; the last row, zeros,
        # serves rows on no slot in `used` and the padding.
        position = {slot: i for i, slot in enumerate(used)}
        rows = [position.get(s, len(used)) for s in self._slots for _ in range(per_row)] + [len(used)] * padding
        mask = self._table(len(used), rank, device, dtype)[torch.tensor(rows, device=device)]
        self._mask = (key, mask)
        return mask

    def _table(self, used: int, rank: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """[used + 1, used × rank]: row u is 1 on the columns u·rank … (u+1)·rank − 1; the last row is 0."""
        key = (used, rank, device, dtype)
        found = self._tables.get(key)
        if found is None:
            found = self._tables[key] = torch.cat([torch.eye(used, device=device, dtype=dtype)
                                                   .repeat_interleave(rank, dim=1),
                                                   torch.zeros(1, used * rank, device=device, dtype=dtype)])
        return found

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
