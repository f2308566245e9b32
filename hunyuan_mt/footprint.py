"""What a backbone will take in memory, read from its safetensors headers before anything is loaded, so that a
model that cannot fit is refused with one line instead of swapping the machine to a halt or being killed.

On the CPU with `model.quantization: int8` every linear layer keeps one byte per weight and a float32 scale per
output row; the rest (the embedding table, norms) is float32. A tied output projection (Hunyuan's lm_head shares
the embedding) gets an int8 copy of its own. Loading passes through the checkpoint's own precision: a bfloat16
checkpoint (the published Hunyuan-MT and HY-MT weights) is read in bfloat16 and quantized layer by layer
(`backbone._load`), so the peak is the larger of the half-precision model and the result. Numbers for the
published shapes (docs/HUNYUAN_CPU.md): HY-MT1.5-1.8B ≈ 2.8 GiB resident in int8, peak ≈ 3.6 GiB; Hunyuan-MT-7B
≈ 9.0 GiB, peak ≈ 15 GiB.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

#: Bytes per element of the dtypes a safetensors header names.
_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
          "F8_E4M3": 1, "F8_E5M2": 1}

#: What the running service needs beyond the weights: the KV cache of a full batch, activations, tokenizer,
#: Python and its libraries (measured: the demo server's RSS less its weights is ~0.9 GiB).
OVERHEAD = 1.5 * 2**30


@dataclass(frozen=True)
class Footprint:
    """Bytes a backbone takes: `resident` once loaded (as it will run), `peak` while loading."""

    checkpoint: int        # the weights as stored
    resident: int
    peak: int
    params: int

    def describe(self) -> str:
        return (f"about {self.resident / 2**30:.1f} GiB resident, {self.peak / 2**30:.1f} GiB while loading "
                f"({self.params / 1e9:.2f}B parameters)")


def _headers(folder: Path) -> dict[str, dict]:
    """Every tensor's header entry ({"dtype", "shape", ...}) across the folder's safetensors files."""
    tensors: dict[str, dict] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with file.open("rb") as f:
            size = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(size))
        tensors.update({k: v for k, v in header.items() if k != "__metadata__"})
    return tensors


def estimate(folder: Path, int8: bool, tied_output: bool = False) -> Footprint | None:
    """The footprint of the model in `folder` on the CPU (float32, or int8 linears), or None without safetensors.
    Linear weights are the 2-D `.weight` tensors outside the embedding table."""
    tensors = _headers(folder)
    if not tensors:
        return None
    checkpoint = params = resident = 0
    load_bytes = 4
    for name, entry in tensors.items():
        numel = 1
        for dim in entry["shape"]:
            numel *= dim
        params += numel
        width = _BYTES.get(entry["dtype"], 4)
        checkpoint += numel * width
        load_bytes = min(load_bytes, max(width, 2))
        linear = len(entry["shape"]) == 2 and name.endswith(".weight") and "embed" not in name
        resident += numel + entry["shape"][0] * 4 if int8 and linear else numel * 4
        if int8 and tied_output and "embed_tokens" in name:
            resident += numel + entry["shape"][0] * 4    # the output projection's own int8 copy
    peak = max(resident, params * (load_bytes if int8 else 4))
    return Footprint(checkpoint, resident, peak, params)


def check(folder: Path, int8: bool, tied_output: bool, available: int, name: str) -> Footprint | None:
    """The footprint, or MemoryError with one line when the machine's available memory cannot hold it."""
    found = estimate(folder, int8, tied_output)
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
