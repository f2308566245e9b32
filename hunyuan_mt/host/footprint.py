"""What a backbone will take in memory, read from its safetensors headers before anything is loaded, so that a
model that cannot fit is refused with one line instead of swapping the machine to a halt or being killed.

On the CPU with `model.quantization: int8` every linear layer keeps one byte per weight and a float32 scale per
output row, and so does a decoder-only model's token table (`quant.embedding`: the tied output projection's own int8
rows where the model ties them, as the Hunyuan family does); the rest (norms; an encoder-decoder's tables) is
float32. Loading passes through the checkpoint's own precision: a bfloat16
checkpoint (the published Hunyuan-MT and HY-MT weights) is read in bfloat16 and quantized layer by layer
(`backbone._load`), so the peak is the larger of the half-precision model and the result. Numbers for the
published shapes (docs/HUNYUAN_CPU.md): HY-MT1.5-1.8B ≈ 2.6 GiB resident in int8, peak ≈ 3.3 GiB; Hunyuan-MT-7B
≈ 9.0 GiB, peak ≈ 14 GiB.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

#: Bytes per element of the dtypes a safetensors header names.
_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
          "F8_E4M3": 1, "F8_E5M2": 1}

#: An allowance for what the running service needs beyond the weights (the KV cache of a batch, activations, the
#: tokenizer, Python and its libraries): a margin, not a measurement per model.
OVERHEAD = 1.5 * 2**30


@dataclass(frozen=True)
class Footprint:
    """Bytes a backbone takes: `resident` once loaded (as it will run), `peak` while loading."""

    resident: int
    peak: int
    params: int

    def describe(self) -> str:
        return (f"about {self.resident / 2**30:.1f} GiB resident, {self.peak / 2**30:.1f} GiB while loading "
                f"({self.params / 1e9:.2f}B parameters)")


def safetensors_headers(folder: Path) -> Iterator[tuple[Path, int, dict[str, dict]]]:
    """(file, where its data starts, its tensors' header entries {"dtype", "shape", "data_offsets"}) for each of
    the folder's safetensors files, in name order: the headers only, no weight is read."""
    for file in sorted(folder.glob("*.safetensors")):
        with file.open("rb") as f:
            size = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(size))
        yield file, 8 + size, {k: v for k, v in header.items() if k != "__metadata__"}


def _headers(folder: Path) -> dict[str, dict]:
    """Every tensor's header entry across the folder's safetensors files."""
    return {name: entry for _, _, header in safetensors_headers(folder) for name, entry in header.items()}


def estimate(folder: Path, int8: bool, tied_output: bool = False, int8_table: bool = False) -> Footprint | None:
    """The footprint of the model in `folder` on the CPU (float32, or int8 linears), or None without safetensors.
    Linear weights are the 2-D `.weight` tensors outside the embedding table; `tied_output`: the output projection
    is the table (no tensor of its own in the checkpoint) and gets its int8 copy; `int8_table`: the table itself is
    int8 (a decoder-only model: shared with that copy when tied)."""
    tensors = _headers(folder)
    if not tensors:
        return None
    params = resident = 0
    load_bytes = 4
    for name, entry in tensors.items():
        numel = 1
        for dim in entry["shape"]:
            numel *= dim
        params += numel
        width = _BYTES.get(entry["dtype"], 4)
        load_bytes = min(load_bytes, max(width, 2))
        table = "embed_tokens" in name
        linear = len(entry["shape"]) == 2 and name.endswith(".weight") and "embed" not in name
        rows = numel + entry["shape"][0] * 4 if len(entry["shape"]) == 2 else numel * 4   # int8 rows and scales
        if int8 and linear:
            resident += rows
        elif int8 and table and int8_table:
            resident += rows                              # the int8 table, which a tied projection shares
        else:
            resident += numel * 4
        if int8 and tied_output and table and not int8_table:
            resident += rows                              # the tied output projection's own int8 copy
    peak = max(resident, params * (load_bytes if int8 else 4))
    return Footprint(resident, peak, params)


def check(folder: Path, int8: bool, tied_output: bool, int8_table: bool, available: int,
          name: str) -> Footprint | None:
    """The footprint, or MemoryError with one line when the machine's available memory cannot hold it."""
    found = estimate(folder, int8, tied_output, int8_table)
    if found is None:
        return None
    need = max(found.peak, found.resident + int(OVERHEAD))
    if need > available:
        how = "int8 weights" if int8 else "float32 weights"
        raise MemoryError(
            f"{name} needs about {need / 2**30:.1f} GiB of memory with {how} ({found.describe()}), and this "
            f"machine has {available / 2**30:.1f} GiB available: use a smaller model (configs/hy-mt1.5-1.8b.yaml), "
            "model.quantization: int8, or a machine with more memory.")
    return found
