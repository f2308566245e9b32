"""Marian (encoder-decoder): the encoder once per row, then decoder steps over a left-padded self-attention cache.

Marian's `decoder.forward` derives positions from the cache length, one number for the whole batch, so rows that
joined at different steps could not share it. This module calls the decoder's parts itself: token embeddings
(scaled), sinusoidal positions per row, the layers with transformers' own causal+padding and encoder masks, then
the head and `final_logits_bias`. Cross-attention keys/values are computed once per row at prefill (right-padded
to the longest source, padding masked) and reused by every step.

When every entering row's decoder prefix is the start token alone (Marian's own vocabularies), prefill is only the
encoder and the cross-attention projections: the rows join with an empty self-attention history and get their
first token in the next decode step, beside the running rows, instead of in a decoder forward of their own.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask

from .batch import (RunningBatch, Sequence, leading_padding, left_padded, pad_left, pad_right, positions)


class MarianBatch(RunningBatch):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decoder = self.model.get_decoder()
        self.cache: EncoderDecoderCache | None = None
        self.mask: torch.Tensor | None = None  # decoder self-attention: [B, L]
        self.source_mask: torch.Tensor | None = None  # encoder positions: [B, S]

    @property
    def cache_length(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    def _step(self, ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cache: EncoderDecoderCache,
              source_mask: torch.Tensor, encoder_states: torch.Tensor | None) -> torch.Tensor:
        dec = self.decoder
        hidden = dec.embed_tokens(ids) * dec.embed_scale
        hidden = hidden + dec.embed_positions(ids.shape, position_ids=pos)
        causal = create_causal_mask(config=dec.config, inputs_embeds=hidden, attention_mask=mask,
                                    cache=cache.self_attention_cache)
        # After prefill the layers read the cached cross-attention keys/values; they only need a non-None
        # encoder input of the right batch size and dtype to take that path.
        states = encoder_states if encoder_states is not None else hidden.new_empty(hidden.shape[0], 0, 1)
        cross = create_bidirectional_mask(config=dec.config, inputs_embeds=hidden, attention_mask=source_mask,
                                          encoder_hidden_states=states)
        for layer in dec.layers:
            hidden = layer(hidden, causal, states, encoder_attention_mask=cross, cache=cache, use_cache=True)
        logits = self.model.lm_head(hidden[:, -1, :])
        bias = getattr(self.model, "final_logits_bias", None)
        return logits + bias if bias is not None else logits

    def _prefill(self, sequences: list[Sequence]) -> tuple[torch.Tensor | None, Any]:
        width = max(len(s.input_ids) for s in sequences)
        # Sources are right-padded, as for a whole-batch generate: Marian's encoder positions start at the first
        # token whatever the padding.
        src = torch.tensor([s.input_ids + (self.pad_id,) * (width - len(s.input_ids)) for s in sequences],
                           dtype=torch.long, device=self.device)
        src_mask = torch.tensor([[1] * len(s.input_ids) + [0] * (width - len(s.input_ids)) for s in sequences],
                                dtype=torch.long, device=self.device)
        states = self.model.get_encoder()(input_ids=src, attention_mask=src_mask).last_hidden_state
        if all(len(s.decoder_prefix) == 1 for s in sequences):
            return None, (self._empty_history(states), states.new_zeros(len(sequences), 0, dtype=torch.long),
                          src_mask)
        ids, mask = left_padded([s.decoder_prefix for s in sequences], self.pad_id, self.device)
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        logits = self._step(ids, positions(mask), mask, cache, src_mask, states)
        return logits, (cache, mask, src_mask)

    def _empty_history(self, states: torch.Tensor) -> EncoderDecoderCache:
        """A cache for rows that have fed no decoder token yet: empty self-attention, and the cross-attention
        keys/values of every layer computed from the encoder output (what the layers would cache at their first
        step)."""
        rows = states.shape[0]
        data = []
        for layer in self.decoder.layers:
            attn = layer.encoder_attn
            shape = (rows, -1, attn.num_heads, attn.head_dim)
            keys = attn.k_proj(states).view(shape).transpose(1, 2)
            values = attn.v_proj(states).view(shape).transpose(1, 2)
            empty = keys.new_zeros(rows, keys.shape[1], 0, keys.shape[3])
            data.append((empty, empty, keys, values))
        return EncoderDecoderCache(data)

    def _merge(self, state: Any) -> None:
        cache, mask, src_mask = state
        if self.cache is None or not self.rows:
            self.cache, self.mask, self.source_mask = cache, mask, src_mask
            return
        old, new = self.mask.shape[1], mask.shape[1]
        width = max(old, new)
        s_old, s_new = self.source_mask.shape[1], src_mask.shape[1]
        s_width = max(s_old, s_new)
        for mine, theirs in zip(self.cache.self_attention_cache.layers, cache.self_attention_cache.layers):
            mine.keys = torch.cat([pad_left(mine.keys, width - old, -2), pad_left(theirs.keys, width - new, -2)])
            mine.values = torch.cat([pad_left(mine.values, width - old, -2),
                                     pad_left(theirs.values, width - new, -2)])
        for mine, theirs in zip(self.cache.cross_attention_cache.layers, cache.cross_attention_cache.layers):
            mine.keys = torch.cat([pad_right(mine.keys, s_width - s_old, -2),
                                   pad_right(theirs.keys, s_width - s_new, -2)])
            mine.values = torch.cat([pad_right(mine.values, s_width - s_old, -2),
                                     pad_right(theirs.values, s_width - s_new, -2)])
        self.mask = torch.cat([pad_left(self.mask, width - old, 1), pad_left(mask, width - new, 1)])
        self.source_mask = torch.cat([pad_right(self.source_mask, s_width - s_old, 1),
                                      pad_right(src_mask, s_width - s_new, 1)])

    def _decode(self, last: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        assert self.cache is not None and self.mask is not None and self.source_mask is not None
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        return self._step(last, pos, self.mask, self.cache, self.source_mask, None)

    def _select(self, keep: list[int]) -> None:
        if not keep:
            self.cache = self.mask = self.source_mask = None
            return
        assert self.cache is not None and self.mask is not None and self.source_mask is not None
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask = self.mask.index_select(0, index)
        cut = leading_padding(mask)
        self.mask = mask[:, cut:]
        src_mask = self.source_mask.index_select(0, index)
        used = src_mask.any(dim=0).nonzero()
        s_len = int(used[-1]) + 1 if used.numel() else 0
        self.source_mask = src_mask[:, :s_len]
        for layer in self.cache.self_attention_cache.layers:
            layer.keys = layer.keys.index_select(0, index)[..., cut:, :]
            layer.values = layer.values.index_select(0, index)[..., cut:, :]
        for layer in self.cache.cross_attention_cache.layers:
            layer.keys = layer.keys.index_select(0, index)[..., :s_len, :]
            layer.values = layer.values.index_select(0, index)[..., :s_len, :]
