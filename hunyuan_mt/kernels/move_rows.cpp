// hmt_cpu::move_rows: copy cache rows src onto rows dst in every tensor of a list, in one call.
//
// A running batch compacts its cache when rows finish: the rows kept past the new end move into the places of
// finished ones, in each layer's keys and values, self- and cross-attention (24 tensors for the demo's 6 layers).
// With tensor operations that was an index_select and an index_copy_ per tensor, ~48 small operations each with
// its own dispatch: ~1.7 ms a compaction on the 2-core box, so the engine compacted only once a quarter of the
// rows had finished, and finished rows rode along in the steps until then (4.6 % of the rows a 600-sentence run
// computed). Here the copies are memcpy calls of each (row, head)'s first `used` columns, split over the threads.

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace {

void move_rows(const std::vector<at::Tensor>& tensors, const at::Tensor& dst, const at::Tensor& src, int64_t used) {
  TORCH_CHECK(dst.dim() == 1 && src.dim() == 1 && dst.numel() == src.numel(),
              "hmt_cpu::move_rows: dst and src must be 1-d of the same length");
  TORCH_CHECK(dst.scalar_type() == at::kLong && src.scalar_type() == at::kLong,
              "hmt_cpu::move_rows: dst and src must be int64");
  const int64_t pairs = dst.numel();
  if (pairs == 0 || used == 0 || tensors.empty()) return;
  const auto dst_c = dst.contiguous(), src_c = src.contiguous();
  const int64_t* to = dst_c.data_ptr<int64_t>();
  const int64_t* from = src_c.data_ptr<int64_t>();
  // A row both read and written would make the result depend on the order of the copies.
  for (int64_t p = 0; p < pairs; ++p)
    for (int64_t q = 0; q < pairs; ++q) TORCH_CHECK(to[p] != from[q], "hmt_cpu::move_rows: dst and src overlap");
  const auto [lowest, highest] = std::minmax({*std::min_element(to, to + pairs), *std::min_element(from, from + pairs),
                                              *std::max_element(to, to + pairs),
                                              *std::max_element(from, from + pairs)});
  for (const auto& t : tensors) {
    TORCH_CHECK(t.device().is_cpu() && t.dim() == 4, "hmt_cpu::move_rows: CPU tensors [rows, heads, columns, dim]");
    TORCH_CHECK(t.stride(3) == 1 && t.stride(2) == t.size(3) && used <= t.size(2),
                "hmt_cpu::move_rows: each (row, head) must hold its columns contiguously, at least `used` of them");
    TORCH_CHECK(lowest >= 0 && highest < t.size(0), "hmt_cpu::move_rows: row index out of range");
  }
  const int64_t count = static_cast<int64_t>(tensors.size());
  at::parallel_for(0, count * pairs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t job = begin; job < end; ++job) {
      const at::Tensor& t = tensors[job / pairs];
      const int64_t p = job % pairs;
      const int64_t heads = t.size(1), bytes = used * t.size(3) * t.element_size();
      char* base = static_cast<char*>(t.data_ptr());
      for (int64_t h = 0; h < heads; ++h) {
        char* out = base + (to[p] * t.stride(0) + h * t.stride(1)) * t.element_size();
        const char* in = base + (from[p] * t.stride(0) + h * t.stride(1)) * t.element_size();
        std::memcpy(out, in, bytes);
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(hmt_cpu, m) {
  m.def("move_rows(Tensor(a!)[] tensors, Tensor dst, Tensor src, int used) -> ()", &move_rows);
}
