"""`GroupedLoRA`: the LoRA term of several slot layers that read the same input (Q, K and V), in one pass.

The lean decode step (`decode/marian.py`) runs a fused base projection (one GEMM for Q, K and V) and adds this on
top. With U distinct adapter slots among the rows and P projections in the group, the rows' A matrices are laid
side by side, `A = [A(p, u)]` of shape [in, P·U·r] (columns ordered projection, slot, rank), and each projection p
has `B_p = [B(p, u)]` stacked [U·r, out]:

    h = x @ A                      one GEMM for every slot and projection
    h_p *= mask                    each row keeps the columns of its own slot (mixed batches only; one mask
                                   [tokens, U·r] per forward, shared by every projection: `SlotMapping.column_mask`)
    y_p += h_p @ B_p               one bmm over the projections

A row on the bare backbone keeps no column, so it gets exactly the base output. Compared with gathering per-row
copies of A and B (`SlotLinear`'s bmm path, which reads every row's own matrices at every step), this reads each
slot's weights once per step and runs plain GEMMs; the price is U times the (small) LoRA arithmetic for every row,
measured in BENCHMARKS.md. All rows on one slot is the same with U = 1 and no mask; all on the bare backbone adds
nothing.

`GroupedLoRA.tensors` builds (A, B, mask) and `apply_lora` does the arithmetic: a pure function of tensors, so the
compiled decode step (`decode/compiled.py`) runs the same code. That step asks for `complete` tensors: a mask
even when every row is on one slot, and the bare backbone's zero slot when every row is on it, so that one
compiled graph serves every mix (a mask of ones and a zero product change no bit of the result).

The stacked A and B are rebuilt when the slots in use or their weights change; the mask when the rows change.

Over an int8 base (`int8.Int8Linear`, the CPU default) the A product runs inside the base GEMM: A's columns are
quantized per column and appended to the base's int8 weight, so one `torch._int_mm` over the token's int8
activations yields the base output and h side by side (`fused`). LoRA's float32 GEMMs (`x @ A`, and B for single
projections) were ~20 % of a compiled decode step (py-spy, 600 sentences, 64-row steps), and at one or two rows
`x @ A` was one more library call per projection; the fused GEMM is 4 % wider (16 of 384 columns per projection
and adapter). The price is rounding h from int8 activations and weights, like the base output; the float32 path
keeps the exact product.

The B side runs in int8 over an int8 base too (`_add_int8`). B is quantized per row (each of its U·r input
columns' row over the outputs) once per slot write; the row scales multiply h's columns, and that product, masked
to each row's own slot, is quantized per token: a row's step comes from its own slot's columns alone, so its result
does not depend on the other rows. With U adapters in a batch the masked GEMM multiplies U·r columns where r
count, and in float32 that was the largest cost of mixing pairs: 8 pairs mixed 2.95/3.12/3.14 → 2.45/2.95/2.83 s
(600 sentences, alternating; one pair 2.14/2.53/2.59 → 1.96/2.43/2.50 s), chrF int8 − float32 still within
−0.36 … +0.31 on the 16 held-out sets (BENCHMARKS.md).

Over qgemm's packed base (`quant.packed`, the kernel of models too large for the caches) both sides run in qgemm's
8-bit kernel (`_stack_packed`): on an AVX2 core float32 GEMMs of a LoRA's shapes ([16, 2048] @ [2048, 384],
[16, 128] @ [128, 2048]) ran at 6-11 GMAC/s, qgemm at ~4x that: the LoRA terms of a 1.8B step of 16 rows over 8
adapters took 72.2 ms of one core's time in float32 and 30.4 ms in qgemm (bench/lora_terms.py). A is quantized per
column and B per row (rank index), each adapter once and on its own, so that a row's term depends on its own slot
alone; B's row scales fold into A's column scales, since both multiply h's columns. A step over qgemm is never
compiled (`Backbone.compile_note`), so eager alone decides a row's bits; over fbgemm's base the compiled step
multiplies the float32 term, and eager keeps it too.

The widened weight is one buffer per projection group, the base's columns copied in once, with room for the A
columns of every slot; when the slots in use change, only their A columns are written (in × P·U·r bytes) and the
GEMM reads a column slice of the buffer (a strided matrix runs as fast as a contiguous one). Concatenating a new
weight for every set of slots instead cost 18 % of the wall time under 16 clients over 8 pairs (2,205 rebuilds
for 192 requests), where the set changes at nearly every admission.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from cachetools import LRUCache

from ..quant import invariant
from ..quant.int8 import int8_linear, int8_matmul, quantize_columns, quantize_matrix_rows
from ..quant.layer import symmetric
from ..quant.packed import BLOCK, GRID, PackedBase, pack, qgemm_linear
from .mapping import BASE_SLOT, SlotMapping
from .slots import SlotLinear

#: (A [in, P·U·r], B [P, U·r, out] or [U·r, out] when P = 1, mask [tokens, U·r] or None, layout, fused). Over a
#: float base fused is None. Over an int8 base A and B are None and fused is (the base's int8 weightᵀ with A's
#: columns appended: a buffer [in, ≥ out + P·U·r], its columns in use as many as the scales; their scales
#: [out + P·U·r]; B as int8 rows, shaped as B; B's row scales [P, U·r] or [U·r]): `project` multiplies A inside the
#: base GEMM and B in int8.
LoRATensors = tuple["torch.Tensor | None", "torch.Tensor | None", "torch.Tensor | None", tuple[tuple[int, int], ...],
                    "tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None"]


@dataclass
class _Stacked:
    key: tuple[int, int, int, bool, int]   # mapping version, tokens, structure, complete, padding
    tensors: LoRATensors | None


class GroupedLoRA:
    """The LoRA term of `layers` (SlotLinear or None where a projection has no slot layer), added to the fused
    output of their base projections, whose widths are `widths`."""

    def __init__(self, layers: Sequence[SlotLinear | None], widths: Sequence[int], mapping: SlotMapping,
                 int8_base: "tuple[torch.Tensor, torch.Tensor] | None" = None, packed: bool = False) -> None:
        self.layers = list(layers)
        #: The int8 base projection's (weightᵀ, scales) that A's columns join (see the module docstring).
        self.int8_base = int8_base
        #: Both sides through qgemm's 8-bit kernel (over a qgemm base; see the module docstring), where the
        #: slot layers' rank and input width allow it.
        self.packed = packed and int8_base is None and all(
            layer.a_t.shape[2] % 4 == 0 and layer.a_t.shape[1] % 4 == 0 for layer in layers if layer is not None)
        self.widths = list(widths)
        self.mapping = mapping
        self.present = [i for i, layer in enumerate(self.layers) if layer is not None]
        self._slot_layers: list[SlotLinear] = [self.layers[i] for i in self.present]  # type: ignore[misc]
        #: (mapping structure, rank, slots, dtype) of the slot layers: `_shape`.
        self._shape_memo: tuple[int, int, int, torch.dtype] | None = None
        #: (output offset, width) of each projection that has a slot layer, in the group's output.
        self.layout = tuple((sum(self.widths[:i]), self.widths[i]) for i in self.present)
        self._state: _Stacked | None = None
        #: (slots used, what they hold, structure) → (A, B, None, None) over a float base, (None, None, A's int8
        #: columns and scales, B's int8 rows and scales) over an int8 one: a few kept (pairs alone and mixes
        #: alternate), at most as many bytes as every slot's weights once (`_stack_budget`).
        self._weights: LRUCache | None = None
        self._weights_version: int | None = None
        #: The widened int8 weight (see the module docstring): the buffers, and which slots' columns they hold.
        self._wide: tuple[torch.Tensor, torch.Tensor] | None = None
        self._wide_holds: tuple[Any, tuple[torch.Tensor, torch.Tensor]] | None = None
        #: What a slot holds (`SlotMapping.content`) → (A's int8 columns of every projection, their scales, B as
        #: int8 rows of every projection, their scales), for `_pieces_version` (the layers' structure); sized in
        #: `_quantized` to twice the slots.
        self._pieces: LRUCache | None = None
        self._pieces_version: int | None = None

    def add_to(self, x: torch.Tensor, y: torch.Tensor, tokens_per_row: int = 1) -> torch.Tensor:
        """y [N, Σwidths] += LoRA(x [N, in]); N is rows × tokens_per_row, rows in the mapping's order."""
        tensors = self.tensors(x.shape[0], tokens_per_row, x.device)
        return y if tensors is None else apply_lora(x, y, tensors)

    def tensors(self, tokens: int, per_row: int, device: torch.device, complete: bool = False,
                padding: int = 0) -> LoRATensors | None:
        """What `apply_lora` takes for the mapping's rows, or None when there is nothing to add (unless
        `complete`: see the module docstring). `padding` rows of zeros follow the mapping's rows in the mask (the
        compiled step's padding rows)."""
        if not self.present:
            return None
        mapping = self.mapping
        if mapping.uniform == BASE_SLOT and not complete:
            return None
        key = (mapping.version, tokens, mapping.structure, complete, padding)
        st = self._state
        if st is None or st.key != key:
            st = self._state = _Stacked(key, self._stack(per_row, device, complete, padding))
        return st.tensors

    def release_stacks(self) -> None:
        """Forget the stacks of slots (`_stack`) that are copies, and the last forward's tensors; what was derived
        per adapter (`_kept`) stays, so stacking again copies and quantizes nothing new. A one-slot stack over int8
        weights is that slot's kept pieces themselves (`_shares_pieces`): it stays, as it costs no memory, and a
        lone request's 18 stackings on the demo took 0.60-0.72 ms of its 16-20 (Intel Xeon, 2026-12-08)."""
        self._state = None
        weights = self._weights
        if weights is not None:
            for key in [k for k in weights if not self._shares_pieces(k[0])]:
                del weights[key]
            if not weights:
                self._weights = None

    def _shares_pieces(self, used: tuple[int, ...]) -> bool:
        """Whether the stack of the slots `used` is the kept pieces themselves, not a copy: one slot over an int8
        base (`_stack_weights`; qgemm's packed stacks are only made over other bases, and are copies)."""
        return len(used) == 1 and self.int8_base is not None

    def _stack(self, per_row: int, device: torch.device, complete: bool, padding: int) -> LoRATensors:
        mapping = self.mapping
        rank, _, dtype = self._shape()
        used, contents = mapping.in_use()
        key = (used, contents, mapping.structure)
        if self._weights is None or self._weights_version != mapping.structure:
            self._weights = LRUCache(maxsize=self._stack_budget(), getsizeof=_tensor_bytes)
            self._weights_version = mapping.structure
        stacked = self._weights.get(key)
        if stacked is None:
            stacked = self._stack_packed(used) if self.packed else self._stack_weights(used)
            if _tensor_bytes(stacked) <= self._weights.maxsize:
                self._weights[key] = stacked
        a, b, a_int8, b_int8 = stacked
        mask = None
        if mapping.uniform is None or complete:
            mask = mapping.column_mask(used, rank, per_row, padding, device, dtype)
        fused = None if a_int8 is None else (*self._widened(key, a_int8), *b_int8)
        return a, b, mask, self.layout, fused

    def _stack_budget(self) -> int:
        """Bytes the kept stacks may take: every slot's A and B once, the most one stack of all slots needs (with
        its tile padding). Counted in entries (4 were kept), a 1.8B Hunyuan with 8 adapters in 8 slots kept up to
        four float32 copies of them after mixed traffic: 2,785 MB resident against 2,330 before it."""
        rank, slots, dtype = self._shape()
        size = torch.empty(0, dtype=dtype).element_size()
        per_slot = sum(layer.a_t.shape[1] * rank + rank * layer.b_t.shape[2] for layer in self._slot_layers)
        padding = len(self._slot_layers) * invariant.COLUMNS * self._slot_layers[0].a_t.shape[1]
        return (slots * per_slot + padding) * size

    def _shape(self) -> tuple[int, int, torch.dtype]:
        """The slot layers' rank, slots and the dtype their products run in, read once per structure (a module's
        attribute costs about a microsecond, and a change of the rows asks every group of the forward)."""
        memo = self._shape_memo
        if memo is None or memo[0] != self.mapping.structure:
            first = self._slot_layers[0]
            a_t = first.a_t
            # bfloat16 slots on the CPU (cache.slot_dtype) are multiplied in float32, what the CPU's lean steps
            # run; elsewhere in the slots' own dtype (a bfloat16 model on a GPU keeps its slots in bfloat16).
            dtype = torch.float32 if a_t.dtype == torch.bfloat16 and a_t.device.type == "cpu" else a_t.dtype
            memo = self._shape_memo = (self.mapping.structure, a_t.shape[2], a_t.shape[0], dtype)
        return memo[1], memo[2], memo[3]

    def _stack_weights(self, used: tuple[int, ...]) -> tuple[Any, ...]:
        """(A, B, None, None) in float32 over a float base, (None, None, A's int8 columns and their scales, B's int8
        rows and their scales) over an int8 one, for the slots `used`: only what is multiplied, so that a change of
        the slots in use (under many clients, nearly every admission) costs as few copies as it can. One slot
        takes its kept pieces as they are (no copy); several take one copy each of A, B and their scales."""
        layers = self._slot_layers
        if self.int8_base is None:
            # A's columns padded with zeros to whole GEMM tiles (`invariant`); `apply_lora` drops the extra ones.
            # In the products' dtype (`_shape`): float32 from bfloat16 slots on the CPU.
            dtype = self._shape()[2]
            a = invariant.padded(torch.cat([layer.a_t[s] for layer in layers for s in used], dim=1), -1,
                                 invariant.COLUMNS).to(dtype).contiguous()
            bs = [torch.cat([layer.b_t[s] for s in used], dim=0).to(dtype) for layer in layers]
            if len(bs) == 1 or len({b.shape[-1] for b in bs}) > 1:
                # One projection, or projections of different widths (grouped-query attention's Q, K and V): side
                # by side [U·r, Σ out], each multiplied by its own columns (`add_low_rank`). Stacked to the widest
                # they held the zero padding too: at HY-MT1.5-1.8B's Q/K/V a third of the copy.
                b = torch.cat(bs, dim=1) if len(bs) > 1 else bs[0]
            else:
                b = torch.stack(bs)   # [P, U·r, out]: one bmm
            return a, b.contiguous(), None, None
        if self._shares_pieces(used):
            a_q, a_scale, b_q, b_scale = self._quantized(used[0])
            return None, None, (a_q, a_scale), (b_q, b_scale)
        quantized = [self._quantized(s) for s in used]
        # Columns run projection by projection, then slot by slot (the mask's and B's layout); columns quantize
        # independently, so these equal quantizing the stacked A at once. B's rows run slot by slot.
        p, r = len(layers), self._shape()[0]
        a_q = torch.stack([q[0].view(-1, p, r) for q in quantized], dim=2).view(-1, p * len(used) * r)
        a_scale = torch.stack([q[1].view(p, r) for q in quantized], dim=1).view(-1)
        b_q = torch.cat([q[2] for q in quantized], dim=-2)
        b_scale = torch.cat([q[3] for q in quantized], dim=-1)
        return None, None, (a_q, a_scale), (b_q, b_scale)

    def _kept(self, slot: int) -> tuple[Any, ...] | None:
        """What was derived from the adapter `slot` holds (`_quantized`, `_packed_pieces`), kept by what the slot
        holds (`SlotMapping.content`) for twice as many adapters as there are slots, or None; the table is new
        whenever the layers' structure changes."""
        if self._pieces is None or self._pieces_version != self.mapping.structure:
            self._pieces, self._pieces_version = LRUCache(maxsize=2 * self._shape()[1]), self.mapping.structure
        return self._pieces.get(self.mapping.content(slot))

    def _quantized(self, slot: int) -> tuple[torch.Tensor, ...]:
        """A of `slot` for every projection of the group, side by side [in, P·r], as int8 columns and their
        scales [P·r], and B as int8 rows [P, r, out] (P = 1: [r, out]) and their scales [P, r] ([r]). Quantized once
        per adapter (what the slot holds, `SlotMapping.content`) and kept for twice as many adapters as there are
        slots: a 3-slot LRU under many pairs writes a slot at nearly every admission, mostly with an adapter it
        held before."""
        found = self._kept(slot)
        if found is None:
            layers = self._slot_layers
            content = self.mapping.content(slot)
            a = torch.cat([layer.a_t[slot] for layer in layers], dim=1) if len(layers) > 1 else layers[0].a_t[slot]
            a = a.to(torch.float32)
            bs = [quantize_matrix_rows(layer.b_t[slot].to(torch.float32)) for layer in layers]
            if len(bs) == 1:
                b_q, b_scale = bs[0]
            else:
                b_q, b_scale = _stack_outputs([q for q, _ in bs]), torch.stack([sc for _, sc in bs])
            found = self._pieces[content] = (*quantize_columns(a), b_q.contiguous(), b_scale.contiguous())
        return found

    def _widened(self, key: Any, a_int8: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The base's int8 weightᵀ with A's int8 columns (`a_int8`: the columns and their scales) after it, and the
        scales: views of the group's buffer."""
        if self._wide_holds is not None and self._wide_holds[0] == key:
            return self._wide_holds[1]
        weight_t, scale = self.int8_base  # type: ignore[misc]
        a_q, a_scale = a_int8
        out, extra = weight_t.shape[1], a_q.shape[1]
        rank, slots, _ = self._shape()
        room = len(self._slot_layers) * slots * rank  # every slot's columns, whatever the mix (≥ extra)
        if self._wide is None or self._wide[0].shape[1] < out + room:
            wide = weight_t.new_empty(weight_t.shape[0], out + room)
            wide_scale = scale.new_empty(out + room)
            wide[:, :out], wide_scale[:out] = weight_t, scale
            self._wide = (wide, wide_scale)
        wide, wide_scale = self._wide
        # Two copies whatever the slots in use (`_stack_weights` laid several slots' columns side by side once per
        # set): each tensor call gives the GIL up, and under many clients the slots in use change at nearly every
        # admission.
        wide[:, out:out + extra], wide_scale[out:out + extra] = a_q, a_scale
        # The whole buffer and the scales of the columns in use: `project` slices the weight to the scales' length.
        # Passed whole, it is one contiguous tensor whatever the room (a view's stride would be the room, which
        # grows with the slots, and an ahead-of-time compiled step fixes the strides it was compiled for).
        views = (wide, wide_scale[:out + extra])
        self._wide_holds = (key, views)
        return views

    def _stack_packed(self, used: tuple[int, ...]) -> tuple[Any, ...]:
        """(A as one qgemm weight of P·U·r columns, B as one qgemm weight per projection over U·r inputs, None,
        None) for the slots `used`: each slot's pieces (`_packed_pieces`) laid side by side in the kernel's layout,
        one copy of A's bytes and one of B's (no quantizing: that is done once per adapter)."""
        pieces = [self._packed_pieces(s) for s in used]
        a_cols = torch.stack([piece[0] for piece in pieces], dim=2)        # [in/4, P, U, r, 4]
        quads, p, u, r, _ = a_cols.shape
        n = p * u * r
        a_cols = a_cols.reshape(quads, n, 4)
        blocks = -(-n // BLOCK)
        if blocks * BLOCK != n:  # padding columns hold the grid's zero (the offset) and a zero scale
            a_cols = F.pad(a_cols, (0, 0, 0, blocks * BLOCK - n), value=_OFFSET)
        a_packed = a_cols.view(quads, blocks, BLOCK, 4).permute(1, 0, 2, 3).contiguous().view(-1)
        a_scale = F.pad(torch.stack([piece[1] for piece in pieces], dim=1).reshape(-1), (0, blocks * BLOCK - n))
        a = PackedBase(a_packed, a_scale, None, n, 8, quads * 4)
        bs = []
        for j, (_, width) in enumerate(self.layout):
            b_rows = torch.cat([piece[2][j] for piece in pieces], dim=1).contiguous().view(-1)  # [nb, U·r/4, 64, 4]
            bs.append(PackedBase(b_rows, _unit_scales(-(-width // BLOCK) * BLOCK), None, width, 8, u * r))
        return a, tuple(bs), None, None

    def _packed_pieces(self, slot: int) -> tuple[Any, ...]:
        """`slot`'s A and B on qgemm's 8-bit grid (±63, stored with its offset), kept per adapter like `_quantized`:
        (A's columns [in/4, P, r, 4] as the kernel reads them, their scales [P, r] times B's row scales, B per
        projection as `quant.packed.pack` lays it out, [column blocks, r/4, 64, 4]). A is quantized per column and B
        per row (rank index), so that a slot's pieces never depend on the other slots beside it: a row's result
        depends on its own adapter alone.
        B's row scales multiply h's columns (one per rank index), so they fold into A's column scales and B's
        columns keep a scale of one."""
        found = self._kept(slot)
        if found is None:
            layers = self._slot_layers
            content = self.mapping.content(slot)
            a = torch.stack([layer.a_t[slot].to(torch.float32) for layer in layers], dim=1)   # [in, P, r]
            inner, p, r = a.shape
            a_q, a_scale = symmetric(a, 0, _LEVELS)                                            # scales [P, r]
            b_scales, b_blocks = [], []
            for layer in layers:
                b_q, b_scale = symmetric(layer.b_t[slot].to(torch.float32), 1, _LEVELS)         # [r, out], [r]
                b_scales.append(b_scale)
                packed, _ = pack(b_q.t(), _unit_scales(b_q.shape[1]).view(-1, 1), 8)  # scales: `_stack_packed`
                b_blocks.append(packed.view(-1, r // 4, BLOCK, 4))
            a_u8 = (a_q.to(torch.int16) + _OFFSET).to(torch.uint8).view(inner // 4, 4, p, r).permute(0, 2, 3, 1)
            found = self._pieces[content] = (a_u8.contiguous(), a_scale * torch.stack(b_scales), tuple(b_blocks))
        return found


def apply_lora(x: torch.Tensor, y: torch.Tensor, tensors: LoRATensors) -> torch.Tensor:
    """y [N, out] += the LoRA term of x [N, in] (in place; returns y). Over an int8 base, h comes from A's int8
    columns of the widened weight (the same product `project` takes from its one GEMM)."""
    a, b, _, layout, fused = tensors
    if isinstance(a, PackedBase):
        h = qgemm_linear(x, a)
    elif a is not None:
        # Rows and columns in whole tiles, so that a row's h does not depend on the batch (`invariant`).
        h = invariant.mm(x, a)[:, :b.shape[-2] * len(layout)]
    else:
        used, extra = fused[1].shape[0], fused[2].shape[-2] * len(layout)  # P·U·r: the last columns in use
        h = int8_linear(x, fused[0][:, used - extra:used], fused[1][used - extra:], None)
    return add_low_rank(h, y, tensors)


def add_low_rank(h: torch.Tensor, y: torch.Tensor, tensors: LoRATensors) -> torch.Tensor:
    """y [N, out] += the B side of the LoRA term, given h = x @ A [N, P·U·r] (in place; returns y)."""
    _, b, mask, layout, fused = tensors
    if fused is not None:
        return _add_int8(h, y, mask, layout, fused[2], fused[3])
    if isinstance(b, tuple):  # qgemm's B per projection (`_stack_packed`)
        hp = h.view(h.shape[0], len(layout), -1)
        if mask is not None:
            hp = hp * mask[:, None, :]
        for j, (offset, width) in enumerate(layout):
            y[:, offset:offset + width].add_(qgemm_linear(hp[:, j], b[j]))
        return y
    if len(layout) == 1:
        if mask is not None:
            h = h * mask
        offset, width = layout[0]
        y[:, offset:offset + width].add_(invariant.mm(h, b))
        return y
    n, p = h.shape[0], len(layout)
    hp = h.view(n, p, -1)
    if mask is not None:
        hp = hp * mask[:, None, :]
    width = layout[0][1]
    if b.dim() == 2:
        # Projections of different widths (grouped-query attention's Q against K and V), their B side by side: one
        # GEMM each over its own columns. A bmm over B stacked to the widest read the zero padding too: at
        # HY-MT1.5-1.8B's Q/K/V (2048/512/512 outputs) twice the B bytes, and every step reads every attached
        # adapter's B.
        column = 0
        for j, (offset, w) in enumerate(layout):
            y[:, offset:offset + w].add_(invariant.mm(hp[:, j], b[:, column:column + w]))
            column += w
        return y
    delta = invariant.bmm(hp.transpose(0, 1), b)  # [P, N, out]
    if layout[-1][0] + width == y.shape[1] and p * width == y.shape[1]:
        y.view(n, p, width).add_(delta.transpose(0, 1))
    else:
        for j, (offset, w) in enumerate(layout):
            y[:, offset:offset + w].add_(delta[j])
    return y


def _add_int8(h: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None, layout: tuple[tuple[int, int], ...],
              b_q: torch.Tensor, b_scale: torch.Tensor) -> torch.Tensor:
    """The B side over an int8 base: h (masked to each row's own slot) times B's row scales, quantized per token,
    times B's int8 rows. A row's h holds only its own slot's columns after the mask, so its step, and its result,
    depend on it alone. In a batch of U adapters the masked GEMM multiplies U·r columns per row where r count; in
    float32 it was the largest cost of mixing pairs (N=64, U=8, 384 → 1024: 119 µs float32, 26 µs int8)."""
    n, p = h.shape[0], len(layout)
    hp = h.view(n, p, -1)
    if mask is not None:
        hp = hp * mask[:, None, :]
    if p == 1:  # B [U·r, out] and its scales [U·r], as for P projections with P = 1
        b_q, b_scale = b_q[None], b_scale[None]
    for j, (offset, width) in enumerate(layout):
        y[:, offset:offset + width].add_(int8_matmul(hp[:, j] * b_scale[j], b_q[j])[:, :width])
    return y


#: qgemm's 8-bit grid (fbgemm's ±63) and the offset its packed bytes are stored with.
_LEVELS, _OFFSET = GRID[8]


@functools.cache
def _unit_scales(n: int) -> torch.Tensor:
    """Scales of one for n columns (B's row scales are folded into h), made once per width and shared."""
    return torch.ones(n, dtype=torch.float32)


def _tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in a kept stack (nested tuples; None counts nothing)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, tuple):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _stack_outputs(bs: list[torch.Tensor]) -> torch.Tensor:
    """B matrices [k, out_p] of a group's projections stacked [P, k, widest out], narrower ones padded with zero
    columns (the int8 pieces: grouped-query attention's K and V are narrower than Q, and one int8 GEMM per
    projection takes its own columns)."""
    widest = max(b.shape[-1] for b in bs)
    return torch.stack([F.pad(b, (0, widest - b.shape[-1])) if b.shape[-1] != widest else b for b in bs])
