"""Marian (encoder-decoder): the encoder once per row, then a lean decoder step over a preallocated cache.

The decode step is written out here instead of calling transformers' decoder modules: for each layer one fused
Q/K/V projection, the new keys and values written in place into the cache, attention over the rows' columns,
the output projection, the cross-attention over keys/values computed once per row at prefill, and the
feed-forward block, each projection with its LoRA term (`dense.Projection`). It is one pure function of tensors,
`decoder_step`, which runs eagerly or compiled (`decode/compiled.py`, the CPU service's default). Its output equals
transformers' decoder forward on the same rows (tests/test_lean_step.py compares logits per step, float32).

The cache is preallocated: keys/values `[rows, heads, columns, head_dim]` per layer with room for more rows and
columns than are in use, grown by doubling, in the model's dtype or in float16 (`model.kv_cache`: a step's attention
is bound by memory on the CPU; the attention kernel widens them as it reads). Rows are aligned on the right: a row
that joins with a shorter history has its leading columns masked (an additive bias per row and column), and every
row carries its own positions, so it computes what it computes alone. A decode step writes one column for every row;
a row leaving is cut out with the next compaction (a copy of the rows kept, which also drops leading columns no row
uses).

The encoder runs once per row, at prefill, through the same written-out layers, together with every decoder
layer's cross-attention keys/values (`encode_cross`; the slot layers give each row its adapter there too). When
every entering row's decoder prefix is the start token alone (Marian's own vocabularies), that is the whole
prefill: the rows join with an empty self-attention history and get their first token in the next decode step,
beside the running rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .. import kernels
from .batch import Sequence, left_padded, positions
from .dense import Projection, project
from .lean import LeanBatch
from .kvcache import (_NEG, START_COLUMNS, SelfCache, _block, _blocked, _cached_attention, _grown, _place, _regrow,
                      _shift_right, compact, reserve)



@dataclass
class _Layer:
    """One decoder layer's projections and norms, in the order the step uses them."""

    qkv: Projection
    out: Projection
    cross_q: Projection
    cross_kv: Projection
    cross_out: Projection
    fc1: Projection
    fc2: Projection
    norms: tuple[tuple[torch.Tensor, torch.Tensor, float], ...]   # self-attn, cross-attn, final (weight, bias, eps)
    activation: Any


@dataclass
class _EncoderLayer:
    qkv: Projection
    out: Projection
    fc1: Projection
    fc2: Projection
    norms: tuple[tuple[torch.Tensor, torch.Tensor, float], ...]   # self-attn, final
    activation: Any


@dataclass
class _Cache(SelfCache):
    """Keys/values of some rows: self-attention (SelfCache) and cross-attention (`ck`, `cv` per layer over the
    source, `cbias`)."""

    ck: list[torch.Tensor]
    cv: list[torch.Tensor]
    cbias: torch.Tensor         # [row capacity, source capacity]
    source: int                 # source columns in use


