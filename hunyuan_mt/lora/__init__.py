"""Serving-time multi-LoRA: every target linear holds the weights of all resident adapters as stacked slots.

- `mapping.SlotMapping`: the row → slot index of the forward pass in flight, computed once per step and read by
  every layer (like vLLM's punica metadata).
- `slots.SlotLinear`: a base linear plus `A[slots, r, in]`, `B[slots, out, r]`; one gathered low-rank product per
  layer serves every row, any mix of adapters, the bare backbone included (slot 0 is all zeros).
- `inject.SlotLoRA`: wraps a plain transformers model's target modules once and copies adapters into slots.

PEFT's folders are read as they are (`adapters.registry`); PEFT's layers are not used for serving.
"""

from .inject import PreparedAdapter, SlotLoRA, prepare
from .mapping import BASE_SLOT, SlotMapping
from .slots import SlotLinear

__all__ = ["BASE_SLOT", "PreparedAdapter", "SlotLinear", "SlotLoRA", "SlotMapping", "prepare"]
