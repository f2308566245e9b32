"""`LeanBatch`: what the written-out decode steps (`marian.MarianBatch`, `llama.LlamaBatch`) share around their
architecture: the cache's length, the compiled step and its threads, the float16 cache option, the compaction
policy, and each forward's LoRA terms kept while nothing about them changed."""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from typing import Any

import torch

from .. import kernels
from .batch import RunningBatch


class LeanBatch(RunningBatch):
    """A running batch whose step is written out (a pure function of tensors, eager or compiled) over a cache
    with `length` columns in use (`self.cache`, None when empty)."""

    #: (parent module name, sibling layers) the step multiplies in one GEMM: with int8 weights the backbone fuses
    #: them at load (`quant.layer.fuse_siblings`) so that the model keeps one copy.
    FUSED: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cache: Any = None
        #: (the layers, key, the LoRA terms of the last forward): see `_lora_terms`.
        self._lora_memo: tuple[list[Any], Any, tuple[tuple[Any, ...], ...]] | None = None
        #: The dtype of the attention keys/values the cache keeps (`model.kv_cache`, set by the backbone): float16
        #: halves what each step's attention reads; None: the model's dtype.
        self.kv_dtype: torch.dtype | None = None
        #: The compiled decode step (`decode/compiled.py`), shared by the backbone's batches; None: eager.
        self.compiled: Any = None
        #: What the step's view of the model was built for (`_stale`).
        self._layout: tuple[Any, ...] | None = None
        if self.device.type == "cpu" and kernels.move_rows() is not None:
            # A compaction moves only the rows kept past the new end, in one kernel call (~0.15 ms for 3 rows of
            # the demo's 24 cache tensors, against ~1.5 ms with tensor operations): cheaper than one step of a
            # finished row riding along, so finished rows go at once (`RunningBatch.pop_finished`).
            self.compact_share = 0.0

    @property
    def cache_length(self) -> int:
        return 0 if self.cache is None else self.cache.length

    @staticmethod
    @abstractmethod
    def _projections(layer: Any) -> tuple[Any, ...]:
        """The projections a decode step runs in one layer, in the step function's order."""

    def _lora_terms(self, layers: list[Any], tokens: int, per_row: int, device: torch.device, complete: bool,
                    padding: int) -> tuple[tuple[Any, ...], ...]:
        """Every projection's LoRA term for this forward, per layer. The same tuple while the rows' slots, the
        slots' weights (the mapping's version) and the shapes stay: a decode step whose rows do not change asks each
        projection group again for nothing, and an unchanged tuple is also one the compiled step has marked and
        walked already (`decode/compiled.py`, `decode/aot.py`)."""
        mapping = self.mapping
        key = (None if mapping is None else (mapping.version, mapping.structure), tokens, per_row, device, complete,
               padding)
        memo = self._lora_memo
        if memo is not None and memo[0] is layers and memo[1] == key:
            return memo[2]
        terms = tuple(tuple(p.lora_tensors(tokens, per_row, device, complete, padding)
                            for p in self._projections(layer)) for layer in layers)
        self._lora_memo = (layers, key, terms)
        return terms

    def release_idle(self) -> None:
        """Drop the LoRA weights stacked for the mixes of slots the batch ran (each projection's `GroupedLoRA`),
        once no row is left: up to every slot's weights once more per projection, 186 MB for HY-MT1.5-1.8B with 8
        adapters over qgemm (bench.hunyuan_cpu's resident memory after its 16 requests drained). The next mixed
        batch stacks its slots again; each adapter's quantized pieces stay, and so do the one-slot stacks that are
        those pieces themselves (`GroupedLoRA.release_stacks`)."""
        if self.rows:
            return
        self._lora_memo = None
        for layer in getattr(self, "_layers", ()):
            for projection in self._projections(layer):
                if projection.lora is not None:
                    projection.lora.release_stacks()

    def _stale(self, root: Any) -> tuple[tuple[Any, ...], bool] | None:
        """None while the step's view of the model (its fused projections) is current, else (the layout to build it
        for, whether the weights go unpacked): it is rebuilt when the slot layers change (modules wrapped, slots
        grown) or the compiled step takes over or fails."""
        mapping = self.mapping
        # A compiled step that freezes the weights takes them unpacked (decode/compiled.py); eager after it failed,
        # the step goes back to the packed ones.
        plain = self._step() is not None and self.compiled.frozen
        layout = (id(root), -1 if mapping is None else mapping.structure, plain)
        return None if layout == self._layout else (layout, plain)

    def _step(self) -> Any:
        """The compiled step when there is one that works, else None (eager)."""
        return self.compiled if self.compiled is not None and self.compiled.active else None

    def _decode_threads(self) -> contextlib.AbstractContextManager[None]:
        # Compiled, every forward runs on all threads: fewer would not pay there (a compiled step of one row
        # without LoRA, measured alone: 0.62 ms on two threads, 0.81 on one), and torch compiles a graph again
        # when the thread count changes.
        return contextlib.nullcontext() if self._step() is not None else super()._decode_threads()

    def _prefill_threads(self, tokens: int) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if self._step() is not None else super()._prefill_threads(tokens)
