"""The CPU kernels (hunyuan_mt/kernels): the decode-attention kernel computes the attention `kvcache._attend`
computes, over each row's own columns only, a row's result the same to the bit wherever its columns sit; the C++
int8 GEMM gives the bits of the Python op; and a clear way out where they cannot be built."""

from __future__ import annotations

import logging
import os
import random

import pytest
import torch

from hunyuan_mt.quant import fbgemm as int8_fbgemm
from hunyuan_mt import kernels
from hunyuan_mt.decode.kvcache import _NEG, _attend

NEG = _NEG[torch.float32]


@pytest.fixture(scope="module")
def op():
    found = kernels.decode_attention()
    assert found is not None, "the kernel must build here (g++ and ninja are installed with the project)"
    return found


def _cache(rows: int, heads: int, columns: int, head_dim: int, spare: int = 3) -> tuple[torch.Tensor, ...]:
    """Keys and values as the engine keeps them: more rows and columns allocated than in use."""
    k = torch.randn(rows + spare, heads, columns + spare, head_dim)
    v = torch.randn(rows + spare, heads, columns + spare, head_dim)
    return k, v


def _queries(rows: int, heads: int, head_dim: int) -> torch.Tensor:
    """q [rows, heads, 1, head_dim] as the step slices it out of its fused Q/K/V projection (not contiguous)."""
    qkv = torch.randn(rows, 1, 3, heads, head_dim)
    return qkv[:, :, 0].transpose(1, 2)


def test_it_computes_the_attention_of_the_tensor_operations(op) -> None:
    """Rows masked at the start (joined later), at the end (shorter sources) and in between, against `_attend`
    over the same columns."""
    rng = random.Random(0)
    torch.manual_seed(0)
    for _ in range(40):
        rows, heads, head_dim = rng.choice([1, 2, 5, 64]), rng.choice([1, 4, 6]), rng.choice([8, 64, 128])
        width = rng.randint(1, 40)
        k, v = _cache(rows, heads, width, head_dim)
        q = _queries(rows, heads, head_dim)
        bias = torch.zeros(rows, 1, 1, width)
        for r in range(rows):
            lo = rng.randrange(width)
            hi = rng.randint(lo + 1, width)
            bias[r, ..., :lo] = NEG
            bias[r, ..., hi:] = NEG
            if hi - lo > 2 and rng.random() < 0.3:
                bias[r, ..., rng.randrange(lo, hi)] = NEG
        got = op(q, k, v, bias, head_dim ** -0.5)
        want = _attend(q, k[:rows, :, :width], v[:rows, :, :width], bias, head_dim ** -0.5)[:, :, 0]
        assert got.shape == (rows, heads, head_dim)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_row_gets_the_same_bits_wherever_its_columns_sit(op, two_threads) -> None:
    """A row alone, then among 63 others in a wider cache with its columns moved right by any offset (a batch whose
    older rows have longer histories): bit for bit the same."""
    rng = random.Random(1)
    torch.manual_seed(1)
    heads, head_dim = 6, 64
    for _ in range(60):
        own = rng.randint(1, 30)
        q = _queries(1, heads, head_dim)
        k, v = _cache(1, heads, own, head_dim, spare=0)
        alone = op(q, k, v, torch.zeros(1, 1, 1, own), 0.125)

        rows, at, shift = 64, rng.randrange(64), rng.randint(0, 20)
        width = own + shift + rng.randint(0, 5)
        big_k, big_v = _cache(rows, heads, width, head_dim)
        big_k[at, :, shift:shift + own] = k[0]
        big_v[at, :, shift:shift + own] = v[0]
        big_q = _queries(rows, heads, head_dim).clone()
        big_q[at] = q[0]
        bias = torch.full((rows, 1, 1, width), NEG)
        bias[:, ..., :width - rng.randint(0, 3)] = 0.0
        bias[at] = NEG
        bias[at, ..., shift:shift + own] = 0.0
        assert torch.equal(op(big_q, big_k, big_v, bias, 0.125)[at], alone[0])


