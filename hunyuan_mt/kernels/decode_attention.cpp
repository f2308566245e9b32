// hmt_cpu::decode_attention: attention of one new query per row over that row's own columns of a shared cache.
//
// Why a kernel of our own (hunyuan_mt/kernels/__init__.py has the numbers): a decode step's attention is a pass
// over every row's cached keys and values, and on the CPU that pass is bound by memory, not arithmetic. The batch's
// cache is a rectangle (rows × the longest history), and rows that joined later or have shorter sources leave
// columns in it that they mask: written with tensor operations, the step reads every column of every row anyway.
// Here each row reads only the columns from its first unmasked one to its last.
//
// The result of a row does not depend on the rows beside it, to the bit: a row's scores are dot products over
// head_dim in a fixed order, its softmax and weighted sum of values run over its own columns in column order from
// its first one, and the columns skipped are ones whose weight is exactly zero.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#if defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

#include <algorithm>
#include <limits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;

// head_dim in vector registers: the weighted sum of values keeps one accumulator per chunk of head_dim.
constexpr int64_t kMaxChunks = 32;

// Cached keys and values as float32 vectors: the cache keeps them in float32, or in float16 to halve what a step
// reads (model.kv_cache), widened here as they are loaded (F16C).
inline Vec load(const float* p) { return Vec::loadu(p); }

inline Vec load(const at::Half* p) {
#if defined(CPU_CAPABILITY_AVX2) && defined(__F16C__)
  return Vec(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  float wide[Vec::size()];
  for (int64_t i = 0; i < Vec::size(); ++i) wide[i] = static_cast<float>(p[i]);
  return Vec::loadu(wide);
#endif
}

// A column whose additive bias is at or below this is masked (the engine masks with finfo(float32).min / 2).
constexpr float kMasked = std::numeric_limits<float>::lowest() / 4;

// Rows of the bias [B, 1, 1, W]: the first and one past the last column each row sees.
void row_ranges(const at::Tensor& bias, std::vector<int64_t>& lo, std::vector<int64_t>& hi) {
  const int64_t rows = bias.size(0), width = bias.size(3);
  const float* data = bias.data_ptr<float>();
  const int64_t row_stride = bias.stride(0), col_stride = bias.stride(3);
  for (int64_t b = 0; b < rows; ++b) {
    const float* row = data + b * row_stride;
    int64_t first = 0, last = width - 1;
    while (first < width && row[first * col_stride] <= kMasked) ++first;
    while (last >= first && row[last * col_stride] <= kMasked) --last;
    if (first > last) {
      // Sees nothing (a padding row): every column, as a softmax over equal scores would average them.
      first = 0;
      last = width - 1;
    }
    lo[b] = first;
    hi[b] = last + 1;
  }
}

template <typename T>
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias, double scale,
            at::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), W = bias.size(3);
  // Grouped-query attention: `group` query heads share one key/value head (1 without GQA).
  const int64_t group = H / k.size(1);
  std::vector<int64_t> lo(B), hi(B);
  row_ranges(bias, lo, hi);

  const float* qp = q.data_ptr<float>();
  const T* kp = k.data_ptr<T>();
  const T* vp = v.data_ptr<T>();
  const float* bp = bias.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t ks = k.stride(2), vs = v.stride(2), bs = bias.stride(3);
  const int64_t chunks = D / Vec::size();
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> weights(W);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / H, h = i % H;
      const float* qi = qp + b * q.stride(0) + h * q.stride(1);
      const T* kb = kp + b * k.stride(0) + (h / group) * k.stride(1);
      const T* vb = vp + b * v.stride(0) + (h / group) * v.stride(1);
      const float* bb = bp + b * bias.stride(0);
      const int64_t c0 = lo[b], n = hi[b] - lo[b];

      float top = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        const T* kc = kb + (c0 + j) * ks;
        // Memory, not arithmetic, is the cost: ask for this column's values (read next) and a later column's
        // keys while the dot product runs (six attentions over 64 rows in a loop, float32: 0.88× inductor's
        // written-out attention with these prefetches, 1.03× without; medians of 7).
        for (int64_t d = 0; d < D; d += 64 / static_cast<int64_t>(sizeof(T))) {
          __builtin_prefetch(vb + (c0 + j) * vs + d);
          __builtin_prefetch(kc + 4 * ks + d);
        }
        Vec acc(0.f);
        for (int64_t u = 0; u < chunks; ++u) {
          acc = at::vec::fmadd(Vec::loadu(qi + u * Vec::size()), load(kc + u * Vec::size()), acc);
        }
        const float score =
            at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, acc) * fscale + bb[(c0 + j) * bs];
        weights[j] = score;
        top = std::max(top, score);
      }

      // exp is elementwise (the tail runs the same vector routine), the sum runs in column order.
      int64_t j = 0;
      for (; j + Vec::size() <= n; j += Vec::size()) {
        (Vec::loadu(weights.data() + j) - Vec(top)).exp().store(weights.data() + j);
      }
      if (j < n) {
        (Vec::loadu(weights.data() + j, n - j) - Vec(top)).exp().store(weights.data() + j, n - j);
      }
      float total = 0.f;
      for (j = 0; j < n; ++j) total += weights[j];

      // The values, streamed column by column into one accumulator per chunk of head_dim.
      Vec acc[kMaxChunks];
      for (int64_t u = 0; u < chunks; ++u) acc[u] = Vec(0.f);
      for (j = 0; j < n; ++j) {
        const T* vc = vb + (c0 + j) * vs;
        const Vec w(weights[j]);
        for (int64_t u = 0; u < chunks; ++u) acc[u] = at::vec::fmadd(w, load(vc + u * Vec::size()), acc[u]);
      }
      float* oi = op + (b * H + h) * D;
      const Vec inv(total);
      for (int64_t u = 0; u < chunks; ++u) (acc[u] / inv).store(oi + u * Vec::size());
    }
  });
}

