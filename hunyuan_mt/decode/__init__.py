"""The decode loop's parts: token choice per row (`picker`) and the running batch per architecture (`batch`,
`causal`, `llama`, `marian`). `running_batch_class` says which one a model gets, or why it gets none (the engine
then runs whole batches through transformers' `generate`)."""

from __future__ import annotations

import inspect
from typing import Any

from .batch import Live, RunningBatch, Sequence
from .causal import CausalBatch
from .llama import LlamaBatch, lean_note
from .marian import MarianBatch
from .picker import RowTokens, TokenPicker

__all__ = ["CausalBatch", "Live", "LlamaBatch", "MarianBatch", "RowTokens", "RunningBatch", "Sequence", "TokenPicker",
           "running_batch_class"]


def running_batch_class(model: Any, arch: str) -> tuple[type[RunningBatch] | None, str]:
    """(the RunningBatch subclass for this model, "") or (None, why iteration-level decoding is not available)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", type(model).__name__)
    if arch == "decoder-only":
        layer_types = getattr(config, "layer_types", None) or []
        if any(t != "full_attention" for t in layer_types):
            return None, f"{model_type} has sliding-window or linear-attention layers"
        if "position_ids" not in inspect.signature(model.forward).parameters:
            return None, f"{model_type} takes no per-row position_ids"
        # Llama-shaped models on the CPU get the lean step (llama.py); the rest, and GPUs, the model's own forward.
        return (LlamaBatch, "") if lean_note(model) is None else (CausalBatch, "")
    if model_type == "marian":
        return MarianBatch, ""
    return None, f"{model_type}'s decoder derives positions from the cache length (one per batch)"
