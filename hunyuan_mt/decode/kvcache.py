"""What the lean decode steps share about attention over a running batch's cache (`marian`, `llama`).

A batch's keys and values are one tensor per layer, `[row capacity, kv heads, column capacity, head_dim]`, with an
additive bias per row and column (0 where a row sees the column, `_NEG` where it does not): rows are aligned on
the right, so a row that joined with a shorter history has its leading columns masked. The helpers below copy rows
in (`_place`), keep some (`_keep`, `_move`), grow the tensors by doubling (`_regrow`, `_grown`), and attend for the
new token(s) of each row (`_cached_attention`: the C++ kernel where it applies, else `_attend`, written so that a
row's result does not depend on the rows and columns beside it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..quant import invariant
from .. import kernels


#: The additive mask value for a column a row must not see: large and finite, so a query that sees no column at
#: all (a padding position in a prefill) averages harmlessly instead of producing NaN.
_NEG = {dtype: torch.finfo(dtype).min / 2 for dtype in (torch.float32, torch.float16, torch.bfloat16)}


#: Columns and rows a cache starts with; both double when full.
START_COLUMNS = 32
START_ROWS = 8


@dataclass
class SelfCache:
    """Self-attention keys/values of some rows (`k`, `v` per layer, `length` columns used, `bias` per row and
    column). Tensors may hold more rows and columns than are in use; `rows` are in use."""

    rows: int
    length: int
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    bias: torch.Tensor          # [row capacity, column capacity]: 0 for a row's real columns, a large negative else

    @property
    def columns(self) -> int:
        return self.bias.shape[1]

    @property
    def capacity(self) -> int:
        return self.bias.shape[0]


def _cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, width: Any,
                      scale: float, kernel: Any) -> torch.Tensor:
    """Queries q [B, heads, T, head_dim] over the first `width` columns of cached keys/values ([≥ B, heads, ≥ width,
    head_dim]) with the additive `mask` [B, 1, T, width]: [B·T, heads·head_dim]. Through the kernel where one is
    given (T = 1; it reads each row's own columns), else written out (`_attend`, the cache widened to q's dtype)."""
    b, h, t, hd = q.shape
    if kernel is not None:
        return kernel(q, k, v, mask, scale).view(b, h * hd)
    if k.shape[1] != h:
        # Grouped-query attention written out: each key/value head repeated for its group of query heads.
        k, v = (t_.repeat_interleave(h // k.shape[1], dim=1) for t_ in (k[:b, :, :width], v[:b, :, :width]))
    return _attend(q, k[:b, :, :width].to(q.dtype), v[:b, :, :width].to(q.dtype), mask, scale).transpose(
        1, 2).reshape(b * t, h * hd)


def _block(columns: Any) -> Any:
    """`columns` rounded up to whole blocks of attention keys (`invariant.COLUMNS`)."""
    return invariant.round_up(columns, invariant.COLUMNS)


def _blocked(t: torch.Tensor, dim: int, value: float = 0.0) -> torch.Tensor:
    """`t` padded with `value` along `dim` to whole blocks of attention keys."""
    return invariant.padded(t, dim, invariant.COLUMNS, value)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention written so that a row's result does not depend on the widths and columns of the rows beside it
    (invariant 5, to the bit; measured in `invariant`):
    - MKL's GEMM for the scores rounds a column differently when it falls in a partial tile at the right edge of
      the key matrix, so eager callers pass keys and mask over whole blocks (`_block`), the extra columns masked.
      The compiled step computes one query row's scores as a reduction per column, the same whatever the width.
    - The softmax's sum depends on where a row's columns sit among the SIMD lanes (the decoder's cache is right-
      aligned, so that moves with the batch's history): it is summed in float64 and rounded back. Where the
      GEMMs are float16/bfloat16 (a GPU) the softmax runs in float32 as usual.
    - The GEMM with the values adds exact zeros for the masked columns, but where the row's own columns sit among
      the GEMM's columns (its offset in a right-aligned cache) changes how MKL groups the sum on AVX-512/AMX CPUs:
      119 of 150 random cases differed on an Intel Xeon with AMX (2026-12-05; the same test passed on an AMD AVX2
      box). Eager, on the
      CPU, that product runs in float64: each term is exact there (two float32 factors), and the sums of a few
      hundred terms round back to the same float32 in any grouping (0 of 150 differed). The compiled step's one-
      row product is a reduction per output in column order, the same whatever the offset.

    Written out rather than SDPA: for one new token per row SDPA's CPU kernel blocks over queries and costs
    ~460 µs a call at 64 rows × 31 columns; written out, the compiled step of 64 rows took 5.1 ms against 6.4 ms,
    and its scale, mask and softmax fuse into one kernel."""
    weights = torch.matmul(q, k.transpose(-1, -2)) * scale + mask
    if q.dtype != torch.float32:
        return torch.matmul(weights.softmax(dim=-1, dtype=torch.float32).to(q.dtype), v)
    e = (weights - weights.amax(dim=-1, keepdim=True)).exp()
    p = e / e.sum(dim=-1, keepdim=True, dtype=torch.float64).to(e.dtype)
    if q.device.type == "cpu" and not torch.compiler.is_compiling():
        return torch.matmul(p.double(), v.double()).to(q.dtype)
    return torch.matmul(p, v)


