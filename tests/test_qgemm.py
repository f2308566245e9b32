"""Our 8-bit and 4-bit GEMM (hunyuan_mt/kernels/qgemm.cpp, hunyuan_mt/quant/packed.py): the packed layout round
trips; the product is the exact integer arithmetic the docstring describes; a row's result is the same bits alone,
in any batch (panels of 16 rows, tiles of 4) and on any thread count; and the AVX-512 VNNI, AVX2 and plain C++
paths give the same bits on this CPU (each path is run in a process of its own, capped by HMT_QGEMM_ISA)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hunyuan_mt.quant import int8, packed as int8_packed
from hunyuan_mt.quant.packed import Packed4Linear, PackedLinear

pytestmark = pytest.mark.skipif(not int8_packed.available(), reason="the CPU kernels cannot be built here")

#: (rows, inputs, outputs): one row; a tile and a half; two panels and a tail; widths that are not multiples of the
#: 64-column superblock; a 4-bit width of three 128-input groups and one whose group is the whole width (40).
# (7, 44, 70): tiles of 4 and 3 rows over 11 steps of 4 inputs (an odd step at the chunk's end)
SHAPES = [(1, 64, 24), (6, 128, 130), (37, 384, 200), (5, 40, 70), (16, 256, 64), (7, 44, 70)]


def _layer(bits: int, inner: int, out: int, seed: int, bias: bool = True) -> PackedLinear:
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, inner, generator=gen) * 0.05
    return int8_packed.layer_class(bits).from_float(weight, torch.randn(out, generator=gen) if bias else None)


def _reference(layer: PackedLinear, x: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic in float64 from the same integers: x on its rows' 8-bit grids, each group's exact
    integer sum times the group's scale, times the row's scale, plus the bias."""
    amax = x.abs().amax(dim=1, keepdim=True)
    xq = torch.round(x * (127.0 / amax)).clamp(-127, 127).to(torch.int64)
    q, scale = layer.rows()
    g = layer.group
    sums = torch.einsum("mgk,ngk->mng", xq.view(x.shape[0], -1, g), q.to(torch.int64).view(q.shape[0], -1, g))
    y = (sums.to(torch.float64) * scale.to(torch.float64)).sum(dim=2) * (amax.to(torch.float64) / 127.0)
    return y + layer.bias.to(torch.float64)