class MarianBatch(LeanBatch):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decoder = self.model.get_decoder()
        cfg = self.decoder.config
        self.heads = cfg.decoder_attention_heads
        self.dim = cfg.d_model
        self.head_dim = self.dim // self.heads
        self.scaling = self.head_dim ** -0.5
        self.cache: _Cache | None = None
        self._layers: list[_Layer] = []
        self._head: Projection | None = None
        #: The final logits bias the step adds after the output projection: None where that GEMM carries it.
        self._logits_bias: torch.Tensor | None = None
        self._encoder: list[_EncoderLayer] = []
        self._decoder_args: tuple[Any, ...] = ()
        self._encoder_args: tuple[Any, ...] = ()
        #: The compiled encoder (`decode/compiled.py`; the step is LeanBatch.compiled); None: eager.
        self.compiled_encoder: Any = None

    # ------------------------------------------------------------------ the model's weights, fused

    def _build(self) -> list[_Layer]:
        """The step's view of the model, rebuilt when the slot layers change (modules wrapped, slots grown)."""
        stale = self._stale(self.decoder)
        if stale is None:
            return self._layers
        layout, plain = stale
        mapping = self.mapping
        layers = []
        for layer in self.decoder.layers:
            sa, ca = layer.self_attn, layer.encoder_attn
            layers.append(_Layer(
                qkv=Projection([sa.q_proj, sa.k_proj, sa.v_proj], mapping),
                out=Projection([sa.out_proj], mapping),
                cross_q=Projection([ca.q_proj], mapping),
                cross_kv=Projection([ca.k_proj, ca.v_proj], mapping),
                cross_out=Projection([ca.out_proj], mapping),
                fc1=Projection([layer.fc1], mapping),
                fc2=Projection([layer.fc2], mapping),
                norms=tuple((n.weight, n.bias, n.eps) for n in (layer.self_attn_layer_norm,
                                                                   layer.encoder_attn_layer_norm,
                                                                   layer.final_layer_norm)),
                activation=_activation(layer.activation_fn),
            ))
        self._encoder = [_EncoderLayer(
            qkv=Projection([e.self_attn.q_proj, e.self_attn.k_proj, e.self_attn.v_proj], mapping),
            out=Projection([e.self_attn.out_proj], mapping),
            fc1=Projection([e.fc1], mapping),
            fc2=Projection([e.fc2], mapping),
            norms=tuple((n.weight, n.bias, n.eps) for n in (e.self_attn_layer_norm, e.final_layer_norm)),
            activation=_activation(e.activation_fn),
        ) for e in self.model.get_encoder().layers]
        final, head = getattr(self.model, "final_logits_bias", None), self.model.lm_head
        final = None if final is None else final.reshape(-1)  # a buffer [1, vocab]
        # The final logits bias rides in the output projection's GEMM where that has no bias of its own.
        in_head = final is not None and getattr(head, "bias", None) is None
        self._head = Projection([head], None, bias=final if in_head else None)
        self._logits_bias = None if in_head else final
        self._layers, self._layout = layers, layout
        # What decoder_step / encoder_forward take, built once per layout rather than at every forward.
        self._decoder_args, self._encoder_args = self._model(plain), self._encoder_model(plain)
        self._cross_args = tuple(_base(layer.cross_kv, plain) for layer in layers)
        return layers

    def _encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """The encoder over right-padded sources [n, S] (mask 1 for real tokens): hidden states [n, S, d], as
        transformers' MarianEncoder computes them (post-norm layers, sinusoidal positions from 0). Eager; a
        prefill runs `_cross`."""
        self._build()
        mask, lora = self._encoder_inputs(src, src_mask, complete=False, padding=0)
        return encoder_forward(src, mask, self._encoder_args, lora)

    def _encoder_inputs(self, src: torch.Tensor, src_mask: torch.Tensor, complete: bool,
                        padding: int) -> tuple[Any, Any]:
        """The additive source mask and the encoder layers' LoRA terms for sources [rows, width], whose last
        `padding` tokens are padding rows."""
        rows, width = src.shape
        dtype = self.model.get_encoder().embed_tokens.weight.dtype
        mask = torch.zeros(rows, 1, 1, width, dtype=dtype, device=src.device).masked_fill(
            src_mask[:, None, None, :] == 0, _NEG[dtype])
        lora = [tuple(p.lora_tensors(rows * width, width, src.device, complete, padding)
                      for p in (layer.qkv, layer.out, layer.fc1, layer.fc2)) for layer in self._encoder]
        return mask, lora

    def _cross(self, src: torch.Tensor, src_mask: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The cross-attention keys and values of every decoder layer ([n, heads, S, head_dim] each) for right-padded
        sources [n, S]: the encoder and the decoder's cross K/V projections in one call (`encode_cross`; compiled,
        one package; run eagerly after the encoder, the projections took 132 ms of a 2.0 s run of 600 sentences)."""
        layers = self._build()
        n, source = src.shape
        step = self.compiled_encoder if self._step() is not None else None
        rows, width = n, source
        if step is not None:
            # Away from 1 for the compiled graph (decode/compiled.py): a masked padding column, and a padding row
            # unless the source is alone (a package of its own).
            rows, width = step.rows(n), max(source, step.MIN_ROWS)
            src = F.pad(src, (0, width - source, 0, rows - n), value=self.pad_id)
            src_mask = F.pad(src_mask, (0, width - source, 0, rows - n))
        complete, padding = step is not None, (rows - n) * width
        mask, lora = self._encoder_inputs(src, src_mask, complete, padding)
        cross = [layer.cross_kv.lora_tensors(rows * width, width, src.device, complete, padding) for layer in layers]
        kv = (step or encode_cross)(src, mask, self._encoder_args, lora, self._cross_args, cross)
        kv = kv[:, :, :n, :, :source]
        # Views, not copies: the rows are copied once anyway, into the running batch's cache (`_place`) or, for a
        # batch of their own, into the room the first step reserves (`_reserve`). A contiguous copy here cost a
        # pass over every cross-attention key and value of every prefill for nothing.
        return [kv[i, 0] for i in range(len(kv))], [kv[i, 1] for i in range(len(kv))]

    def _encoder_model(self, plain: bool = False) -> tuple[Any, ...]:
        """The encoder's weights as `encoder_forward` takes them (`plain`: float weights unpacked)."""
        enc = self.model.get_encoder()
        return (enc.embed_tokens.weight, enc.embed_positions.weight, float(enc.embed_scale),
                (self.heads, self.head_dim, self.scaling),
                tuple((tuple(_base(p, plain) for p in (layer.qkv, layer.out, layer.fc1, layer.fc2)), layer.norms,
                       layer.activation) for layer in self._encoder))

    # ------------------------------------------------------------------ the step

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor, cache: _Cache, step: Any = None) -> torch.Tensor:
        """Feed `ids` [B, T] at positions `pos` [B, T] to the decoder rows of `cache` (B = cache.rows), writing
        their keys/values at columns length..length+T-1 (whose bias the caller has set); logits of the last
        position [B, vocab]. `step` runs `decoder_step` compiled (`decode/compiled.py`; T = 1 only)."""
        layers = self._build()
        b, t = ids.shape
        end = cache.length + t
        mask = cache.bias[:b, None, None, :end]
        if t > 1:
            causal = torch.ones(t, end, dtype=torch.bool, device=ids.device).tril(cache.length)
            mask = mask.masked_fill(~causal, _NEG[mask.dtype])
        cmask = cache.cbias[:b, None, None, :cache.source]
        complete = step is not None
        padding = 0 if step is None else step.padding(b)
        lora = self._lora_terms(layers, b * t, t, ids.device, complete, padding)
        return (step or decoder_step)(ids, pos, mask, cmask, cache.k, cache.v, cache.ck, cache.cv,
                                      self._decoder_args, lora)

    @staticmethod
    def _projections(layer: _Layer) -> tuple[Projection, ...]:
        return _step_projections(layer)

    def _model(self, plain: bool = False) -> tuple[Any, ...]:
        """The decoder's weights as `decoder_step` takes them (tensors, and the constants of the architecture;
        `plain`: float weights unpacked)."""
        dec = self.decoder
        return (dec.embed_tokens.weight, dec.embed_positions.weight, float(dec.embed_scale),
                (self.heads, self.head_dim, self.scaling, self._attention_kernel()),
                tuple((tuple(_base(p, plain) for p in _step_projections(layer)), layer.norms, layer.activation)
                      for layer in self._layers),
                _base(self._head, plain), self._logits_bias)

    def _attention_kernel(self) -> Any:
        """The CPU kernel a decode step attends with (`kernels.decode_attention`), or None: tensor operations
        (`_attend`; a GPU, half precision, a head size it does not take, or the kernel could not be built)."""
        weight = self.decoder.embed_tokens.weight
        return kernels.decode_attention() if kernels.usable(weight.device, weight.dtype, self.head_dim) else None

    # ------------------------------------------------------------------ RunningBatch's moves

    def _prefill(self, sequences: list[Sequence]) -> tuple[torch.Tensor | None, Any]:
        width = max(len(s.input_ids) for s in sequences)
        # Sources are right-padded, as for a whole-batch generate: Marian's encoder positions start at the first
        # token whatever the padding.
        src = torch.tensor([s.input_ids + (self.pad_id,) * (width - len(s.input_ids)) for s in sequences],
                           dtype=torch.long, device=self.device)
        src_mask = torch.tensor([[1] * len(s.input_ids) + [0] * (width - len(s.input_ids)) for s in sequences],
                                dtype=torch.long, device=self.device)
        cache = self._new_cache(*self._cross(src, src_mask), src_mask)
        if all(len(s.decoder_prefix) == 1 for s in sequences):
            return None, cache
        ids, mask = left_padded([s.decoder_prefix for s in sequences], self.pad_id, self.device)
        self._open_columns(cache, mask)
        logits = self._forward(ids, positions(mask), cache)
        cache.length += ids.shape[1]
        return logits, cache

    def _new_cache(self, ck: list[torch.Tensor], cv: list[torch.Tensor], src_mask: torch.Tensor) -> _Cache:
        """An empty self-attention cache for the rows of `src_mask`, with their cross-attention keys/values."""
        layers = self._build()
        (rows, source), dtype = src_mask.shape, ck[0].dtype
        cbias = torch.zeros(rows, source, dtype=dtype, device=self.device).masked_fill(src_mask == 0, _NEG[dtype])
        if self.kv_dtype is not None and self.kv_dtype != dtype:
            ck, cv = [t.to(self.kv_dtype) for t in ck], [t.to(self.kv_dtype) for t in cv]
        # No self-attention columns yet: entering rows usually merge into a running batch, whose cache gets their
        # columns; zero-filling room here (rows × 32 columns × 12 tensors) cost a memset per prefill for nothing.
        columns = 0
        k = [ck[0].new_zeros(rows, self.heads, columns, self.head_dim) for _ in layers]
        v = [ck[0].new_zeros(rows, self.heads, columns, self.head_dim) for _ in layers]
        bias = torch.full((rows, columns), _NEG[dtype], dtype=dtype, device=self.device)
        return _Cache(rows, 0, k, v, bias, ck, cv, cbias, source)

    def _open_columns(self, cache: _Cache, mask: torch.Tensor) -> None:
        """Make room for mask.shape[1] more columns and unmask them where `mask` is 1."""
        t = mask.shape[1]
        _reserve(cache, cache.rows, _block(cache.length + t), source=_block(cache.source))
        cache.bias[:cache.rows, cache.length:cache.length + t] = torch.where(
            mask.bool(), 0.0, _NEG[cache.bias.dtype]).to(cache.bias.dtype)

    def _merge(self, state: Any) -> None:
        new: _Cache = state
        mine = self.cache
        if mine is None or not self.rows:
            self.cache = new
            return
        width = max(mine.length, new.length)
        rows = mine.rows + new.rows
        _reserve(mine, rows, width + 1, source=max(mine.source, new.source))
        if width > mine.length:
            _shift_right(mine, width - mine.length)
        # The entering rows go below the live ones, right-aligned in the self-attention columns; what they do not
        # fill stays masked.
        _place((mine.k, mine.v), mine.bias, (new.k, new.v), new.bias, mine.rows, new.rows, width - new.length,
               new.length)
        _place((mine.ck, mine.cv), mine.cbias, (new.ck, new.cv), new.cbias, mine.rows, new.rows, 0, new.source)
        mine.rows, mine.length, mine.source = rows, width, max(mine.source, new.source)

    def _decode(self, last: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cache = self.cache
        assert cache is not None
        step = self._step()
        if step is None:
            _reserve(cache, cache.rows, _block(cache.length + 1), source=_block(cache.source))
        else:
            # Keep every dimension the compiled graph sees away from a special value (decode/compiled.py): rows
            # that joined with an empty history see one masked column rather than a cache one column wide, and
            # the cache tensors keep room beyond the rows and columns in use (a slice that spans a whole
            # tensor would be a graph of its own).
            if cache.length == 0:
                _reserve(cache, cache.rows, 2)
                cache.length = 1
            _reserve(cache, max(cache.rows, step.MIN_ROWS) + 1, cache.length + 2, source=cache.source + 1)
        cache.bias[:cache.rows, cache.length] = 0.0
        logits = self._forward(last, pos, cache, step)
        cache.length += 1
        return logits

    @torch.inference_mode()  # the engine compacts after answering rows, outside its forwards
    def _select(self, keep: list[int]) -> None:
        cache = self.cache
        if not keep:
            self.cache = None
            return
        assert cache is not None
        # Self-attention drops leading columns no kept row sees (kvcache.compact); cross-attention, trailing source
        # columns.
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        src_used = (cache.cbias.index_select(0, index)[:, :cache.source] == 0).any(dim=0).nonzero()
        source = int(src_used[-1]) + 1 if src_used.numel() else 0
        compact(cache, keep, self.device, (((cache.ck, cache.cv), cache.cbias, source),))
        cache.source = source


def encoder_forward(src: torch.Tensor, mask: torch.Tensor, model: tuple[Any, ...],
                    lora: list[tuple[Any, ...]]) -> torch.Tensor:
    """The encoder over token ids `src` [n, S] with an additive `mask` [n, 1, 1, S]: hidden states [n, S, d]. A
    pure function of tensors like `decoder_step` (compiled the same way); `model` is `MarianBatch._encoder_model()`,
    `lora` each layer's LoRA tensors for Q/K/V, out, fc1, fc2."""
    embed, positions, embed_scale, (h, hd, scaling), layers = model
    n, source = src.shape
    d = h * hd
    pos = torch.arange(source, device=src.device)
    x = (F.embedding(src, embed) * embed_scale + F.embedding(pos, positions)).reshape(n * source, d)
    fp16 = x.dtype == torch.float16
    for i, ((qkv_w, out_w, fc1_w, fc2_w), norms, activation) in enumerate(layers):
        qkv_l, out_l, fc1_l, fc2_l = lora[i]
        qkv = project(x, qkv_w, qkv_l).view(n, source, 3, h, hd).permute(2, 0, 3, 1, 4)
        attn = _encoder_attention(qkv[0], qkv[1], qkv[2], mask, scaling)
        x = _norm(x + project(attn.transpose(1, 2).reshape(n * source, d), out_w, out_l), norms[0])
        x = _norm(x + project(activation(project(x, fc1_w, fc1_l)), fc2_w, fc2_l), norms[1])
        if fp16 and not torch.isfinite(x).all():
            # transformers clamps fp16 overflow after each encoder layer; so do we, to compute the same.
            limit = torch.finfo(x.dtype).max - 1000
            x = x.clamp(min=-limit, max=limit)
    return x.view(n, source, d)


def _encoder_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                       scale: float) -> torch.Tensor:
    """The encoder's self-attention: SDPA over queries and keys padded to whole blocks (`_blocked`; zero keys and
    values, masked), so that a row's result does not depend on the sources beside it: its scores' GEMM then has no
    query or key of the row's in a partial tile (`_attend` says why). A row's keys start at column 0 whatever the
    batch, so SDPA's float32 sums add the same lanes in the same order, and the padding adds exact zeros: 0 of 47
    held-out sentences differed beside a longer one (8-column blocks: 16 of 47; queries unpadded: random cases in
    tests/test_batch_invariance.py differed). SDPA's fused kernel is faster than `_attend` over the square score
    matrix of a prefill (eager, 2 threads, medians of 5: 1 × 9 tokens 153 against 268 µs, 64 × 27 6.1 against
    7.2 ms, 16 × 120 12.4 against 15.5 ms)."""
    return F.scaled_dot_product_attention(_blocked(q, -2), _blocked(k, -2), _blocked(v, -2),
                                          attn_mask=_blocked(mask, -1, _NEG[mask.dtype]),
                                          scale=scale)[:, :, :q.shape[-2]]


