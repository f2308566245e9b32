"""`Int8Embedding`: a decoder-only model's token table as int8 rows with a float32 scale per token, where its linear
layers are int8 (`model.quantization: int8`).

Kept in float32 beside int8 layers, the table was the largest part of a Hunyuan model in memory: HY-MT1.5-1.8B's
120,818 × 2,048 table is 0.92 GiB against 1.67 GiB for every int8 linear together (Hunyuan-MT-7B: 1.96 against
6.99 GiB). Its rows are quantized on the grid the output projection's rows already use (`int8.quantize_rows`: one
scale per row, the row's largest magnitude over 127), and where the model ties the two (the Hunyuan family does)
and the projection multiplies through torch._int_mm, the table is that projection's own int8 weight, read by
column: no second copy. fbgemm keeps its packed weight outside torch's tensors (a model over 256 MB of int8
weights, or an AVX2-only CPU): there the table keeps int8 rows of its own (0.23 GiB for the 1.8B). A look-up
dequantizes the rows it reads, so a token's vector depends on it alone (invariant 5 holds as for the int8 linears).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from .int8 import Int8Linear, quantize_rows

log = logging.getLogger(__name__)


class Int8Embedding(nn.Module):
    """Token ids → float32 vectors from int8 rows (`table` [vocab, dim]) or columns (`table` [dim, vocab], the
    transposed int8 weight of a tied `Int8Linear` output projection) and a scale per token."""

    def __init__(self, table: torch.Tensor, scale: torch.Tensor, by_column: bool, padding_idx: int | None) -> None:
        super().__init__()
        self.register_buffer("table", table, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.by_column = by_column
        self.num_embeddings = int(scale.shape[0])
        self.embedding_dim = int(table.shape[0] if by_column else table.shape[1])
        self.padding_idx = padding_idx

    @property
    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """What `embed` takes (the lean step passes these, not the module)."""
        return self.table, self.scale, self.by_column

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return embed(ids, self.tensors)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8, shared with the output projection: " \
               f"{self.by_column}"


def embed(ids: torch.Tensor, table: Any) -> torch.Tensor:
    """The vectors of `ids` from a float table, or from `Int8Embedding.tensors` (a pure function of tensors: the
    compiled decode step runs it)."""
    if isinstance(table, torch.Tensor):
        return torch.nn.functional.embedding(ids, table)
    rows, scale, by_column = table
    flat = ids.reshape(-1)
    picked = rows.index_select(1, flat).t() if by_column else rows.index_select(0, flat)
    return (picked.to(torch.float32) * scale.index_select(0, flat)[:, None]).view(*ids.shape, -1)


def quantize_embeddings(model: nn.Module) -> int:
    """Replace a decoder-only model's float token table by an `Int8Embedding` (sharing a tied int8 output
    projection's weight where there is one). Returns the bytes freed (0 when the model has no plain table)."""
    table = model.get_input_embeddings()
    if not isinstance(table, nn.Embedding):
        return 0
    head = model.get_output_embeddings()
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    weight = table.weight.detach()
    before = weight.numel() * weight.element_size()
    if tied and isinstance(head, Int8Linear) and head.bias is None and head.weight_t.shape == weight.t().shape:
        new = Int8Embedding(head.weight_t, head.scale, True, table.padding_idx)
        added = 0
    else:
        rows_t, scale = quantize_rows(weight)   # int8 [dim, vocab]: its transpose is the rows
        rows = rows_t.t().contiguous()
        new = Int8Embedding(rows, scale, False, table.padding_idx)
        added = rows.numel() + scale.numel() * 4
    model.set_input_embeddings(new)
    log.info("int8 token table: %.0f MB freed%s", (before - added) / 2**20,
             " (shared with the tied output projection)" if new.by_column else "")
    return before - added
