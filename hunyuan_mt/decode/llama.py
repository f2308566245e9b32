"""Llama-shaped decoder-only models (HunYuanDenseV1, the Hunyuan-MT family's architecture; Llama; Qwen2/Qwen3): a
lean decode step over a preallocated cache, beside the Marian one (`marian.py`) and over the same parts.

A decoder layer is a handful of calls, written out here instead of running transformers' modules: RMSNorm, one
fused Q/K/V projection (`dense.Projection`: one GEMM, int8 or float32, with every row's LoRA term from the grouped
slot layers), RoPE from the model's own rotary table, the query/key norms where the model has them (HunYuanDenseV1
after RoPE, Qwen3 before), the new keys and values written in place into the cache, attention for each row over
its own columns (the C++ kernel for one new token per row, grouped-query heads read in place), the output
projection; RMSNorm, one fused gate/up projection, SiLU, the down projection. The step is one pure function of
tensors, `llama_step`, so that it runs eagerly or compiled ahead of time like Marian's (`decode/compiled.py`).
tests/test_llama_step.py checks it against transformers' forward and greedy `generate` in float32.

The cache and the rows' alignment are Marian's (`kvcache.py`): keys/values `[rows, kv heads, columns, head_dim]` per
layer with spare room, right-aligned rows, an additive bias per row and column, per-row positions. Only the
key/value heads are stored (GQA: a 1.8B Hunyuan keeps 4 of its 16 heads), in the model's dtype or float16
(`model.kv_cache`).

A prefill runs the entering rows right-padded to a whole block of 16 tokens, each row's tokens from column 0 and
position 0, so that a row's arithmetic is the same whatever the rows beside it (invariant 5): the projections'
rows are independent (int8: per-token scales and exact int32 sums; float32: `invariant`), and the attention's
queries and keys over whole blocks (`kvcache._attend`). Only each row's last token goes through the output
projection (a [tokens, vocab] product for every prompt token would cost more than the layers of a 1.8B model).
The rows then move into the running batch's cache, right-aligned, and their first token is picked.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from .. import kernels
from ..quant.embedding import FileTable, Int8Embedding
from ..quant.embedding import embed as embed_tokens
from .batch import PrefillPiece, Sequence
from .dense import Projection, project
from .lean import LeanBatch
from .kvcache import _NEG, SelfCache, _block, _blocked, _cached_attention, _grown, _shift_right, compact, reserve

#: model_type → where the model applies its query/key norms: "after" RoPE (HunYuanDenseV1), "before" (Qwen3), or
#: None (no such norms).
QK_NORM = {"hunyuan_v1_dense": "after", "qwen3": "before", "llama": None, "qwen2": None}

#: RoPE kinds whose frequencies do not depend on the sequence length: the step reads one table by position.
#: ("dynamic" NTK without Hunyuan's fixed alpha recomputes them as the sequence grows.)
_STATIC_ROPE = {"default", "linear", "llama3", "yarn", "ntk_alpha"}

#: Hidden width from which every forward runs on all of torch's threads (see LlamaBatch._every_thread).
_WIDE_MODEL = 1024

#: A wide model's prefill runs its rows in groups of at most this many (padded) tokens, and a longer prompt in
#: pieces of this many, each a forward of its own (`engine.prefill_chunk_tokens` sets another). fbgemm's int8 GEMM
#: at the 1.8B's shapes ran at 735-758 GOPS for 64-256 rows of tokens and 556 for 1,024 (BENCHMARKS.md, bench/hunyuan_cpu.py),
#: and 16 prompts of 60 tokens prefilled in 6.2 s two at a time against 7.1-8.4 s all at once. The engine runs a
#: decode step of the live rows between two forwards, so a long prompt stalls them a piece at a time.
_PREFILL_TOKENS = 128


def lean_note(model: Any) -> str | None:
    """None when `LlamaBatch` can run `model`, else why not (the model then runs through its own forward,
    `causal.CausalBatch`)."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", type(model).__name__)
    if model_type not in QK_NORM:
        return f"{model_type} is not one of the Llama-shaped models the lean step is written for"
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not len(layers) or getattr(inner, "rotary_emb", None) is None:
        return f"{model_type}: no decoder layers or rotary embedding where the lean step looks for them"
    weight = inner.norm.weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return f"the lean decoder-only step is built for float32 (or int8) on the CPU, not {weight.dtype} on " \
               f"{weight.device.type}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"{model_type} uses {config.hidden_act}, the lean step SiLU"
    rope = getattr(inner.rotary_emb, "rope_type", "default")
    if rope not in _STATIC_ROPE:
        return f"RoPE {rope!r} depends on the sequence length"
    return None