def encode_cross(src: torch.Tensor, mask: torch.Tensor, model: tuple[Any, ...], lora: list[tuple[Any, ...]],
                 cross: tuple[Any, ...], cross_lora: list[Any]) -> torch.Tensor:
    """What a prefill needs of the encoder: the keys and values of every decoder layer's cross-attention over
    `encoder_forward`'s states, [layers, 2, n, heads, S, head_dim] (keys then values). `cross` is each decoder
    layer's fused K/V base projection, `cross_lora` its LoRA term. A pure function, compiled like the encoder."""
    states = encoder_forward(src, mask, model, lora)
    n, source, d = states.shape
    h, hd = model[3][0], model[3][1]
    flat = states.reshape(n * source, d)
    return torch.stack([project(flat, base, term).view(n, source, 2, h, hd).permute(2, 0, 3, 1, 4)
                        for base, term in zip(cross, cross_lora)])


def _base(projection: Projection, plain: bool) -> tuple[Any, ...]:
    return projection.plain if plain else projection.base


def _step_projections(layer: _Layer) -> tuple[Projection, ...]:
    """The projections a decoder step runs, in `decoder_step`'s order (the cross-attention's keys and values were
    computed at prefill)."""
    return layer.qkv, layer.out, layer.cross_q, layer.cross_out, layer.fc1, layer.fc2


