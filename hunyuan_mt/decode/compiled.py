"""The lean decode step, compiled: `marian.decoder_step` and `marian.encode_cross` (the encoder and the decoder's
cross-attention keys/values) through inductor's C++ backend, ahead of time (`decode/aot.py`).

Eager, a decode step of the demo model is some 150 small tensor operations, each a Python call and a pass over
memory: for one row they cost more than the arithmetic. Compiled, the elementwise work around each GEMM (the
per-token int8 scaling, residuals, layer norms, GELU, the attention's scale, mask and softmax) fuses into a few
C++ loops (a decode step of one row 2.8 → 2.0 ms, of 64 rows 9.4 → 6.7 ms; the encoder over 64 rows 17.7 → 13.9
ms, BENCHMARKS.md). The GEMMs stay aten's (`torch._int_mm`, `mm`, `bmm`). Compiled ahead of time, the step is also
called from C++ without dynamo's guards and inductor's Python wrapper: a short request 23.4 → 19.8 ms against
the same graph run by `torch.compile` (alternating, one process).

int8 weights are inputs of the packages. Float32 weights are compiled in (`AotFunction(freeze=True)`): inductor
then packs each linear's weight for oneDNN, as the eager float32 step does its own (decode/dense.py), and the
batches pass the weights unpacked (`Projection.plain`). 600 sentences in float32, compiled and eager alternating in
one process: 3.38 → 2.91 s for one pair, 4.15 → 3.47 s over 8 pairs mixed (BENCHMARKS.md).

One compiled package serves every batch. Everything that varies between steps is a tensor dimension marked dynamic
(rows, cache columns and capacity, source length, the LoRA columns), and this wrapper keeps those dimensions away
from 1 and from a tensor's whole extent, which the exported graph does not cover: a lone row runs beside a padding
row, a batch's first step sees one masked cache column, and the caches keep a spare row and column
(`MarianBatch._decode`). Compiled forwards never change torch's thread count either (the package is built for
one). The LoRA term comes `complete` (`lora.GroupedLoRA`), so a mixed batch, one adapter and the bare backbone are
the same package.

Compiling needs a C++ compiler (inductor calls g++): ~135 s for the three packages on the 2-core box the first time
(the demo; 2026-12-06, AMD EPYC: the step 42 s, the encoder's 47 s and 44 s), then the packages are read from disk.
Where compiling fails, or a call does not fit the package (its C++ input check refuses it), the step logs why once
and runs eagerly for the rest of the process: the same arithmetic, slower.
`Backbone.compile_step` turns this on (the service does, after its pinned adapters are in, and warms it up), never
a one-off process: the compile costs more than it saves for a few sentences.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from ..quant import int8, embedding as int8_embedding, fbgemm as int8_fbgemm, layer as int8_layer, invariant
from .. import kernels
from ..lora import grouped
from . import dense, kvcache, llama, marian
from .aot import AotFunction, AotMismatch, AotNotBuilt, is_marked
from .aot import mark_dynamic as _mark
from .llama import llama_step
from .marian import _NEG, decoder_step, encode_cross

log = logging.getLogger(__name__)


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """`t` with zero rows appended up to `rows` (dimension 0), contiguous."""
    if rows == t.shape[0]:
        return t.contiguous()
    return F.pad(t, (0, 0) * (t.dim() - 1) + (0, rows - t.shape[0]))


class _Compiled:
    """A pure function of tensors compiled ahead of time on first use; eager once compiling has failed.
    Thread-safe as the batches calling it are (the backbone's model lock)."""

    #: Rows (and, for the encoder, source columns) a compiled call runs with at least (see the module docstring).
    MIN_ROWS = 2

    #: Arguments that are the same object at every call (the model's weights; see AotFunction).
    STATIC: tuple[int, ...] = ()

    def __init__(self, fn: Any, freeze: bool = False, build: bool = True) -> None:
        self._eager = fn
        #: False: packages are only loaded, never compiled here (a missing one is an error: `AotNotBuilt`).
        self.build = build
        self._fn = self._function(fn, freeze)
        #: The weights (the STATIC arguments) are compiled in as constants: callers pass them unpacked.
        self.frozen = freeze
        #: Why compiling failed, once it has; the calls are eager from then on.
        self.error: str | None = None
        self.calls = 0
        self._lock = threading.Lock()

    def _function(self, fn: Any, freeze: bool, label: str | None = None) -> AotFunction:
        # The modules whose code the graph runs: a change to any of them compiles again.
        function = AotFunction(fn, freeze=freeze, label=label,
                               sources=(marian, llama, kvcache, dense, grouped, int8, int8_embedding, int8_fbgemm,
                                        int8_layer, invariant, kernels))
        function.build = self.build
        return function

    @property
    def active(self) -> bool:
        return self.error is None

    def _functions(self) -> tuple[AotFunction, ...]:
        return (self._fn,)

    @property
    def graphs(self) -> int:
        """Compiled packages in use (one serves every batch)."""
        return sum(len(f.packages) for f in self._functions())

    @property
    def compile_s(self) -> float:
        """Seconds spent compiling or loading them."""
        return sum(p.seconds for f in self._functions() for p in f.packages)

    def _run(self, args: tuple[Any, ...], eager: Callable[[], tuple[Any, ...]], fn: AotFunction | None = None) -> Any:
        """The compiled function (`fn`, default the one package for every batch) on `args` (marked and padded), or,
        if compiling fails or the package refuses the call, the eager one on `eager()`'s arguments (built only
        then)."""
        fn = fn or self._fn
        try:
            out = fn(args, self.STATIC)
        except Exception as exc:  # noqa: BLE001 - export, inductor and the C++ compiler raise many kinds
            if not isinstance(exc, AotMismatch) and fn.packages and self.calls:
                raise  # the package ran before: this is the computation failing (e.g. out of memory), not compiling
            self._fail(exc)
            return self._eager(*eager())
        self.calls += 1
        return out

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.error is None:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                self.error = f"{type(exc).__name__}: {first[:300]}"
                if isinstance(exc, AotNotBuilt):
                    log.info("%s runs eagerly: %s", self._eager.__name__, first[:300])
                else:
                    log.warning("compiling %s failed, it runs eagerly (same output, slower): %s",
                                self._eager.__name__, self.error)


def _mark_lora(lora: Sequence[tuple[Any, ...]]) -> None:
    """A, B, the mask and the fused int8 weight of each LoRA term: their slot columns (and the mask's tokens)
    vary."""
    for layer in lora:
        for t in layer:
            if t is None:
                continue
            # Each on its own: A and B are kept per set of slots, the mask is made per set of rows, the widened
            # int8 weight's views when the slots in use change.
            a, b, mask = t[:3]
            for tensor, dims in ((a, (1,)), (b, (-2,)), (mask, (0, 1))):
                if tensor is not None and not is_marked(tensor):
                    _mark(tensor, *(d % tensor.dim() for d in dims))
            if t[4] is not None and not is_marked(t[4][1]):
                wide, scale, b_q, b_scale = t[4]
                _mark(wide, 1), _mark(scale, 0), _mark(b_q, b_q.dim() - 2), _mark(b_scale, b_scale.dim() - 1)


class _DecodeStep(_Compiled):
    """A decode step (one new token per row): padding rows up to MIN_ROWS, and the tensors that outlive a step
    marked once."""

    def __init__(self, fn: Any, freeze: bool = False, build: bool = True) -> None:
        super().__init__(fn, freeze, build)
        #: The LoRA terms the last call marked: the same tuple at the next step (`LeanBatch._lora_terms`) holds
        #: the same tensors, marked already.
        self._marked: Any = None

    def padding(self, rows: int) -> int:
        """Padding rows a step of `rows` rows runs with."""
        return max(0, self.MIN_ROWS - rows)

    def _mark_lasting(self, stores: Sequence[list[torch.Tensor]], lora: Sequence[tuple[Any, ...]]) -> None:
        """Tensors that live longer than a step (the caches: rows and columns vary; the LoRA stacks)."""
        for store in stores:
            for t in store:
                if not is_marked(t):
                    _mark(t, 0, 2)
        if lora is not self._marked:
            _mark_lora(lora)
            self._marked = lora if isinstance(lora, tuple) else None


class CompiledStep(_DecodeStep):
    """`decoder_step` for one new token per row."""

    STATIC = (8,)  # the model

    def __init__(self, freeze: bool = False, build: bool = True) -> None:
        super().__init__(decoder_step, freeze, build)

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cmask: torch.Tensor,
                 k: list[torch.Tensor], v: list[torch.Tensor], ck: list[torch.Tensor], cv: list[torch.Tensor],
                 model: tuple[Any, ...], lora: Sequence[tuple[Any, ...]]) -> torch.Tensor:
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
        self._mark_lasting((k, v, ck, cv), lora)
        logits = self._run((ids, pos, mask, cmask, k, v, ck, cv, model, lora),
                           lambda: (ids[:b], pos[:b], mask[:b], cmask[:b], k, v, ck, cv, model, _unpadded(lora, b)))
        return logits[:b]