@dataclass
class _Layer:
    """One decoder layer's projections and norms, in the order the step uses them."""

    qkv: Projection
    out: Projection
    gate_up: Projection
    down: Projection
    norms: tuple[tuple[torch.Tensor, float], tuple[torch.Tensor, float]]   # input, post-attention (weight, eps)
    qk_norms: tuple[tuple[torch.Tensor, float], tuple[torch.Tensor, float]] | None


class LlamaBatch(LeanBatch):
    FUSED = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.model.config
        self.inner = self.model.model
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.scaling = self.head_dim ** -0.5
        self.qk_norm = QK_NORM[cfg.model_type]
        self.cache: SelfCache | None = None
        self._layers: list[_Layer] = []
        self._head: Projection | None = None
        self._args: tuple[Any, ...] = ()
        #: cos, sin by position (`_rope`).
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None
        #: A step reads so many weights that even one row pays for every thread: HY-MT1.5-1.8B's (hidden 2048,
        #: int8, fbgemm, Intel Xeon with AMX) one-row step took 179 ms on one thread, 119 ms on two. The base
        #: class gives a few rows one thread, which the demo-sized models measured faster.
        self._every_thread = cfg.hidden_size >= _WIDE_MODEL
        #: Padded tokens per prefill forward (`_prefill`); None: every entering row in one forward.
        self.prefill_tokens: int | None = _PREFILL_TOKENS if self._every_thread else None

    # ------------------------------------------------------------------ the model's weights, fused

    def _build(self) -> list[_Layer]:
        """The step's view of the model, rebuilt when the slot layers change (modules wrapped, slots grown)."""
        stale = self._stale(self.inner)
        if stale is None:
            return self._layers
        layout, plain = stale
        mapping = self.mapping
        layers = []
        for layer in self.inner.layers:
            sa, mlp = layer.self_attn, layer.mlp
            qk = None
            if self.qk_norm is not None:
                qn = getattr(sa, "query_layernorm", None) or getattr(sa, "q_norm")
                kn = getattr(sa, "key_layernorm", None) or getattr(sa, "k_norm")
                qk = (_rms_params(qn), _rms_params(kn))
            layers.append(_Layer(
                qkv=Projection([sa.q_proj, sa.k_proj, sa.v_proj], mapping),
                out=Projection([sa.o_proj], mapping),
                gate_up=Projection([mlp.gate_proj, mlp.up_proj], mapping),
                down=Projection([mlp.down_proj], mapping),
                norms=(_rms_params(layer.input_layernorm), _rms_params(layer.post_attention_layernorm)),
                qk_norms=qk,
            ))
        self._head = Projection([self.model.lm_head], None)
        self._layers, self._layout = layers, layout
        self._args = self._model(plain)
        return layers

    def _model(self, plain: bool = False) -> tuple[Any, ...]:
        """The weights as `llama_step` takes them (tensors and the architecture's constants)."""
        pick = (lambda p: p.plain) if plain else (lambda p: p.base)
        table = self.inner.embed_tokens
        # A table read from its file is looked up before the step (`_forward`): the step gets vectors, not ids.
        return (None if isinstance(table, FileTable) else table.tensors if isinstance(table, Int8Embedding)
                else table.weight,
                (self.heads, self.kv_heads, self.head_dim, self.scaling, self._attention_kernel(), self.qk_norm),
                tuple((tuple(pick(p) for p in _step_projections(layer)), layer.norms, layer.qk_norms)
                      for layer in self._layers),
                _rms_params(self.inner.norm), pick(self._head))

    def _attention_kernel(self) -> Any:
        weight = self.inner.norm.weight
        return kernels.decode_attention() if kernels.usable(weight.device, weight.dtype, self.head_dim) else None

    def _rope(self, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [≥ positions, head_dim] from the model's own rotary embedding (its scaling included), grown
        by doubling: a position's row is what the model computes for it."""
        table = self._rope_table
        if table is None or table[0].shape[0] < positions:
            size = _grown(0 if table is None else table[0].shape[0], positions, 256)
            rotary, weight = self.inner.rotary_emb, self.inner.norm.weight
            pos = torch.arange(size, device=weight.device)[None]
            cos, sin = rotary(weight[:1][None], pos)
            table = (cos[0].contiguous(), sin[0].contiguous())
            self._rope_table = table
        return table

    # ------------------------------------------------------------------ the step

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, k: list[torch.Tensor],
                 v: list[torch.Tensor], last: torch.Tensor | None = None, step: Any = None) -> torch.Tensor:
        layers = self._build()
        b, t = ids.shape
        complete = step is not None
        padding = 0 if step is None else step.padding(b)
        lora = self._lora_terms(layers, b * t, t, ids.device, complete, padding)
        cos, sin = self._rope(int(pos.max()) + 1)
        if self._args[0] is None:
            ids = self.inner.embed_tokens(ids)    # FileTable: read outside the step (a file read, not tensor math)
        if step is not None:
            return step(ids, pos, mask, k, v, cos, sin, self._args, lora)
        return llama_step(ids, pos, mask, k, v, cos, sin, self._args, lora, last)

    @staticmethod
    def _projections(layer: _Layer) -> tuple[Projection, ...]:
        return _step_projections(layer)

    def _decode_threads(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if self._every_thread else super()._decode_threads()

    def _prefill_threads(self, tokens: int) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if self._every_thread else super()._prefill_threads(tokens)

    # ------------------------------------------------------------------ RunningBatch's moves

    def _prefill(self, sequences: list[Sequence]) -> tuple[torch.Tensor, Any]:
        """The entering rows whole, in one forward: their first logits and keys/values."""
        lengths = [len(s.input_ids) for s in sequences]
        width = _block(max(lengths))
        k, v = self._prefill_cache(len(sequences), width, torch.empty)   # the forward writes every column
        return self._prefill_span(sequences, 0, width, k, v), (k, v, lengths)

    def _prefill_pieces(self, sequences: list[Sequence], dropped: set[Any]) -> Iterator[PrefillPiece]:
        """Groups of entering rows of at most `prefill_tokens` padded tokens, and a prompt longer than that in
        pieces of `prefill_tokens` tokens, each a forward. A row's prefill does not depend on the rows beside it
        (invariant 5), nor on where its prompt is cut (tests/test_llama_step.py): neither changes a bit."""
        budget = self.prefill_tokens
        for group in _prefill_groups(sequences, budget):
            group = [s for s in group if s.tag not in dropped]
            if not group:
                continue
            if budget is not None and len(group[0].input_ids) > budget:
                yield from self._prefill_long(group[0], budget, dropped)   # alone in its group
                continue
            with self._prefill_forward(group, sum(len(s.input_ids) for s in group)):
                result = self._prefill(group)
            yield group, result

    def _prefill_long(self, seq: Sequence, budget: int, dropped: set[Any]) -> Iterator[PrefillPiece]:
        """One prompt in pieces of `budget` tokens (a whole number of blocks): each piece's queries attend to the
        keys of the pieces before it, which the same key/value tensors keep. The last piece is padded to a whole
        block, as a whole prefill is."""
        length = len(seq.input_ids)
        width = _block(length)
        # Zeros, not empty: a piece reads only the columns of the pieces before it, but whole blocks of them.
        k, v = self._prefill_cache(1, width, torch.zeros)
        for start in range(0, length, budget):
            if seq.tag in dropped:
                return
            stop = min(start + budget, length)
            with self._prefill_forward([seq], stop - start):
                logits = self._prefill_span([seq], start, width if stop == length else stop, k, v)
            yield [seq], ((logits, (k, v, [length])) if stop == length else None)

    def _prefill_cache(self, rows: int, width: int, make: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Keys and values for a prefill: `make` (torch.empty or torch.zeros) [rows, kv heads, width, head_dim]
        per layer, in the model's dtype."""
        layers, dtype = self._build(), self.inner.norm.weight.dtype

        def one() -> list[torch.Tensor]:
            return [make(rows, self.kv_heads, width, self.head_dim, dtype=dtype, device=self.device) for _ in layers]

        return one(), one()

    def _prefill_span(self, sequences: list[Sequence], start: int, end: int, k: list[torch.Tensor],
                      v: list[torch.Tensor]) -> torch.Tensor:
        """Tokens start..end-1 of every row (each right-padded past its prompt) at positions start..end-1, their
        keys and values into those columns of `k`/`v`: the logits of each row's last prompt token, where it falls
        in this span (else of its last position here, thrown away)."""
        self._build()
        lengths = [len(s.input_ids) for s in sequences]
        n, t = len(sequences), end - start
        ids = torch.tensor([s.input_ids[start:end] + (self.pad_id,) * (t - len(s.input_ids[start:end]))
                            for s in sequences], dtype=torch.long, device=self.device)
        pos = torch.arange(start, end, device=self.device).expand(n, t)
        lens = torch.tensor(lengths, device=self.device)
        dtype = self.inner.norm.weight.dtype
        # Causal over every column before it, and a row sees none of its padding; a padding query sees its row's
        # tokens (it is thrown away).
        col = torch.arange(end, device=self.device)
        visible = (col[None, None, :] <= pos[:, :, None]) & (col[None, None, :] < lens[:, None, None])
        mask = torch.zeros(n, 1, t, end, dtype=dtype, device=self.device).masked_fill(~visible[:, None], _NEG[dtype])
        return self._forward(ids, pos, mask, k, v, last=lens.clamp(max=end) - 1 - start)

    def _merge(self, state: Any) -> None:
        k, v, lengths = state
        n, longest = len(lengths), max(lengths)
        mine = self.cache
        dtype = self.kv_dtype or k[0].dtype
        if mine is None or not self.rows:
            def empty() -> list[torch.Tensor]:
                return [t.new_zeros(0, self.kv_heads, 0, self.head_dim, dtype=dtype) for t in k]

            mine = self.cache = SelfCache(0, 0, empty(), empty(), k[0].new_zeros(0, 0))
        width = max(mine.length, longest)
        reserve(mine, mine.rows + n, width + 1)
        if width > mine.length:
            _shift_right(mine, width - mine.length)
        # Each entering row right-aligned below the live ones; what it does not fill stays masked.
        at = mine.rows
        mine.bias[at:at + n] = _NEG[mine.bias.dtype]
        for i, length in enumerate(lengths):
            for store, theirs in ((mine.k, k), (mine.v, v)):
                for s, o in zip(store, theirs):
                    s[at + i, :, width - length:width] = o[i, :, :length]
            mine.bias[at + i, width - length:width] = 0.0
        mine.rows, mine.length = at + n, width

    def _decode(self, last: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cache = self.cache
        assert cache is not None
        step = self._step()
        if step is None:
            reserve(cache, cache.rows, _block(cache.length + 1))
        else:
            reserve(cache, max(cache.rows, step.MIN_ROWS) + 1, cache.length + 2)
        cache.bias[:cache.rows, cache.length] = 0.0
        mask = cache.bias[:cache.rows, None, None, :cache.length + 1]
        logits = self._forward(last, pos, mask, cache.k, cache.v, step=step)
        cache.length += 1
        return logits

    @torch.inference_mode()
    def _select(self, keep: list[int]) -> None:
        cache = self.cache
        if not keep:
            self.cache = None
            return
        assert cache is not None
        compact(cache, keep, self.device)


def _prefill_groups(sequences: list[Sequence], budget: int | None) -> list[list[Sequence]]:
    """`sequences` in order, cut into groups whose rows × padded width (`_block` of the longest) stay within
    `budget` tokens; a row longer than the budget is a group of its own."""
    if budget is None:
        return [sequences]
    groups: list[list[Sequence]] = []
    current: list[Sequence] = []
    for seq in sequences:
        widest = max([len(s.input_ids) for s in current] + [len(seq.input_ids)])
        if current and (len(current) + 1) * _block(widest) > budget:
            groups.append(current)
            current = []
        current.append(seq)
    return groups + [current] if current else groups


def _rms_params(norm: Any) -> tuple[torch.Tensor, float]:
    eps = getattr(norm, "variance_epsilon", None)
    return norm.weight, float(getattr(norm, "eps", 1e-6) if eps is None else eps)


def _rms(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
    """RMSNorm as transformers' Llama-family modules compute it (in float32, weight applied last)."""
    weight, eps = norm
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as transformers applies it: x·cos + rotate_half(x)·sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _step_projections(layer: _Layer) -> tuple[Projection, ...]:
    return layer.qkv, layer.out, layer.gate_up, layer.down


def llama_step(ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, k: list[torch.Tensor],
               v: list[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor, model: tuple[Any, ...],
               lora: Any, last: torch.Tensor | None = None) -> torch.Tensor:
    """Feed `ids` [B, T] (or their vectors [B, T, hidden] where the model's table is None: `FileTable`) at positions
    `pos` [B, T]: logits [B, vocab] of each row's last position (or of position `last[b]`). A pure function of
    tensors, compiled by `decode/compiled.py`.

    The new keys and values are written into `k`/`v` (per layer `[rows ≥ B, kv heads, columns, head_dim]`) at
    columns end-T..end-1, where end is the width of `mask` ([B, 1, T, end], additive). `cos`/`sin` are the rotary
    table by position; `model` is `LlamaBatch._model()`, `lora` each layer's LoRA tensors per projection."""
    embed, (h, kvh, hd, scaling, kernel, qk_mode), layers, final_norm, head = model
    b, t = ids.shape[:2]
    n = b * t
    kernel = kernel if t == 1 else None
    end = width = mask.shape[-1]
    if kernel is None and not torch.compiler.is_compiling():
        # Written-out attention reads whole blocks of columns (kvcache._attend says why).
        width = _block(end)
        mask = _blocked(mask, -1, _NEG[mask.dtype])
    cos, sin = cos[pos][:, :, None], sin[pos][:, :, None]          # [B, T, 1, head_dim]
    x = (ids if embed is None else embed_tokens(ids, embed)).reshape(n, -1)
    for i, ((qkv_w, out_w, gate_up_w, down_w), norms, qk_norms) in enumerate(layers):
        qkv_l, out_l, gate_up_l, down_l = lora[i]
        qkv = project(_rms(x, norms[0]), qkv_w, qkv_l)
        q = qkv[:, :h * hd].view(b, t, h, hd)
        key = qkv[:, h * hd:(h + kvh) * hd].view(b, t, kvh, hd)
        value = qkv[:, (h + kvh) * hd:].view(b, t, kvh, hd)
        if qk_mode == "before":
            q, key = _rms(q, qk_norms[0]), _rms(key, qk_norms[1])
        q, key = _rotate(q, cos, sin), _rotate(key, cos, sin)
        if qk_mode == "after":
            q, key = _rms(q, qk_norms[0]), _rms(key, qk_norms[1])
        k[i][:b, :, end - t:end] = key.transpose(1, 2)
        v[i][:b, :, end - t:end] = value.transpose(1, 2)
        attn = _cached_attention(q.transpose(1, 2), k[i], v[i], mask, width, scaling, kernel)
        x = x + project(attn, out_w, out_l)
        gate_up = project(_rms(x, norms[1]), gate_up_w, gate_up_l)
        gate, up = gate_up.chunk(2, dim=-1)
        x = x + project(F.silu(gate) * up, down_w, down_l)
    x = x.view(b, t, -1)
    x = x[:, -1] if last is None else x[torch.arange(b, device=x.device), last]
    return project(_rms(x, final_norm), head, None)

