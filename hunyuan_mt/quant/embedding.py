"""`Int8Embedding`: a decoder-only model's token table as int8 rows with a float32 scale per token, where its linear
layers are int8 (`model.quantization: int8`).

Kept in float32 beside int8 layers, the table was the largest part of a Hunyuan model in memory: HY-MT1.5-1.8B's
120,818 × 2,048 table is 0.92 GiB against 1.67 GiB for every int8 linear together (Hunyuan-MT-7B: 1.96 against
6.99 GiB). Its rows are quantized on the grid the output projection's rows already use (`int8.quantize_rows`: one
scale per row, the row's largest magnitude over 127), and where the model ties the two (the Hunyuan family does)
and the projection multiplies through torch._int_mm, the table is that projection's own int8 weight, read by
column: no second copy. fbgemm keeps its packed weight outside torch's tensors (a model over 256 MB of int8
weights, or an AVX2-only CPU): there the table stays in the checkpoint's safetensors file and a look-up reads its
rows (`FileTable`: the published checkpoints' bfloat16 rows, exactly what transformers' float32 model holds), where
int8 rows of its own took 0.23 GiB for the 1.8B. Without a safetensors file to read, the table keeps int8 rows of
its own. A look-up dequantizes the rows it reads, so a token's vector depends on it alone (invariant 5 holds as for
the int8 linears).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ModelUnavailable
from ..host.footprint import safetensors_headers
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


class FileTable(nn.Module):
    """Token ids → float32 vectors read from the checkpoint's table in its safetensors file (`file_table`): one
    `preadv` of a row per token, straight into the result. The table stays in the file; the operating system's
    page cache holds what is read often, as memory it can take back.

    Why not a memory map: on this ext4 (kernel 6.18) the page cache keeps a file in large folios, and a fault maps
    the whole folio around a row: 60 random tokens made 92 MB of the 1.8B's mapped table resident, 16 requests 408
    MB of its 472 (MADV_RANDOM changed nothing), more than int8 rows of its own (236 MB). From the page cache a
    look-up took 25 µs for one token, 56 µs for 16 and 2.5 ms for 1,024 (2.5-3.5 µs a row; Intel Xeon): a decode
    step reads one row per live row.

    The file is opened once: replacing it by a rename (mv, rsync, git) leaves this handle on the old one; a file
    truncated in place gives short reads, answered with ModelUnavailable."""

    def __init__(self, file: Path, offset: int, shape: tuple[int, int], dtype: torch.dtype,
                 padding_idx: int | None) -> None:
        super().__init__()
        self.source, self.offset, self.dtype = file, offset, dtype
        self.num_embeddings, self.embedding_dim = shape
        self.row_bytes = shape[1] * torch.empty(0, dtype=dtype).element_size()
        self.padding_idx = padding_idx
        self._fd = os.open(file, os.O_RDONLY)

    def __del__(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            os.close(self._fd)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).tolist()
        out = torch.empty(len(flat), self.embedding_dim, dtype=self.dtype)
        rows = out.view(torch.uint8).numpy()
        size, base = self.row_bytes, self.offset
        for i, token in enumerate(flat):
            if not 0 <= token < self.num_embeddings or os.preadv(self._fd, [rows[i]], base + token * size) != size:
                raise ModelUnavailable(f"token {token}: the token table in {self.source.name} could not be read "
                                       "(the file changed on disk since the model loaded; restart the server)")
        vectors = out if self.dtype == torch.float32 else out.to(torch.float32)
        return vectors.view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.dtype}, read from {self.source.name}"


#: safetensors dtypes a table is read in.
_READABLE = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def file_table(folder: Path, name: str, shape: tuple[int, ...], padding_idx: int | None = None) -> FileTable | None:
    """The tensor `name` (or the one table ending like it, of `shape`) of the folder's safetensors files as a
    `FileTable`, or None when no file holds it in a float format."""
    suffix = name.rpartition(".")[0].rpartition(".")[2] + ".weight"   # "embed_tokens.weight"
    for file, data_start, header in safetensors_headers(folder):
        found = header.get(name)
        if found is None:
            similar = [v for k, v in header.items() if k.endswith(suffix) and tuple(v["shape"]) == tuple(shape)]
            found = similar[0] if len(similar) == 1 else None
        if found is None or tuple(found["shape"]) != tuple(shape) or found["dtype"] not in _READABLE:
            continue
        return FileTable(file, data_start + found["data_offsets"][0], (int(shape[0]), int(shape[1])),
                         _READABLE[found["dtype"]], padding_idx)
    return None


def embed(ids: torch.Tensor, table: Any) -> torch.Tensor:
    """The vectors of `ids` (float32) from a float table, or from `Int8Embedding.tensors` (a pure function of
    tensors: the compiled decode step runs it)."""
    if isinstance(table, torch.Tensor):
        vectors = torch.nn.functional.embedding(ids, table)
        return vectors if vectors.dtype == torch.float32 else vectors.to(torch.float32)
    rows, scale, by_column = table
    flat = ids.reshape(-1)
    picked = rows.index_select(1, flat).t() if by_column else rows.index_select(0, flat)
    return (picked.to(torch.float32) * scale.index_select(0, flat)[:, None]).view(*ids.shape, -1)


def quantize_embeddings(model: nn.Module, folder: Path | None = None) -> int:
    """Replace a decoder-only model's float token table by an `Int8Embedding` sharing a tied int8 output
    projection's weight where there is one, else by the checkpoint's table read from its file in `folder` where it
    can be (`FileTable`), else by int8 rows of its own. Returns the bytes freed (0 when the model has no plain
    table)."""
    table = model.get_input_embeddings()
    if not isinstance(table, nn.Embedding):
        return 0
    head = model.get_output_embeddings()
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    weight = table.weight.detach()
    before = weight.numel() * weight.element_size()
    if tied and isinstance(head, Int8Linear) and head.bias is None and head.weight_t.shape == weight.t().shape:
        new: nn.Module = Int8Embedding(head.weight_t, head.scale, True, table.padding_idx)
        added = 0
    elif folder is not None and (read := _file_table(model, folder, table)) is not None:
        new, added = read, 0
    else:
        rows_t, scale = quantize_rows(weight)   # int8 [dim, vocab]: its transpose is the rows
        rows = rows_t.t().contiguous()
        new = Int8Embedding(rows, scale, False, table.padding_idx)
        added = rows.numel() + scale.numel() * 4
    model.set_input_embeddings(new)
    how = ("read from the checkpoint file" if isinstance(new, FileTable) else
           "int8, shared with the tied output projection" if new.by_column else "int8")
    log.info("token table: %.0f MB freed (%s)", (before - added) / 2**20, how)
    return before - added


def _file_table(model: nn.Module, folder: Path, table: nn.Embedding) -> FileTable | None:
    name = next((n for n, p in model.named_parameters() if p is table.weight), None)
    return None if name is None else file_table(folder, name, tuple(table.weight.shape), table.padding_idx)
