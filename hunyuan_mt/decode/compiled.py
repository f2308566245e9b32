"""The lean decode step, compiled: `torch.compile` (inductor's C++ backend) over `marian.decoder_step`.

Eager, a decode step of the demo model is some 150 small tensor operations, each a Python call and a pass over
memory: for one row they cost more than the arithmetic. Compiled, the elementwise work around each GEMM (the
per-token int8 scaling, residuals, layer norms, GELU, the attention's scale, mask and softmax) fuses into a few
C++ loops, and the step runs as one call: in the service on the 2-core box, a decode step of one row 2.8 → 2.0
ms, of 64 rows 9.4 → 6.7 ms; the encoder over 64 rows 17.7 → 13.9 ms (BENCHMARKS.md). The GEMMs stay aten's
(`torch._int_mm`, `mm`, `bmm`). The same function is also compiled for the encoder (`CompiledEncoder`).

One compiled graph serves every batch. Everything that varies between steps is a tensor dimension marked dynamic
(rows, cache columns and capacity, source length, the LoRA columns), and this wrapper keeps those dimensions away
from 1 and from a tensor's whole extent, where torch specialises a graph of its own (a compile of ~25 s on this
machine, ~4 s from inductor's on-disk cache): a lone row runs beside a padding row, a batch's first step sees one
masked cache column, and the caches keep a spare row and column (`MarianBatch._decode`). Compiled forwards never
change torch's thread count either (torch guards on it). The LoRA term comes `complete` (`lora.GroupedLoRA`), so a mixed batch, one adapter and
the bare backbone are the same graph.

Compiling needs a C++ compiler (inductor calls g++). Where it fails, the step logs why once and runs eagerly for
the rest of the process: the same arithmetic, slower. `Backbone.compile_step` turns this on (the service does,
after its pinned adapters are in, and warms it up), never a one-off process: the compile costs more than it saves
for a few sentences.
"""

from __future__ import annotations

import logging
import threading
import time
import types
from typing import Any

import torch
import torch.nn.functional as F

from .marian import _NEG, decoder_step, encoder_forward

log = logging.getLogger(__name__)


#: Set on a tensor once its dimensions are marked dynamic (the caches and LoRA stacks outlive many steps).
_MARKED = "_hmt_dynamic"


def _mark(t: torch.Tensor | None, *dims: int) -> None:
    if t is not None:
        for d in dims:
            torch._dynamo.maybe_mark_dynamic(t, d)
        setattr(t, _MARKED, True)


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """`t` with zero rows appended up to `rows` (dimension 0), contiguous."""
    if rows == t.shape[0]:
        return t.contiguous()
    return F.pad(t, (0, 0) * (t.dim() - 1) + (0, rows - t.shape[0]))


class _Compiled:
    """A pure function of tensors run through torch.compile, on first use; eager once compiling has failed.
    Thread-safe as the batches calling it are (the backbone's model lock)."""

    #: Rows (and, for the encoder, source columns) a compiled call runs with at least (see the module docstring).
    MIN_ROWS = 2

    def __init__(self, fn: Any) -> None:
        self._eager = fn
        self._fn = torch.compile(_own_copy(fn), dynamic=None, fullgraph=True,
                                 options={"guard_filter_fn": _skip_weight_guards})
        #: Why compiling failed, once it has; the calls are eager from then on.
        self.error: str | None = None
        self.calls = 0
        #: Graphs compiled by this function's calls, and the seconds those calls took (the first; any later one is
        #: a shape class the warm-up did not cover).
        self.graphs = 0
        self.compile_s = 0.0
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self.error is None

    def _run(self, args: tuple[Any, ...], eager: tuple[Any, ...]) -> Any:
        """The compiled function on `args` (marked and padded), or, if compiling fails, the eager one on `eager`."""
        started = time.perf_counter()
        before = _graphs()
        try:
            out = self._fn(*args)
        except torch._dynamo.exc.TorchDynamoException as exc:
            self._fail(exc)
            return self._eager(*eager)
        self.calls += 1
        if _graphs() != before:
            spent = time.perf_counter() - started
            self.graphs += _graphs() - before
            self.compile_s += spent
            log.info("%s compiled in %.1f s (graph %d of it)", self._eager.__name__, spent, self.graphs)
        return out

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.error is None:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                self.error = f"{type(exc).__name__}: {first[:300]}"
                log.warning("compiling %s failed, it runs eagerly (same output, slower): %s", self._eager.__name__,
                            self.error)


