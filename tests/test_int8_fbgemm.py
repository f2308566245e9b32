"""int8 weights through fbgemm (hunyuan_mt/quant/fbgemm.py): a row's output is its own, AVX2's pairwise int16
products never saturate, fused layers compute what their parts compute, and the packed weights follow their
layers."""

from __future__ import annotations

import gc

import pytest
import torch

from hunyuan_mt.quant import fbgemm as int8_fbgemm
from hunyuan_mt.quant.fbgemm import FbgemmLinear, fbgemm_linear

pytestmark = pytest.mark.skipif(not int8_fbgemm.available(), reason="this torch build has no fbgemm")


def _linear(inp: int, out: int, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(inp, out)


def test_close_to_float32_and_each_row_is_its_own() -> None:
    """fbgemm quantizes its input on one scale per call; scaled token by token first, a row computes exactly what
    it computes alone, however large its neighbours."""
    linear = _linear(96, 80)
    q = FbgemmLinear.from_linear(linear)
    x = torch.randn(9, 96) * torch.tensor([[0.01], [1.0], [30.0], [1.0], [0.2], [5.0], [1.0], [0.0], [400.0]])
    with torch.inference_mode():
        ours, ref = q(x), linear(x)
        assert (ours - ref).norm() / ref.norm() < 0.03
        alone = torch.cat([q(x[i:i + 1]) for i in range(len(x))])
        assert torch.equal(ours, alone)
        assert torch.equal(ours[7], linear.bias.detach())  # a zero row gets the bias alone
        in_threes = torch.cat([q(x[i:i + 3]) for i in range(0, 9, 3)])
        assert torch.equal(ours, in_threes)
    assert (q.in_features, q.out_features) == (96, 80)


def test_large_products_do_not_saturate() -> None:
    """AVX2 multiplies pairs of unsigned activations and signed weights into int16: with 8-bit weights a row of
    ones against a row of ones came back 3.0 instead of 384. The 7-bit weight grid keeps every pair in range."""
    linear = torch.nn.Linear(384, 8, bias=False)
    with torch.no_grad():
        linear.weight.fill_(1.0)
        linear.weight[1].fill_(-1.0)
    q = FbgemmLinear.from_linear(linear)
    x = torch.ones(2, 384)
    x[1] = -1.0
    with torch.inference_mode():
        y = q(x)
    torch.testing.assert_close(y[0, :2], torch.tensor([384.0, -384.0]), atol=0.5, rtol=0)
    torch.testing.assert_close(y[1, :2], torch.tensor([-384.0, 384.0]), atol=0.5, rtol=0)


def test_stacked_layers_compute_what_each_computes() -> None:
    """Q, K and V fused into one GEMM: their int8 rows and scales as they are, so the fused output is the three
    outputs side by side, bit for bit."""
    parts = [FbgemmLinear.from_linear(_linear(64, w, seed)) for seed, w in enumerate((48, 16, 32))]
    parts[1] = FbgemmLinear(parts[1].int8_rows(), parts[1].scale, None)  # one without a bias
    fused = FbgemmLinear.stacked(parts)
    x = torch.randn(5, 64)
    with torch.inference_mode():
        assert torch.equal(fused(x), torch.cat([p(x) for p in parts], dim=1))
    assert fused.out_features == 96 and torch.equal(fused.bias[48:64], torch.zeros(16))


def test_dequantized_weights_are_on_the_seven_bit_grid() -> None:
    linear = _linear(32, 24)
    q = FbgemmLinear.from_linear(linear)
    w, b = q.dequantized()
    step = linear.weight.detach().abs().amax(dim=1) / 63
    assert bool(((w - linear.weight.detach()).abs() <= step[:, None] / 2 + 1e-7).all())
    assert int(q.int8_rows().abs().max()) == 63 and torch.equal(b, linear.bias.detach())


def test_the_op_finds_packed_weights_by_their_layer_and_only_theirs() -> None:
    """The compiled step calls the custom op with the layer's scales as the handle; a tensor that is no layer's
    handle is refused with a message, and a layer's entry goes with the layer."""
    q = FbgemmLinear.from_linear(_linear(16, 8))
    x = torch.randn(2, 16)
    with torch.inference_mode():
        torch.testing.assert_close(fbgemm_linear(x, q.scale, q.bias), q(x), atol=0, rtol=0)
        with pytest.raises(RuntimeError, match="no packed weight for this handle"):
            fbgemm_linear(x, q.scale.clone(), None)
    key = q.scale.data_ptr()
    assert key in int8_fbgemm._TABLE
    del q
    gc.collect()
    assert key not in int8_fbgemm._TABLE


def test_a_layer_moved_with_to_keeps_its_packed_weight() -> None:
    linear = _linear(16, 8)
    model = torch.nn.Sequential(FbgemmLinear.from_linear(linear))
    x = torch.randn(3, 16)
    with torch.inference_mode():
        before = model(x)
        handle = model[0].scale
        model._apply(lambda t: t.clone())  # what .to() does when it moves a buffer: a new tensor in its place
        assert model[0].scale is not handle
        assert torch.equal(model(x), before)


def test_a_move_that_keeps_the_handle_registers_nothing(monkeypatch) -> None:
    """`.to()` onto the device and dtype a layer is on keeps its tensors: its handle is not registered again (each
    registration adds a finalizer to the handle)."""
    layer = FbgemmLinear.from_linear(_linear(16, 8))
    calls: list[int] = []
    monkeypatch.setattr(int8_fbgemm, "_register", lambda handle, packed: calls.append(handle.data_ptr()))
    layer.to("cpu")
    layer.float()
    assert calls == []
    layer._apply(lambda t: t.clone())
    assert calls == [layer.scale.data_ptr()]


def test_fbgemm_is_the_faster_kernel_where_torch_int_mm_is_a_loop() -> None:
    """What the probe measures here decides the shipped kernel; on an AVX2-only CPU torch._int_mm has no kernel
    and fbgemm must win by far (on AVX-512 either may)."""
    from hunyuan_mt.quant.int8 import gemm_speed

    speed = gemm_speed(torch.get_num_threads())
    if torch.backends.cpu.get_cpu_capability() != "AVX2":
        pytest.skip("torch._int_mm has an int8 kernel on this CPU")
    assert speed.kernel == "fbgemm" and speed.fbgemm_us * 5 < speed.int8_us


@pytest.mark.parametrize("faster", ["qgemm", "fbgemm"])
def test_a_model_too_large_for_the_caches_gets_a_packed_kernel_unless_one_is_pinned(
        faster: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """int8.kernel_for: the probe's choice for a small model (the demo); for one whose int8 weights exceed
    LARGE_MODEL_BYTES (decode steps bound by reading them), the prepacked kernel `large_gemm_speed` timed faster
    (its timing is replaced here: on a CPU where the two are close, a real timing picks either); the pinned kernel
    always."""
    from hunyuan_mt.quant import int8
    from hunyuan_mt.quant import packed as int8_packed

    slow, quick = {1: 2.0, 16: 8.0}, {1: 1.0, 16: 4.0}
    timed = int8.LargeGemmSpeed(fbgemm_ms=quick if faster == "fbgemm" else slow,
                                qgemm_ms=quick if faster == "qgemm" else slow, isa="avx2")
    monkeypatch.setattr(int8, "large_gemm_speed", lambda threads: timed)
    probe = int8.GemmSpeed(int8_us=10.0, float32_us=40.0, capability="AVX512", fbgemm_us=30.0)
    assert probe.kernel == "int_mm"
    assert int8.kernel_for(probe, 13 * 2**20) == "int_mm"
    large = int8.LARGE_MODEL_BYTES + 1
    qgemm, fbgemm = int8_packed.available(), int8_fbgemm.available()
    expected = faster if qgemm and fbgemm else "qgemm" if qgemm else "fbgemm" if fbgemm else "int_mm"
    assert int8.kernel_for(probe, large) == expected
    pinned = int8.GemmSpeed(10.0, 40.0, "AVX512", 30.0, pinned="int_mm")
    assert int8.kernel_for(pinned, large) == "int_mm"
