"""`SlotLoRA`: wraps a plain transformers model's target linears once, then attaching an adapter is a slot copy.

The adapter cache owns the one `SlotLoRA` of a backbone (it decides which slot holds which adapter); the decode
loop only sets `mapping`. Wrapping happens at start for the union of the modules the registered adapters target,
with the largest rank they use; an adapter registered later that targets more modules or a larger rank grows the
layers once (`ensure`, between forward passes, under the backbone's model lock).

Attaching (`load`) copies each module's A and B·scale into the slot's row of the stacked buffers and zeroes the
layers the adapter does not target: no module surgery, no walk over the model. `prepare` does the per-adapter work
once (scaling, dtype, pinned host memory on CUDA), so a RAM-tier re-attach is only the copies.
"""

from __future__ import annotations

import logging
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch
from torch import nn

from .peft_format import AdapterWeights, lora_modules, lora_scale
from .mapping import BASE_SLOT, SlotMapping
from .slots import SlotLinear

log = logging.getLogger(__name__)

_SERIALS = itertools.count(1)


@dataclass(frozen=True)
class PreparedAdapter:
    """An adapter ready for slot copies: module path → (A [r, in], B [out, r]), and the factor each B still needs
    in the slot (`scales`; a module not in it was scaled already)."""

    key: str
    tensors: dict[str, tuple[torch.Tensor, torch.Tensor]]
    #: Largest rank over its modules.
    rank: int
    #: Names these weights (unique in the process): what is derived from them is kept under it (SlotMapping.holds).
    serial: int = field(default_factory=lambda: next(_SERIALS), compare=False)
    #: Module path → the LoRA scale B is multiplied by as it goes into a slot.
    scales: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def modules(self) -> set[str]:
        return set(self.tensors)

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.tensors.values())


def prepare(weights: AdapterWeights, dtype: torch.dtype, pin: bool = False) -> PreparedAdapter:
    """An adapter made ready for slot copies, once.

    Float32 slots on the CPU take A and B as they were read (the safetensors file's own pages, in the file's dtype):
    the copy converts them and B is scaled in the slot, in float32 as it would have been here, so the slots hold
    the same numbers and the copy kept for re-attaching is pages the kernel can take back from this process
    (`heap.release_file_pages`) instead of a second float32 adapter. bfloat16 slots on the CPU (`cache.slot_dtype`)
    take them as read too, so that halving the slots is not undone by a prepared copy: B is rounded to bfloat16 by
    the copy and scaled there, one more rounding where the scale is not a power of two (LoRA's alpha / r usually
    is). Other slots get A and B·scale converted to their dtype here (the scaling in float32 first), in page-locked
    memory with `pin` (fast, async copies to a GPU)."""
    tensors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    scales: dict[str, float] = {}
    as_read = dtype in (torch.float32, torch.bfloat16) and not pin
    for module, (a, b) in lora_modules(weights.state_dict).items():
        scale = lora_scale(weights.config, module)
        if as_read and a.device.type == "cpu" and b.device.type == "cpu":
            tensors[module] = (a, b)
            scales[module] = scale
            continue
        a = a.to(dtype=dtype).contiguous()
        b = (b.to(torch.float32) * scale).to(dtype=dtype).contiguous()
        if pin:
            a, b = a.pin_memory(), b.pin_memory()
        tensors[module] = (a, b)
    rank = max((a.shape[0] for a, _ in tensors.values()), default=0)
    return PreparedAdapter(weights.pair.key, tensors, rank, scales=scales)