def decoder_step(ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cmask: torch.Tensor,
                 k: list[torch.Tensor], v: list[torch.Tensor], ck: list[torch.Tensor], cv: list[torch.Tensor],
                 model: tuple[Any, ...], lora: list[tuple[Any, ...]] | tuple[tuple[Any, ...], ...]) -> torch.Tensor:
    """Feed `ids` [B, T] at positions `pos` [B, T] through the decoder: logits of the last position [B, vocab].

    A pure function of tensors, so that `decode/compiled.py` can compile exactly this. The self-attention keys
    and values of the new tokens are written into `k`/`v` (per layer `[rows ≥ B, heads, columns, head_dim]`) at
    columns end-T..end-1, where end is the width of `mask` ([B, 1, T, end], additive); the cross-attention reads
    `ck`/`cv` over the width of `cmask` ([B, 1, 1, source]). `model` is `MarianBatch._model()`, `lora` each
    layer's LoRA tensors per projection (`lora.GroupedLoRA.tensors`)."""
    embed, positions, embed_scale, (h, hd, scaling, kernel), layers, head, final_bias = model
    b, t = ids.shape
    n, d = b * t, h * hd
    # The kernel takes one new token per row (and reads each row's own columns of the caches; kernels/__init__.py).
    kernel = kernel if t == 1 else None
    end = width = mask.shape[-1]
    cwidth = cmask.shape[-1]
    if kernel is None and not torch.compiler.is_compiling():
        # Eager, where attention is written out (no kernel, or several tokens per row), the scores are MKL's bmm,
        # which rounds a column by its place among the tiles: attention reads whole blocks of columns
        # (`_attend`), masked; the cache keeps room for them (the kernel needs no blocks). Compiled, the
        # scores of one query row are a dot product per column in a fixed order (Inductor writes a bmm with one row
        # as a reduction), whatever the width, and the extra columns would only cost.
        width, cwidth = _block(end), _block(cwidth)
        mask, cmask = _blocked(mask, -1, _NEG[mask.dtype]), _blocked(cmask, -1, _NEG[cmask.dtype])
    x = (F.embedding(ids, embed) * embed_scale + F.embedding(pos, positions)).reshape(n, d)
    for i, ((qkv_w, out_w, q_w, cout_w, fc1_w, fc2_w), norms, activation) in enumerate(layers):
        qkv_l, out_l, q_l, cout_l, fc1_l, fc2_l = lora[i]
        qkv = project(x, qkv_w, qkv_l).view(b, t, 3, h, hd)
        k[i][:b, :, end - t:end] = qkv[:, :, 1].transpose(1, 2)
        v[i][:b, :, end - t:end] = qkv[:, :, 2].transpose(1, 2)
        attn = _cached_attention(qkv[:, :, 0].transpose(1, 2), k[i], v[i], mask, width, scaling, kernel)
        x = _norm(x + project(attn, out_w, out_l), norms[0])
        q = project(x, q_w, q_l).view(b, t, h, hd).transpose(1, 2)
        attn = _cached_attention(q, ck[i], cv[i], cmask, cwidth, scaling, kernel)
        x = _norm(x + project(attn, cout_w, cout_l), norms[1])
        x = _norm(x + project(activation(project(x, fc1_w, fc1_l)), fc2_w, fc2_l), norms[2])
    logits = project(x.view(b, t, d)[:, -1], head, None)
    return logits + final_bias if final_bias is not None else logits