def _place(stores: tuple[list[torch.Tensor], ...], bias: torch.Tensor, theirs: tuple[list[torch.Tensor], ...],
           their_bias: torch.Tensor, at: int, rows: int, shift: int, used: int) -> None:
    """Copy the first `rows` rows and `used` columns of `theirs` (and their bias) into rows at..at+rows, columns
    shift..shift+used of `stores`; the rest of those rows is masked."""
    for store, other in zip(stores, theirs):
        for s, o in zip(store, other):
            s[at:at + rows, :, shift:shift + used] = o[:rows, :, :used]
    bias[at:at + rows] = _NEG[bias.dtype]
    bias[at:at + rows, shift:shift + used] = their_bias[:rows, :used]


def _keep(stores: tuple[list[torch.Tensor], ...], bias: torch.Tensor, index: torch.Tensor, start: int,
          end: int) -> None:
    """Move rows `index`, columns start..end, to the front of `stores` and `bias` (compaction); the rest of the
    kept rows is masked."""
    n, used = index.numel(), end - start
    for store in stores:
        for s in store:
            s[:n, :, :used] = s[:, :, start:end].index_select(0, index)
    kept = bias.index_select(0, index)[:, start:end]
    bias[:n] = _NEG[bias.dtype]
    bias[:n, :used] = kept


def _move(stores: tuple[list[torch.Tensor], ...], bias: torch.Tensor, dst: torch.Tensor, src: torch.Tensor,
          used: int, disjoint: bool = False) -> None:
    """Copy rows `src` (their first `used` columns, and their whole bias row) onto rows `dst`."""
    tensors = [s for store in stores for s in store]
    # The kernel copies row by row, so it takes disjoint rows only (a compaction's: rows past the new end into the
    # places of finished ones); a shift (rows dropped from the middle, order kept) copies through index_select.
    move = kernels.move_rows() if bias.device.type == "cpu" and disjoint else None
    if move is not None:
        move(tensors, dst, src, used)  # one call for every layer's tensors (kernels/move_rows.cpp)
    else:
        for s in tensors:
            view = s[:, :, :used]
            view.index_copy_(0, dst, view.index_select(0, src))
    bias.index_copy_(0, dst, bias.index_select(0, src))


def _regrow(stores: tuple[list[torch.Tensor], ...], bias: torch.Tensor, rows: int, used: int, new_rows: int,
            new_cols: int) -> torch.Tensor:
    """Reallocate keys/values (`stores`: lists of [rows, heads, columns, head_dim]) and their bias [rows, columns]
    to new_rows × new_cols, keeping the first `rows` rows and `used` columns. Returns the new bias."""
    for store in stores:
        for i, s in enumerate(store):
            grown = s.new_zeros(new_rows, s.shape[1], new_cols, s.shape[3])
            grown[:rows, :, :used] = s[:rows, :, :used]
            store[i] = grown
    grown_bias = bias.new_full((new_rows, new_cols), _NEG[bias.dtype])
    grown_bias[:rows, :used] = bias[:rows, :used]
    return grown_bias


def _grown(have: int, need: int, start: int) -> int:
    size = max(have, start)
    while size < need:
        size *= 2
    return size


def _shift_right(cache: Any, by: int) -> None:
    """Move every row's self-attention columns `by` to the right (rows joining with a longer history); `cache` has
    `k`, `v`, `bias`, `rows` and `length` (either step's cache)."""
    n, length = cache.rows, cache.length
    for store in (cache.k, cache.v):
        for s in store:
            s[:n, :, by:by + length] = s[:n, :, :length].clone()
            s[:n, :, :by].zero_()
    cache.bias[:n, by:by + length] = cache.bias[:n, :length].clone()
    cache.bias[:n, :by] = _NEG[cache.bias.dtype]
    cache.length = length + by


def reserve(cache: SelfCache, rows: int, columns: int) -> None:
    """Grow the self-attention tensors (doubling) so they hold `rows` rows and `columns` columns; what is in use is
    kept."""
    new_rows = _grown(cache.capacity, rows, START_ROWS)
    new_cols = _grown(cache.columns, columns, START_COLUMNS)
    if (new_rows, new_cols) != tuple(cache.bias.shape):
        cache.bias = _regrow((cache.k, cache.v), cache.bias, cache.rows, cache.length, new_rows, new_cols)


def compact(cache: SelfCache, keep: list[int], device: torch.device,
            others: tuple[tuple[tuple[list[torch.Tensor], ...], torch.Tensor, int], ...] = ()) -> None:
    """Keep only rows `keep` (indices before the change) of `cache` and of `others` ((stores, bias, columns in
    use) over the same rows: Marian's cross-attention). Where a quarter or more of the self-attention columns are
    leading ones no kept row sees, every kept row is copied to drop them; else only the rows that changed place move
    (RunningBatch.compact fills the gaps from the end) and those columns stay, masked."""
    index = torch.tensor(keep, dtype=torch.long, device=device)
    used = (cache.bias.index_select(0, index)[:, :cache.length] == 0).any(dim=0).nonzero()
    cut = int(used[0]) if used.numel() else cache.length
    if cut and 4 * cut >= cache.length:
        _keep((cache.k, cache.v), cache.bias, index, cut, cache.length)
        for stores, bias, columns in others:
            _keep(stores, bias, index, 0, columns)
        cache.length -= cut
    else:
        moved = [(dst, src) for dst, src in enumerate(keep) if dst != src]
        if moved:
            dst = torch.tensor([m[0] for m in moved], dtype=torch.long, device=device)
            src = torch.tensor([m[1] for m in moved], dtype=torch.long, device=device)
            disjoint = not {m[0] for m in moved} & {m[1] for m in moved}
            _move((cache.k, cache.v), cache.bias, dst, src, cache.length, disjoint)
            for stores, bias, columns in others:
                _move(stores, bias, dst, src, columns, disjoint)
    cache.rows = len(keep)