@pytest.mark.parametrize("bits", [8, 4])
def test_packing_round_trips_and_the_grid_is_the_documented_one(bits: int) -> None:
    layer = _layer(bits, 384, 200, seed=1)
    q, scale = layer.rows()
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(200, 384, generator=gen) * 0.05
    q2, scale2, group = int8_packed.quantize(weight, bits)
    assert torch.equal(q, q2) and torch.equal(scale, scale2) and layer.group == group
    assert group == (384 if bits == 8 else 128) and scale.shape == (200, 384 // group)
    assert int(q.abs().max()) == (63 if bits == 8 else 7)   # 8-bit: AVX2's pairwise int16 sums cannot saturate
    # 64 columns a superblock: the packed bytes are the padded width's.
    assert layer.packed.numel() == 256 * 384 * bits // 8
    dequantized, _ = layer.dequantized()
    assert float((dequantized - weight).abs().max()) <= float(scale.max()) / 2 + 1e-7


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("rows,inner,out", SHAPES)
def test_the_product_is_the_documented_integer_arithmetic(bits: int, rows: int, inner: int, out: int) -> None:
    if not int8_packed.fits(inner, bits):
        pytest.skip("width not steppable")
    layer = _layer(bits, inner, out, seed=rows + inner)
    x = torch.randn(rows, inner, generator=torch.Generator().manual_seed(rows))
    y = layer(x)
    assert y.dtype == torch.float32 and y.shape == (rows, out)
    torch.testing.assert_close(y.to(torch.float64), _reference(layer, x), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("bits", [8, 4])
def test_a_row_gets_the_same_bits_alone_in_any_batch_and_on_any_thread_count(bits: int) -> None:
    layer = _layer(bits, 384, 200, seed=5)
    x = torch.randn(37, 384, generator=torch.Generator().manual_seed(6))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        together = layer(x)
        alone = torch.cat([layer(x[i:i + 1]) for i in range(x.shape[0])])
        shuffled = layer(x.flip(0)).flip(0)
        torch.set_num_threads(1)
        one_thread = layer(x)
    finally:
        torch.set_num_threads(before)
    for other in (alone, shuffled, one_thread):
        assert torch.equal(together, other)


_PROBE = """
import json, sys, torch
from hunyuan_mt.quant import packed as int8_packed
out = {"isa": int8_packed.isa(), "y": []}
for bits, (rows, inner, n) in json.loads(sys.argv[1]):
    gen = torch.Generator().manual_seed(rows + inner)
    layer = int8_packed.layer_class(bits).from_float(torch.randn(n, inner, generator=gen) * 0.05,
                                                     torch.randn(n, generator=gen))
    x = torch.randn(rows, inner, generator=gen)
    out["y"].append(layer(x).view(torch.int32).flatten().tolist())
print(json.dumps(out))
"""


def _probe(isa: str | None) -> dict:
    cases = [(bits, shape) for bits in (8, 4) for shape in SHAPES if int8_packed.fits(shape[1], bits)]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    env.pop("HMT_QGEMM_ISA", None)
    if isa is not None:
        env["HMT_QGEMM_ISA"] = isa
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(cases)], env=env, capture_output=True, text=True,
                          timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_path_of_the_kernel_gives_the_same_bits() -> None:
    """The same products through the native path, AVX2 and plain C++: the bits of every output are equal, so a
    model's translations do not depend on the CPU's vector width."""
    native, avx2, plain = _probe(None), _probe("avx2"), _probe("scalar")
    assert plain["isa"] == "scalar" and avx2["isa"] in ("avx2", "scalar")
    assert native["y"] == avx2["y"] == plain["y"]


def test_stacked_layers_compute_what_each_computes() -> None:
    parts = [_layer(4, 256, width, seed=i, bias=i != 1) for i, width in enumerate((96, 32, 64))]
    fused = Packed4Linear.stacked(parts)
    x = torch.randn(3, 256)
    assert torch.equal(fused(x), torch.cat([p(x) for p in parts], dim=1))
    assert "4-bit" in repr(fused) and "scales per 128 inputs" in repr(fused)


def test_a_large_model_gets_the_kernel_timed_faster_here_and_4_bit_only_through_qgemm(monkeypatch) -> None:
    probe = int8.GemmSpeed(int8_us=10.0, float32_us=40.0, capability="AVX512", fbgemm_us=30.0)
    large = int8.LARGE_MODEL_BYTES + 1
    for fbgemm_ms, qgemm_ms, expected in (({1: 5.0, 16: 9.0}, {1: 4.0, 16: 8.0}, "qgemm"),
                                          ({1: 5.0, 16: 9.0}, {1: 6.0, 16: 10.0}, "fbgemm"),
                                          # A faster one-row pass does not outweigh a 16-row pass twice as slow.
                                          ({1: 5.0, 16: 9.0}, {1: 4.0, 16: 18.0}, "fbgemm")):
        timed = int8.LargeGemmSpeed(fbgemm_ms, qgemm_ms, "avx2")
        monkeypatch.setattr(int8, "large_gemm_speed", lambda threads=None, timed=timed: timed)
        assert int8.kernel_for(probe, large) == expected
        assert timed.describe().startswith(f"{expected} (qgemm's avx2 path against fbgemm: 1 rows")
    assert int8.kernel_for(probe, 13 * 2**20) == "int_mm"
    pinned = int8.GemmSpeed(int8_us=10.0, float32_us=40.0, capability="AVX2", fbgemm_us=3.0, pinned="fbgemm")
    assert int8.kernel_for(pinned, large) == "fbgemm"
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 20))
    with pytest.raises(ValueError, match="4-bit weights are multiplied by qgemm only"):
        int8.quantize_linears(model, "fbgemm", bits=4)
    assert int8.quantize_linears(model, "qgemm", bits=4) == 2
    assert all(isinstance(m, Packed4Linear) for m in model)


def test_without_the_kernel_a_packed_layer_says_what_to_configure(monkeypatch) -> None:
    from hunyuan_mt import kernels

    monkeypatch.setattr(kernels, "qgemm", lambda: None)
    with pytest.raises(RuntimeError, match="set model.int8_kernel to fbgemm or int_mm"):
        PackedLinear.from_float(torch.randn(8, 16), None)


def test_the_large_model_probe_times_both_kernels_at_one_row_and_a_batch() -> None:
    timed = int8.large_gemm_speed.__wrapped__(1)
    assert set(timed.fbgemm_ms) == set(timed.qgemm_ms) == {1, 16}
    assert all(0 < v < 10_000 for v in (*timed.fbgemm_ms.values(), *timed.qgemm_ms.values()))
    assert timed.kernel in ("qgemm", "fbgemm") and timed.isa == int8_packed.isa()