def _norm(x: torch.Tensor, norm: tuple[torch.Tensor, torch.Tensor, float]) -> torch.Tensor:
    weight, bias, eps = norm
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def _activation(fn: Any) -> Any:
    """The layer's activation as a plain function where it is one (GELUActivation calls F.gelu)."""
    name = type(fn).__name__
    if name == "GELUActivation" and getattr(fn, "act", None) is F.gelu:
        return F.gelu
    return fn


def _reserve(cache: _Cache, rows: int, columns: int, source: int | None = None) -> None:
    """Grow the cache's tensors (doubling) so they hold `rows` rows, `columns` columns and `source` source columns;
    what is in use is kept."""
    source = cache.source if source is None else source
    reserve(cache, rows, columns)
    new_rows = cache.capacity
    # Source columns grow by doubling too: grown one column at a time (a longer source joining), the cross-attention
    # tensors were reallocated and copied 21 times per run of the 600-sentence benchmark (70 ms of ~2 s).
    have = cache.cbias.shape[1]
    new_src = have if source <= have else _grown(have, source, START_COLUMNS)
    if (new_rows, new_src) != tuple(cache.cbias.shape):
        cache.cbias = _regrow((cache.ck, cache.cv), cache.cbias, cache.rows, cache.source, new_rows, new_src)
