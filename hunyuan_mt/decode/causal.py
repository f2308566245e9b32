"""Decoder-only models (HunYuanDenseV1, Llama, Qwen, ...): the model's own forward over a left-padded cache.

transformers builds the causal and padding mask from the 2D attention mask, and these models take `position_ids`
per row, so rows that joined at different steps share one forward. The cache is transformers' `DynamicCache`;
joining and leaving rewrite its per-layer tensors (pad on the left, select rows, cut shared padding).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import DynamicCache

from .batch import RunningBatch, Sequence, leading_padding, left_padded, pad_left, positions


def _cache_kwarg(model: Any) -> str:
    """transformers 5.24 renamed `past_key_values` to `cache` in some models only."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class CausalBatch(RunningBatch):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cache_arg = _cache_kwarg(self.model)
        self._keep_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # [B, L] 1 = real token

    @property
    def cache_length(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        kwargs: dict[str, Any] = {self._cache_arg: cache, "use_cache": True}
        if self._keep_logits:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, **kwargs)
        return out.logits[:, -1, :]

    def _prefill(self, sequences: list[Sequence]) -> tuple[torch.Tensor, Any]:
        ids, mask = left_padded([s.input_ids for s in sequences], self.pad_id, self.device)
        cache = DynamicCache()
        logits = self._forward(ids, mask, positions(mask), cache)
        return logits, (cache, mask)

    def _merge(self, state: Any) -> None:
        cache, mask = state
        if self.cache is None or not self.rows:
            self.cache, self.mask = cache, mask
            return
        old, new = self.mask.shape[1], mask.shape[1]
        width = max(old, new)
        for mine, theirs in zip(self.cache.layers, cache.layers):
            mine.keys = torch.cat([pad_left(mine.keys, width - old, -2), pad_left(theirs.keys, width - new, -2)])
            mine.values = torch.cat([pad_left(mine.values, width - old, -2),
                                     pad_left(theirs.values, width - new, -2)])
        self.mask = torch.cat([pad_left(self.mask, width - old, 1), pad_left(mask, width - new, 1)])

    def _decode(self, last: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        assert self.cache is not None and self.mask is not None
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        return self._forward(last, self.mask, pos, self.cache)

    def _select(self, keep: list[int]) -> None:
        if not keep:
            self.cache, self.mask = None, None
            return
        assert self.cache is not None and self.mask is not None
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask = self.mask.index_select(0, index)
        cut = leading_padding(mask)
        self.mask = mask[:, cut:]
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[..., cut:, :]
            layer.values = layer.values.index_select(0, index)[..., cut:, :]