def test_a_row_that_sees_no_column_averages_them_as_the_softmax_does(op) -> None:
    """A padding row (every column masked) gets the mean of the values, as a softmax over equal scores gives."""
    k, v = _cache(2, 2, 5, 8)
    q = _queries(2, 2, 8)
    bias = torch.zeros(2, 1, 1, 5)
    bias[1] = NEG
    got = op(q, k, v, bias, 0.3)
    torch.testing.assert_close(got[1], v[1, :, :5].mean(dim=1), rtol=1e-5, atol=1e-6)


def test_it_refuses_what_it_cannot_compute_with_the_reason(op) -> None:
    k, v = _cache(2, 2, 4, 8)
    q = _queries(2, 2, 8)
    with pytest.raises(RuntimeError, match="float32 queries and bias"):
        op(q.double(), k, v, torch.zeros(2, 1, 1, 4), 1.0)
    with pytest.raises(RuntimeError, match="both float32 or both float16"):
        op(q, k.half(), v, torch.zeros(2, 1, 1, 4), 1.0)
    k12, v12 = _cache(2, 2, 4, 12)
    with pytest.raises(RuntimeError, match="head_dim 12 must be a multiple of 8"):
        op(_queries(2, 2, 12), k12, v12, torch.zeros(2, 1, 1, 4), 1.0)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        op(q, k, v, torch.zeros(2, 1, 1, 40), 1.0)
    cpu = torch.device("cpu")
    assert not kernels.usable(cpu, torch.float32, 12)
    assert not kernels.usable(cpu, torch.bfloat16, 8)
    assert not kernels.usable(torch.device("cuda"), torch.float32, 64)
    assert kernels.usable(cpu, torch.float32, 64) and not kernels.usable(cpu, torch.float32, 256)


def test_the_step_attends_with_it_on_the_cpu(marian_dir, fresh_backbone, op) -> None:
    """The decode step takes the kernel as part of its model (so a compiled package is keyed by it)."""
    from hunyuan_mt.config import GenerationConfig

    backbone = fresh_backbone(marian_dir)
    batch = backbone.new_batch(GenerationConfig())
    batch._build()
    assert batch._decoder_args[3][3] is op


def test_switched_off_or_unbuildable_it_steps_aside_with_a_warning(monkeypatch, caplog) -> None:
    monkeypatch.setenv("HMT_CPU_KERNELS", "0")
    assert kernels._load() is False
    monkeypatch.delenv("HMT_CPU_KERNELS")

    from torch.utils import cpp_extension

    def broken(**kwargs):
        raise RuntimeError("Error building extension 'hmt_cpu_kernels': g++: not found")

    monkeypatch.setattr(cpp_extension, "load", broken)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with caplog.at_level(logging.WARNING, logger="hunyuan_mt.kernels"):
        assert kernels._load() is False
    assert os.environ["PATH"] == "/usr/bin:/bin"  # the venv's folder was on it for the build only
    assert "attention runs as tensor operations" in caplog.text and "g++: not found" in caplog.text


def test_float16_keys_and_values_give_what_float32_gives_on_the_same_values(op) -> None:
    """The kernel widens a float16 cache as it reads: bit for bit the float32 kernel over the rounded values."""
    torch.manual_seed(3)
    k, v = _cache(9, 6, 30, 64)
    k16, v16 = k.half(), v.half()
    q = _queries(9, 6, 64)
    bias = torch.zeros(9, 1, 1, 30)
    bias[::2, ..., :7] = NEG
    assert torch.equal(op(q, k16, v16, bias, 0.125), op(q, k16.float(), v16.float(), bias, 0.125))


