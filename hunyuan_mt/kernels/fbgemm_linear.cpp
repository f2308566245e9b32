// hmt_cpu::fbgemm_linear: the int8 GEMM of hunyuan_mt/int8_fbgemm.py called from C++, without Python in between.
//
// The compiled decode step calls its int8 layers through AOTInductor's proxy executor, which calls the op by name.
// Implemented in Python (hmt::fbgemm_linear), every call went C++ → Python (wrap the tensors, look the packed weight
// up in a dict, the torchbind op's Python dispatch check) → C++ again, holding the GIL while the step's other
// thread waited: at one row per step that was a quarter of the step (perf, 2026-12-02). Here the packed weights sit
// in a table keyed by their handle's storage (the layer's row-scale tensor, as in Python), filled from Python when
// a layer is made (fbgemm_register) and emptied when its handle is freed (fbgemm_forget), and the op looks its
// weight up and calls fbgemm through the packed weight's own virtual method: the arithmetic is the same call as
// the Python op's, so the results are the same to the bit (tests/test_kernels.py).

#include <ATen/core/Tensor.h>
#include <ATen/native/quantized/PackedParams.h>
#include <torch/library.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace {

using Packed = c10::intrusive_ptr<LinearPackedParamsBase>;

// The activations' fixed grid (int8_fbgemm.py: each token is scaled into [-1, 1] before the call).
constexpr double kInputScale = 1.0 / 127.0;
constexpr int64_t kInputZero = 128;

std::mutex table_mutex;
std::unordered_map<int64_t, Packed>& table() {
  static auto* packed = new std::unordered_map<int64_t, Packed>();  // never destroyed: ops may run at exit
  return *packed;
}

int64_t key_of(const at::Tensor& handle) { return reinterpret_cast<int64_t>(handle.data_ptr()); }

void fbgemm_register(const at::Tensor& handle, const Packed& packed) {
  std::lock_guard<std::mutex> guard(table_mutex);
  table()[key_of(handle)] = packed;
}

void fbgemm_forget(int64_t key) {
  std::lock_guard<std::mutex> guard(table_mutex);
  table().erase(key);
}

at::Tensor fbgemm_linear(const at::Tensor& x, const at::Tensor& handle) {
  Packed packed;
  {
    std::lock_guard<std::mutex> guard(table_mutex);
    auto found = table().find(key_of(handle));
    TORCH_CHECK(found != table().end(),
                "hmt_cpu::fbgemm_linear: no packed weight for this handle (not made by FbgemmLinear)");
    packed = found->second;
  }
  return packed->apply_with_input_q_dq_qweight_dq_output_fp32(x, kInputScale, kInputZero);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(hmt_cpu, m) {
  m.def("fbgemm_register(Tensor handle, __torch__.torch.classes.quantized.LinearPackedParamsBase packed) -> ()",
        &fbgemm_register);
  m.def("fbgemm_forget(int key) -> ()", &fbgemm_forget);
  m.def("fbgemm_linear(Tensor x, Tensor handle) -> Tensor");
}

TORCH_LIBRARY_IMPL(hmt_cpu, CPU, m) { m.impl("fbgemm_linear", &fbgemm_linear); }