def _parent(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    parent_path, _, name = path.rpartition(".")
    return (model.get_submodule(parent_path) if parent_path else model), name


class SlotLoRA:
    """The slot layers of one model. Slot 0 is the bare backbone; adapters live in slots 1..capacity."""

    def __init__(self, model: nn.Module, shapes: dict[str, tuple[int, int]], dtype: torch.dtype) -> None:
        """`shapes` is the backbone's module path → (out_features, in_features) (BackboneSpec.shapes)."""
        self.model = model
        self.shapes = shapes
        self.dtype = dtype
        self.mapping = SlotMapping()
        self.layers: dict[str, SlotLinear] = {}
        self.capacity = 0
        self.rank = 0
        #: Per slot, the modules holding non-zero weights (what a later `load` or `clear` must zero).
        self._written: list[set[str]] = [set()]

    # ------------------------------------------------------------------ structure

    def ensure(self, modules: Iterable[str], rank: int, capacity: int) -> bool:
        """Wrap every module of `modules` not wrapped yet, and grow all layers to `rank` and `capacity` adapter
        slots. Existing slots keep their contents. Returns whether anything changed. Call between forwards."""
        wanted = [m for m in dict.fromkeys(modules) if m not in self.layers]
        unknown = [m for m in wanted if m not in self.shapes]
        if unknown:
            raise ValueError(f"module {unknown[0]!r} is not a linear layer of this backbone")
        rank, capacity = max(rank, self.rank), max(capacity, self.capacity)
        grew = rank > self.rank or capacity > self.capacity
        if grew:
            for layer in self.layers.values():
                layer.resize(capacity + 1, rank)
        for path in wanted:
            parent, name = _parent(self.model, path)
            base = getattr(parent, name)
            out_f, in_f = self.shapes[path]
            weight = getattr(base, "weight", None)
            device = weight.device if isinstance(weight, torch.Tensor) else torch.device("cpu")
            layer = SlotLinear(base, in_f, out_f, self.mapping, capacity + 1, rank, self.dtype, device)
            setattr(parent, name, layer)
            self.layers[path] = layer
        if grew or wanted:
            self.mapping.invalidate()
            self.mapping.structure += 1
            self.rank, self.capacity = rank, capacity
            self._written += [set() for _ in range(capacity + 1 - len(self._written))]
            log.debug("slot LoRA: %d layers, %d slots, rank %d", len(self.layers), capacity, rank)
        return bool(grew or wanted)

    def remove(self) -> None:
        """Put the original modules back (the model is then the plain backbone again)."""
        for path, layer in self.layers.items():
            parent, name = _parent(self.model, path)
            setattr(parent, name, layer.base)
        self.layers.clear()
        self.capacity = self.rank = 0
        self._written = [set()]
        self.mapping.clear()
        #: Set once the layers are gone: whoever still holds this object must not run rows on the model.
        self.removed = True

    # ------------------------------------------------------------------ slots

    def fits(self, adapter: PreparedAdapter) -> bool:
        """Whether `adapter` can be copied in without growing the layers."""
        return adapter.rank <= self.rank and adapter.modules <= self.layers.keys()

    def load(self, slot: int, adapter: PreparedAdapter) -> None:
        """Copy `adapter` into `slot` (1..capacity). The layers must fit it (`fits`, else `ensure` first)."""
        self._check(slot)
        if not self.fits(adapter):
            raise ValueError(f"adapter {adapter.key} (rank {adapter.rank}) does not fit the slot layers "
                             f"(rank {self.rank}); call ensure() first")
        stale = self._written[slot] - adapter.modules
        # Counted before the copies: a copy that fails halfway still leaves its layers to be zeroed later.
        self._written[slot] |= adapter.modules
        self.mapping.invalidate(slot)
        targets: list[torch.Tensor] = []
        sources: list[torch.Tensor] = []
        zeros: list[torch.Tensor] = []
        scaled: list[torch.Tensor] = []
        factors: list[float] = []
        for path, (a, b) in adapter.tensors.items():
            t, s, z = self.layers[path].copies(slot, a, b)
            targets += t
            sources += s
            zeros += z
            if path in adapter.scales:
                scaled.append(t[1])   # this slot's B, copied as read
                factors.append(adapter.scales[path])
        for path in stale:
            zeros += [self.layers[path].a_t[slot], self.layers[path].b_t[slot]]
        # One call for all the copies and one for the zeros, not two per layer: a load runs on the decode loop's
        # thread, between steps, and each tensor call gives the GIL up to the web server's threads.
        with torch.no_grad():
            torch._foreach_copy_(targets, sources, non_blocking=True)
            if scaled:
                torch._foreach_mul_(scaled, factors)
            if zeros:
                torch._foreach_zero_(zeros)
        self._written[slot] = set(adapter.modules)
        self.mapping.hold(slot, ("adapter", adapter.serial))

    def clear(self, slot: int) -> None:
        self._check(slot)
        with torch.no_grad():
            for path in self._written[slot]:
                self.layers[path].clear(slot)
        self._written[slot] = set()
        self.mapping.invalidate(slot)

    def _check(self, slot: int) -> None:
        if not 1 <= slot <= self.capacity:
            raise IndexError(f"slot {slot} does not exist: adapter slots are 1..{self.capacity} "
                             f"(slot {BASE_SLOT} is the bare backbone)")

    # ------------------------------------------------------------------ info

    @property
    def nbytes(self) -> int:
        """Bytes held by the slot buffers of every layer."""
        return sum(layer.a_t.numel() * layer.a_t.element_size() + layer.b_t.numel() * layer.b_t.element_size()
                   for layer in self.layers.values())

    def info(self) -> dict[str, Any]:
        return {"layers": len(self.layers), "slots": self.capacity, "rank": self.rank, "bytes": self.nbytes}