def test_the_kv_cache_setting_picks_float16_for_int8_weights(marian_dir, fresh_backbone, op) -> None:
    """model.kv_cache auto: float16 under int8 weights, the model's dtype under float32 ones; the cache a batch
    fills is in that dtype, and its tokens are the float32 cache's."""
    from hunyuan_mt.runtime.backbone import PromptRow
    from hunyuan_mt.config import GenerationConfig, ModelConfig
    from hunyuan_mt.errors import ConfigError
    from hunyuan_mt.lora import BASE_SLOT

    int8 = fresh_backbone(marian_dir, quantization="int8", int8_kernel="fbgemm")
    assert int8.kv_cache_dtype() is torch.float16 and int8.info()["kv_cache"] == "float16"
    plain = fresh_backbone(marian_dir)
    assert plain.kv_cache_dtype() is None and "kv_cache" not in plain.info()
    assert fresh_backbone(marian_dir, kv_cache="float16").kv_cache_dtype() is torch.float16
    wide = fresh_backbone(marian_dir, quantization="int8", int8_kernel="fbgemm", kv_cache="float32")
    assert wide.kv_cache_dtype() is None

    rows = [PromptRow(t, "en", "es") for t in ("Open the file.", "Save the document now, please.", "Close.")]
    seen = []
    batch_class = type(int8.new_batch(GenerationConfig()))
    decode = batch_class._decode

    def spy(self, last, pos):
        seen.append({t.dtype for t in (*self.cache.k, *self.cache.ck)})
        return decode(self, last, pos)

    batch_class._decode = spy
    try:
        half = int8.generate(rows, [BASE_SLOT] * 3, GenerationConfig(), 8)
    finally:
        batch_class._decode = decode
    assert seen and all(s == {torch.float16} for s in seen)
    assert half == wide.generate(rows, [BASE_SLOT] * 3, GenerationConfig(), 8)
    with pytest.raises(ConfigError, match="model.kv_cache: expected one of auto, float32, float16"):
        ModelConfig(kv_cache="bfloat16")


# ---------------------------------------------------------------------------------------------------- fbgemm_linear

@pytest.fixture(scope="module")
def native_linear():
    found = kernels.fbgemm_linear()
    assert found is not None, "the kernels must build here (g++ and ninja are installed with the project)"
    if not int8_fbgemm.available():
        pytest.skip("this torch has no fbgemm")
    assert int8_fbgemm.linear_op() is found
    return found


@pytest.mark.parametrize("rows", [1, 3, 64])
def test_the_cpp_int8_gemm_gives_the_bits_of_the_python_op(native_linear, rows) -> None:
    torch.manual_seed(rows)
    layer = int8_fbgemm.FbgemmLinear.from_float(torch.randn(96, 48), torch.randn(96))
    x = torch.randn(rows, 48)
    with torch.inference_mode():
        cpp = int8_fbgemm.fbgemm_linear(x, layer.scale, layer.bias, native_linear)
        python = int8_fbgemm.fbgemm_linear(x, layer.scale, layer.bias, torch.ops.hmt.fbgemm_linear)
    assert torch.equal(cpp, python)
    assert cpp.shape == (rows, 96)


def test_the_cpp_op_knows_layers_made_before_it_loaded_and_forgets_freed_ones(native_linear, monkeypatch) -> None:
    """Layers made while the library was not loaded yet are in the Python table only: the first `linear_op()`
    copies them over. A layer's entry goes from the C++ table with its handle; a tensor that is no layer's handle
    is refused with a message."""
    monkeypatch.setattr(int8_fbgemm, "_NATIVE", None)
    early = int8_fbgemm.FbgemmLinear.from_float(torch.randn(16, 32), None)
    x = torch.randn(2, 32)
    with torch.inference_mode():
        assert int8_fbgemm.linear_op() is native_linear
        expected = int8_fbgemm.fbgemm_linear(x, early.scale, None, torch.ops.hmt.fbgemm_linear)
        assert torch.equal(int8_fbgemm.fbgemm_linear(x, early.scale, None, native_linear), expected)
        with pytest.raises(RuntimeError, match="no packed weight for this handle"):
            native_linear(x, early.scale.clone())
        int8_fbgemm._forget(early.scale.data_ptr())  # what the handle's finalizer calls when it is freed
        with pytest.raises(RuntimeError, match="no packed weight for this handle"):
            native_linear(x, early.scale)