// q [B, H, 1, D] float32; k, v [>= B, KV, >= W, D] (a cache with room beyond the rows and columns in use), float32
// or float16, KV dividing H (grouped-query attention: query head h reads key/value head h / (H / KV); the heads of
// a group are neighbours in the parallel loop, so the second reads what the first brought into the cache);
// bias [B, 1, 1, W] additive, float32. Returns [B, H, D] float32.
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
                            double scale) {
  TORCH_CHECK(q.dim() == 4 && q.size(2) == 1, "decode_attention: q must be [rows, heads, 1, head_dim]");
  TORCH_CHECK(k.dim() == 4 && v.dim() == 4 && bias.dim() == 4, "decode_attention: k, v and bias must be 4-D");
  for (const at::Tensor* t : {&q, &k, &v, &bias}) TORCH_CHECK(t->device().is_cpu(), "decode_attention: CPU tensors");
  TORCH_CHECK(q.scalar_type() == at::kFloat && bias.scalar_type() == at::kFloat,
              "decode_attention: float32 queries and bias");
  TORCH_CHECK(k.scalar_type() == v.scalar_type() &&
                  (k.scalar_type() == at::kFloat || k.scalar_type() == at::kHalf),
              "decode_attention: keys and values both float32 or both float16");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), W = bias.size(3);
  TORCH_CHECK(D % Vec::size() == 0 && D / Vec::size() <= kMaxChunks, "decode_attention: head_dim ", D,
              " must be a multiple of ", Vec::size(), " and at most ", kMaxChunks * Vec::size());
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "decode_attention: head_dim not contiguous");
  TORCH_CHECK(k.size(1) > 0 && H % k.size(1) == 0 && v.size(1) == k.size(1),
              "decode_attention: the key/value heads must divide the query heads");
  TORCH_CHECK(k.size(0) >= B && v.size(0) >= B && k.size(2) >= W &&
                  v.size(2) >= W && k.size(3) == D && v.size(3) == D && bias.size(0) == B,
              "decode_attention: shapes do not match");
  auto out = at::empty({B, H, D}, q.options());
  if (k.scalar_type() == at::kHalf) {
    attend<at::Half>(q, k, v, bias, scale, out);
  } else {
    attend<float>(q, k, v, bias, scale, out);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(hmt_cpu, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor bias, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(hmt_cpu, CPU, m) {
  m.impl("decode_attention", &decode_attention);
}