class CompiledLlamaStep(_DecodeStep):
    """`llama.llama_step` for one new token per row (the decoder-only lean step; its prefill stays eager: several
    tokens per row, GEMM-bound). Its rows are padded and its dimensions kept away from 1 as `CompiledStep`'s
    (`LlamaBatch._decode` keeps a spare row and column in the cache)."""

    STATIC = (7,)  # the model

    def __init__(self, freeze: bool = False, build: bool = True) -> None:
        super().__init__(llama_step, freeze, build)

    def __call__(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, k: list[torch.Tensor],
                 v: list[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor, model: tuple[Any, ...],
                 lora: Sequence[tuple[Any, ...]]) -> torch.Tensor:
        if self.error is not None:
            return llama_step(ids, pos, mask, k, v, cos, sin, model, lora)
        b = ids.shape[0]
        rows = b + self.padding(b)
        ids, pos, mask = _pad_rows(ids, rows), _pad_rows(pos, rows), _pad_rows(mask, rows)
        _mark(ids, 0), _mark(pos, 0), _mark(mask, 0, 3)
        for t in (cos, sin):
            if not is_marked(t):
                _mark(t, 0)  # the rotary table grows with the longest position
        self._mark_lasting((k, v), lora)
        logits = self._run((ids, pos, mask, k, v, cos, sin, model, lora),
                           lambda: (ids[:b], pos[:b], mask[:b], k, v, cos, sin, model, _unpadded(lora, b)))
        return logits[:b]


class CompiledEncoder(_Compiled):
    """`encode_cross` (the encoder and the decoder's cross-attention keys/values); its caller (MarianBatch._cross)
    pads source columns to MIN_ROWS and rows to `rows(n)`.

    A lone source, the common case of an interactive request and what a stream's first piece waits for, runs in a
    package of its own whose rows are fixed at 1: beside a padding row, the encoder's GEMMs did twice the rows for
    nothing (the exported graph with varying rows takes no fewer than two, and one exported for fewer failed in
    inductor: backed_size_oblivious, torch 2.13). It is compiled at the warm-up's one-row call."""

    STATIC = (2, 4)  # the encoder's weights, the cross-attention K/V projections'

    def __init__(self, freeze: bool = False, build: bool = True) -> None:
        super().__init__(encode_cross, freeze, build)
        # Two packages of one function, hence two compiles of encode_cross on a first start: this one, and the
        # one whose rows vary (`_fn`).
        self._single = self._function(encode_cross, freeze, "encode_cross (one row)")

    def _functions(self) -> tuple[AotFunction, ...]:
        return self._fn, self._single

    def rows(self, n: int) -> int:
        """Rows a call for `n` sources runs with (padding rows below them)."""
        return 1 if n == 1 else max(n, self.MIN_ROWS)

    def __call__(self, src: torch.Tensor, mask: torch.Tensor, model: tuple[Any, ...], lora: list[tuple[Any, ...]],
                 cross: tuple[Any, ...], cross_lora: list[Any]) -> torch.Tensor:
        args = (src, mask, model, lora, cross, cross_lora)
        if self.error is not None:
            return encode_cross(*args)
        single = src.shape[0] == 1
        rows = () if single else (0,)  # a lone source's package has its one row fixed
        _mark(src, *rows, 1), _mark(mask, *rows, 3)
        _mark_lora(lora)
        _mark_lora([tuple(cross_lora)])
        return self._run(args, lambda: args, self._single if single else self._fn)


def _unpadded(lora: Sequence[tuple[Any, ...]], rows: int) -> list[tuple[Any, ...]]:
    """The LoRA terms with their masks cut to the live rows (the eager step runs without padding rows)."""
    return [tuple(t if t is None or t[2] is None else (t[0], t[1], t[2][:rows], *t[3:]) for t in layer)
            for layer in lora]