def test_the_step_calls_the_cpp_int8_gemm(native_linear) -> None:
    """The op is part of each layer's base, so a compiled package is keyed by which one it calls."""
    from hunyuan_mt.decode.dense import Projection

    layer = int8_fbgemm.FbgemmLinear.from_float(torch.randn(24, 16), None)
    base = Projection([layer], None).base
    assert isinstance(base, int8_fbgemm.FbgemmBase) and base.op is native_linear


# ---------------------------------------------------------------------------------------------------- move_rows

@pytest.fixture(scope="module")
def move():
    found = kernels.move_rows()
    assert found is not None, "the kernels must build here (g++ and ninja are installed with the project)"
    return found


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_moving_rows_copies_what_index_copy_copies_and_nothing_else(move, dtype) -> None:
    """A compaction's copy: rows `src` onto rows `dst`, their first `used` columns in every tensor; the other
    columns of those rows and every other row untouched (the cache keeps room beyond the columns in use)."""
    torch.manual_seed(5)
    tensors = [torch.randn(12, 3, 10, 8).to(dtype) for _ in range(4)]
    expected = [t.clone() for t in tensors]
    dst, src = torch.tensor([1, 4, 6]), torch.tensor([11, 9, 10])
    for t in expected:
        view = t[:, :, :7]
        view.index_copy_(0, dst, view.index_select(0, src))
    with torch.inference_mode():
        move(tensors, dst, src, 7)
    assert all(torch.equal(t, e) for t, e in zip(tensors, expected))


def test_moving_rows_refuses_what_would_depend_on_the_order_of_copies(move) -> None:
    t = torch.zeros(6, 2, 4, 8)
    with pytest.raises(RuntimeError, match="dst and src overlap"):
        move([t], torch.tensor([1, 2]), torch.tensor([2, 5]), 4)
    with pytest.raises(RuntimeError, match="out of range"):
        move([t], torch.tensor([1]), torch.tensor([6]), 4)
    with pytest.raises(RuntimeError, match="contiguously"):
        move([t.transpose(2, 3)], torch.tensor([1]), torch.tensor([5]), 4)


def test_a_finished_row_leaves_the_marian_cache_at_once(marian_dir, fresh_backbone) -> None:
    """With the kernel a compaction is cheaper than a step of a finished row riding along, so a Marian batch
    compacts as soon as a row finishes (other architectures wait for a quarter of the rows, as before)."""
    from hunyuan_mt.runtime.backbone import PromptRow
    from hunyuan_mt.config import GenerationConfig
    from hunyuan_mt.decode import Sequence
    from hunyuan_mt.lora import BASE_SLOT

    backbone = fresh_backbone(marian_dir)
    batch = backbone.new_batch(GenerationConfig())
    assert batch.compact_share == 0.0
    texts = ("Open the file.", "Save it.", "Close.", "Print the page.", "Undo")  # one of five: under a quarter
    encoded = [backbone.encode(PromptRow(text, "en", "es")) for text in texts]
    with torch.inference_mode():
        batch.add([Sequence(i, e.input_ids, BASE_SLOT, 20, e.decoder_prefix) for i, e in enumerate(encoded)])
        batch.step()
        batch.rows[0].done = True
        finished = batch.pop_finished()
    assert [r.seq.tag for r in finished] == [0]
    assert sorted(r.seq.tag for r in batch.rows) == [1, 2, 3, 4] and batch.cache.rows == 4


def test_another_environments_headers_get_a_build_folder_of_their_own(monkeypatch) -> None:
    """Two checkouts with a .venv each share the cache folder: a library built against the other's headers is not
    counted as built here (ninja would see a changed command and rebuild it in whichever process loaded first)."""
    from torch.utils import cpp_extension

    here = kernels._build_folder()
    assert kernels._build_folder() == here
    paths = cpp_extension.include_paths("cpu")
    monkeypatch.setattr(cpp_extension, "include_paths", lambda device="cpu": ["/elsewhere/.venv/torch/include"]
                        + paths[1:])
    elsewhere = kernels._build_folder()
    assert elsewhere != here and elsewhere.parent == here.parent
