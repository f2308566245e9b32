"""The token table's forms with int8 weights (`quant.embedding`): mapped from the checkpoint, or int8 rows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from hunyuan_mt.quant.embedding import FileTable, Int8Embedding, file_table, quantize_embeddings


def test_a_bfloat16_table_is_read_as_it_is_and_found_under_another_prefix(tmp_path: Path) -> None:
    from hunyuan_mt.errors import ModelUnavailable

    table = torch.randn(50, 8).to(torch.bfloat16)
    save_file({"model.layers.0.mlp.up_proj.weight": torch.randn(4, 8), "model.embed_tokens.weight": table},
              str(tmp_path / "model.safetensors"))
    read = file_table(tmp_path, "model.embed_tokens.weight", (50, 8))
    assert read.source == tmp_path / "model.safetensors" and read.dtype == torch.bfloat16
    ids = torch.tensor([[0, 49, 7], [7, 7, 3]])
    assert torch.equal(read(ids), table.to(torch.float32)[ids])
    # A checkpoint saved without the "model." prefix: the one table of that shape ending like it.
    assert torch.equal(file_table(tmp_path, "transformer.embed_tokens.weight", (50, 8))(ids),
                       table.to(torch.float32)[ids])
    assert file_table(tmp_path, "model.embed_tokens.weight", (51, 8)) is None        # another shape
    with pytest.raises(ModelUnavailable, match="token 50: the token table in model.safetensors"):
        read(torch.tensor([50]))
    # Truncated in place after the load: a clear error, not a crash.
    with open(tmp_path / "model.safetensors", "r+b") as f:
        f.truncate(200)
    with pytest.raises(ModelUnavailable, match="changed on disk since the model loaded"):
        read(torch.tensor([49]))
    save_file({"model.embed_tokens.weight": torch.zeros(50, 8, dtype=torch.int8)}, str(tmp_path / "model.safetensors"))
    assert file_table(tmp_path, "model.embed_tokens.weight", (50, 8)) is None        # not a float format


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = type("C", (), {"tie_word_embeddings": False})()
        self.embed_tokens = nn.Embedding(30, 8)

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def set_input_embeddings(self, table: nn.Module) -> None:
        self.embed_tokens = table

    def get_output_embeddings(self) -> None:
        return None


def test_without_a_file_to_map_the_table_keeps_int8_rows_of_its_own(tmp_path: Path) -> None:
    model = _Tiny()
    weight = model.embed_tokens.weight.detach().clone()
    assert quantize_embeddings(model, tmp_path) > 0          # an empty folder: nothing to map
    table = model.get_input_embeddings()
    assert isinstance(table, Int8Embedding) and not table.by_column and table.table.dtype == torch.int8
    ids = torch.tensor([1, 2, 29])
    assert ((table(ids) - weight[ids]).abs() <= weight[ids].abs().amax(1, keepdim=True) / 254 + 1e-6).all()

    model = _Tiny()
    save_file({"embed_tokens.weight": model.embed_tokens.weight.detach()}, str(tmp_path / "m.safetensors"))
    quantize_embeddings(model, tmp_path)
    table = model.get_input_embeddings()
    assert isinstance(table, FileTable) and torch.equal(table(ids), model_weight(tmp_path)[ids])


def model_weight(folder: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    return load_file(str(folder / "m.safetensors"))["embed_tokens.weight"]