def _mark_lora(lora: list[tuple[Any, ...]]) -> None:
    """A, B, the mask and the fused int8 weight of each LoRA term: their slot columns (and the mask's tokens)
    vary."""
    for layer in lora:
        for t in layer:
            if t is None:
                continue
            # Each on its own: A and B are kept per set of slots, the mask is made per set of rows, the widened
            # int8 weight's views when the slots in use change.
            for tensor, dims in ((t[0], (1,)), (t[1], (t[1].dim() - 2,)), (t[2], (0, 1))):
                if tensor is not None and not hasattr(tensor, _MARKED):
                    _mark(tensor, *dims)
            if t[4] is not None and not hasattr(t[4][0], _MARKED):
                _mark(t[4][0], 1), _mark(t[4][1], 0)


class CompiledStep(_Compiled):
    """`decoder_step` for one new token per row."""

    def __init__(self) -> None:
        super().__init__(decoder_step)

    def padding(self, rows: int) -> int:
        """Padding rows a step of `rows` rows runs with."""
        return max(0, self.MIN_ROWS - rows)

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cmask: torch.Tensor,
                 k: list[torch.Tensor], v: list[torch.Tensor], ck: list[torch.Tensor], cv: list[torch.Tensor],
                 model: tuple[Any, ...], lora: list[tuple[Any, ...]]) -> torch.Tensor:
        """`lora` comes `complete`, its masks padded by `padding(rows)` tokens (MarianBatch._forward)."""
        if self.error is not None:
            return decoder_step(ids, pos, mask, cmask, k, v, ck, cv, model, lora)
        b = ids.shape[0]
        rows = b + self.padding(b)
        # The cache tensors hold more rows than this (MarianBatch._decode); a padding row reads and writes one
        # that no live row uses, and its logits are dropped.
        ids, pos = _pad_rows(ids, rows), _pad_rows(pos, rows)
        mask, cmask = _pad_rows(mask, rows), _pad_rows(cmask, rows)
        if cmask.shape[-1] < 2:
            # A one-token source: MarianBatch._decode keeps a spare source column; this one is masked.
            cmask = F.pad(cmask, (0, 2 - cmask.shape[-1]), value=_NEG[cmask.dtype])
        _mark(ids, 0), _mark(pos, 0), _mark(mask, 0, 3), _mark(cmask, 0, 3)
        # Tensors that live longer than a step (the caches, the LoRA stacks) are marked once.
        for store in (k, v, ck, cv):
            for t in store:
                if not hasattr(t, _MARKED):
                    _mark(t, 0, 2)
        _mark_lora(lora)
        unpadded = [tuple(t if t is None or t[2] is None else (t[0], t[1], t[2][:b], *t[3:]) for t in layer)
                    for layer in lora]
        logits = self._run((ids, pos, mask, cmask, k, v, ck, cv, model, lora),
                           (ids[:b], pos[:b], mask[:b], cmask[:b], k, v, ck, cv, model, unpadded))
        return logits[:b]


class CompiledEncoder(_Compiled):
    """`encoder_forward`; its caller (MarianBatch._encode) pads rows and source columns to MIN_ROWS."""

    def __init__(self) -> None:
        super().__init__(encoder_forward)

    def __call__(self, src: torch.Tensor, mask: torch.Tensor, model: tuple[Any, ...],
                 lora: list[tuple[Any, ...]]) -> torch.Tensor:
        if self.error is not None:
            return encoder_forward(src, mask, model, lora)
        _mark(src, 0, 1), _mark(mask, 0, 3)
        _mark_lora(lora)
        return self._run((src, mask, model, lora), (src, mask, model, lora))


def _own_copy(fn: Any) -> Any:
    """`fn` with a code object of its own: torch keeps compiled graphs (and their guards) per code object, so each
    backbone's step gets a cache of its own, whose guards may then trust its weights (`_skip_weight_guards`)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _skip_weight_guards(entries: list[Any]) -> list[bool]:
    """Keep every guard but the per-tensor checks on the model's weights (`decoder_step`'s `model` argument).

    A call checks its guards before it runs: ~80 weight tensors (dtype, shape, strides each) cost the step of
    one row about 0.2 ms. The weights of one backbone never change shape or place after load (int8 packing and
    fusion happen before the first step), and each backbone compiles its own copy of the step (`_own_copy`).
    The checks on the model's structure (tuple lengths, which biases exist) and on every other input stay."""
    return [not (e.name.startswith("model[") and "TENSOR_MATCH" in str(e.guard_type)) for e in entries]


def _graphs() -> int:
    """Graphs dynamo has compiled in this process (its own counter)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
