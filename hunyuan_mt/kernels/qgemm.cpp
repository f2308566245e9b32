// hmt_cpu::qgemm: x [M, K] float32 times packed 8-bit or 4-bit weights, for a decoder-only model's decode steps.
//
// Why our own GEMM. At HY-MT1.5-1.8B's shapes a decode step is bound by reading the weights (1.7 GB of int8 a
// token): fbgemm's GEMM read them at ~14 GB/s of the box's 22.5 at one row, and at 16 rows it read them and then
// computed instead of overlapping the two (2.2× the one-row time where the arithmetic allows ~1.2×; BENCHMARKS.md,
// bench/qgemm.py). Here each block of 64 output columns is read once from memory for a panel of up to 16 rows, chunk by
// chunk, and each chunk is multiplied, while it sits in registers, by 4 rows at a time (`vpdpbusd`: 64 byte
// products an instruction), so the reading overlaps the whole panel's arithmetic; further panels read the block
// again from the core's L2. And the same code reads 4-bit weights (half the bytes: the only way past int8's
// bandwidth bound).
//
// Arithmetic (the same in every path, so the results are the same bits with AVX-512 VNNI, AVX2 or plain C++):
// - each row of x is quantized on its own symmetric 8-bit grid (scale = its largest magnitude / 127), so a row's
//   result never depends on the rows beside it;
// - weights are stored unsigned, w + offset (8-bit: w in ±63, offset 64; 4-bit: w in ±7, offset 8), because
//   VNNI multiplies unsigned by signed bytes; Σ (w + offset)·x − offset·Σx is exact in int32;
// - 8-bit weights have one scale per output column; 4-bit ones one per column and group of `group` inputs (128
//   where the width allows), and each group's int32 sum is converted and accumulated with one fused multiply-add;
// - out = fma(accumulated, x's scale, bias): every float operation is an explicit fma or an exact conversion,
//   never left to the compiler to contract, so the vector and scalar paths round alike.
// The 8-bit grid stops at ±63 so that AVX2's pairwise int16 products (`vpmaddubsw`: 2 · 127 · 127 < 32,768) can
// never saturate; VNNI would not need it, but one grid for all paths keeps a model's output the same on every CPU.
//
// Layout of the packed weight (int8_packed.py packs and unpacks it): superblocks of 64 columns, each K·64 bytes
// (8-bit) or K·32 (4-bit), contiguous. 8-bit: [K/4][4 column blocks][16 columns][4 consecutive k]: one 64-byte
// vector is 16 columns × 4 k, what `vpdpbusd` takes against 4 bytes of x broadcast. 4-bit: [K/8][4][16][4], the
// low nibble k..k+3 and the high nibble k+4..k+7 of an 8-k step.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

constexpr int64_t kBlock = 64;  // output columns of a superblock
constexpr int kTile = 4;        // rows multiplied against one superblock's weights while they sit in registers
constexpr int kPanel = 16;      // rows whose arithmetic overlaps one read of a superblock's weights (4 tiles)
constexpr int64_t kChunk = 128;  // inputs per pass over a panel's tiles (8 KB of 8-bit weights)

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512Vnni = 2 };

Isa detect() {
  __builtin_cpu_init();
  Isa best = Isa::kScalar;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::kAvx2;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vnni"))
    best = Isa::kAvx512Vnni;
  // HMT_QGEMM_ISA caps the path (tests run all three on one CPU and compare the bits).
  if (const char* cap = std::getenv("HMT_QGEMM_ISA")) {
    const std::string want(cap);
    Isa capped = want == "scalar" ? Isa::kScalar : want == "avx2" ? Isa::kAvx2 : best;
    if (static_cast<int>(capped) < static_cast<int>(best)) best = capped;
  }
  return best;
}

Isa isa() {
  static const Isa chosen = detect();
  return chosen;
}

struct Problem {
  const int8_t* xq;    // [M, K] x on its rows' grids
  const float* xs;     // [M] each row's scale
  const int32_t* sx;   // [M, G] each row's sum of xq over each group
  const uint8_t* w;    // packed weights
  const float* ws;     // [superblocks, G, 64] weight scales
  const float* bias;   // [N] or nullptr
  float* out;          // [M, N]
  int64_t M, N, K, G, group, sb_bytes;
  int bits;
  int32_t offset;
};

inline int32_t load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// out = fma(facc, x's scale, bias) for rows r0.. of one superblock; columns past N are padding.
inline void finish(const Problem& p, int64_t sb, int64_t r0, int rows, const float (*facc)[kBlock]) {
  const int64_t c0 = sb * kBlock, width = std::min<int64_t>(kBlock, p.N - c0);
  for (int r = 0; r < rows; ++r) {
    float* o = p.out + (r0 + r) * p.N + c0;
    const float s = p.xs[r0 + r];
    for (int64_t c = 0; c < width; ++c) o[c] = std::fma(facc[r][c], s, p.bias ? p.bias[c0 + c] : 0.0f);
  }
}

// ---------------------------------------------------------------------------------------------------- plain C++

inline int32_t weight_at(const Problem& p, const uint8_t* wsb, int64_t k, int64_t col) {
  const int64_t j = col / 16, c = col % 16;
  if (p.bits == 8) return wsb[(k / 4) * 256 + j * 64 + c * 4 + k % 4];
  const uint8_t byte = wsb[(k / 8) * 256 + j * 64 + c * 4 + k % 4];
  return (k % 8) < 4 ? (byte & 15) : (byte >> 4);
}

void superblock_scalar(const Problem& p, int64_t sb, int64_t r0, int rows) {
  float facc[kTile][kBlock] = {};
  const uint8_t* wsb = p.w + sb * p.sb_bytes;
  for (int64_t g = 0; g < p.G; ++g) {
    int32_t acc[kTile][kBlock] = {};
    for (int64_t k = g * p.group; k < (g + 1) * p.group; ++k)
      for (int64_t col = 0; col < kBlock; ++col) {
        const int32_t u = weight_at(p, wsb, k, col);
        for (int r = 0; r < rows; ++r) acc[r][col] += u * p.xq[(r0 + r) * p.K + k];
      }
    const float* ws = p.ws + (sb * p.G + g) * kBlock;
    for (int r = 0; r < rows; ++r) {
      const int32_t off = p.offset * p.sx[(r0 + r) * p.G + g];
      for (int64_t col = 0; col < kBlock; ++col)
        facc[r][col] = std::fma(static_cast<float>(acc[r][col] - off), ws[col], facc[r][col]);
    }
  }
  finish(p, sb, r0, rows, facc);
}

// ----------------------------------------------------------------------------------------------------- AVX2

// AVX2 has no `vpdpbusd`: a product of 4 bytes per column takes `vpmaddubsw` (pairs to int16) and `vpmaddwd`
// against ones (pairs of those to int32), two multiplies where VNNI has one, so at 16 rows an AVX2 step is bound by
// that arithmetic, not by memory. What matters then is that each weight vector loaded is multiplied by as many
// rows as the 16 registers allow. A tile is ROWS rows × COLS vectors of 8 columns (32 bytes: 8 columns × 4 k for
// 8-bit, 8 columns × 8 k in two nibbles for 4-bit): ROWS × COLS int32 accumulators, COLS weight vectors, the row's
// broadcast and the constants: 4 × 2, 2 × 4 or 1 × 8. The first version took one row at a time over the whole
// superblock, reloading every weight for every row (16 rows: 2.9× the one-row step on a 2-core AMD Zen 3).
#define HMT_AVX2 __attribute__((target("avx2,fma"), always_inline)) inline

// The AVX2 path's chunk of inputs and how far ahead its tiles prefetch (bytes): a 16-row panel over weights read
// from memory, one thread of an AMD Zen 3, variants interleaved (a standalone copy of the loop): chunks of 128
// inputs with 8 KB ahead 51-56 GMAC/s, 256 with 8 KB 41, 64 with 4 KB 63-64, 32 with 4 KB 61. (VNNI computes a
// chunk four times as fast and keeps its own, kChunk.)
constexpr int64_t kChunkAvx2 = 64;
constexpr int64_t kPrefetchAvx2 = 4096;

HMT_AVX2 __m256i bcast4(const int8_t* p) { return _mm256_set1_epi32(load4(p)); }

// The 4 (8-bit) or 8 (4-bit) byte products of one weight vector with one row's broadcast inputs, as 8 int32 sums.
template <int BITS>
HMT_AVX2 __m256i dot_avx2(__m256i w, __m256i x0, __m256i x1, __m256i ones, __m256i low) {
  if (BITS == 8) return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x0), ones);
  // Two pairwise products of at most 15 · 127 · 2 each: their int16 sum cannot saturate.
  const __m256i lo = _mm256_and_si256(w, low), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
  return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1)), ones);
}

// Rows r0.. (ROWS of them) times inputs [k0, k1) of the superblock at `wsb`, columns of vectors h0..h0+COLS−1,
// added to iacc (rows of kBlock int32). `prefetch`: this tile also asks for its weights kPrefetchAvx2 ahead.
template <int BITS, int ROWS, int COLS>
__attribute__((target("avx2,fma"))) void tile_avx2(const Problem& p, const uint8_t* wsb, int64_t r0, int64_t k0,
                                                   int64_t k1, int h0, int32_t* iacc, bool prefetch) {
  constexpr int64_t step = BITS == 8 ? 4 : 8;
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0F);
  const int8_t* x[ROWS];
  for (int r = 0; r < ROWS; ++r) x[r] = p.xq + (r0 + r) * p.K;
  __m256i acc[ROWS][COLS];
#pragma GCC unroll 8
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < COLS; ++c) acc[r][c] = _mm256_setzero_si256();
  const uint8_t* wp = wsb + (k0 / step) * 256 + h0 * 32;
  for (int64_t k = k0; k < k1; k += step, wp += 256) {
    // One prefetch per 64-byte line of this tile's columns (a tile of one vector asks for its line's first half).
    if (prefetch && (COLS > 1 || h0 % 2 == 0))
      for (int c = 0; c < COLS; c += 2) _mm_prefetch(reinterpret_cast<const char*>(wp) + kPrefetchAvx2 + c * 32,
                                                     _MM_HINT_T0);
    __m256i w[COLS];
#pragma GCC unroll 8
    for (int c = 0; c < COLS; ++c) w[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + c * 32));
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; ++r) {
      const __m256i x0 = bcast4(x[r] + k), x1 = BITS == 8 ? x0 : bcast4(x[r] + k + 4);
#pragma GCC unroll 8
      for (int c = 0; c < COLS; ++c) acc[r][c] = _mm256_add_epi32(acc[r][c], dot_avx2<BITS>(w[c], x0, x1, ones, low));
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < COLS; ++c) {
      __m256i* d = reinterpret_cast<__m256i*>(iacc + r * kBlock + (h0 + c) * 8);
      _mm256_store_si256(d, _mm256_add_epi32(_mm256_load_si256(d), acc[r][c]));
    }
}

// `rows` (1..4) rows from r0 over the whole superblock width, in tiles whose values fit the 16 registers: 8-bit
// 1 × 8, 2 × 4, 3 or 4 × 2 vectors; 4-bit, whose weights take two more registers each once unpacked, 1 × 4, 2 × 2,
// 3 or 4 × 1 (with 4 × 2, GCC 12 kept six of the eight accumulators on the stack).
template <int BITS, int ROWS, int COLS>
void tile_pass_avx2(const Problem& p, const uint8_t* wsb, int64_t r0, int64_t k0, int64_t k1, int32_t* iacc,
                    bool prefetch) {
  for (int h0 = 0; h0 < 8; h0 += COLS) tile_avx2<BITS, ROWS, COLS>(p, wsb, r0, k0, k1, h0, iacc, prefetch);
}

template <int BITS>
void tiles_avx2(const Problem& p, const uint8_t* wsb, int64_t r0, int rows, int64_t k0, int64_t k1, int32_t* iacc,
                bool prefetch) {
  constexpr int wide = BITS == 8 ? 2 : 1;
  switch (rows) {
    case 1: tile_pass_avx2<BITS, 1, 4 * wide>(p, wsb, r0, k0, k1, iacc, prefetch); break;
    case 2: tile_pass_avx2<BITS, 2, 2 * wide>(p, wsb, r0, k0, k1, iacc, prefetch); break;
    case 3: tile_pass_avx2<BITS, 3, wide>(p, wsb, r0, k0, k1, iacc, prefetch); break;
    default: tile_pass_avx2<BITS, 4, wide>(p, wsb, r0, k0, k1, iacc, prefetch); break;
  }
}

// A panel of up to kPanel rows against one superblock, chunk by chunk as the VNNI path does (see there): the chunk's
// weights come from memory for the first tile and from L1 for the others, and the first tile prefetches ahead.
__attribute__((target("avx2,fma"))) void superblock_avx2(const Problem& p, int64_t sb, int64_t r0, int rows) {
  alignas(64) float facc[kPanel][kBlock];
  alignas(64) int32_t iacc[kPanel][kBlock];
  const uint8_t* wsb = p.w + sb * p.sb_bytes;
  const int tiles = (rows + kTile - 1) / kTile;
  for (int r = 0; r < rows; ++r)
    for (int64_t c = 0; c < kBlock; ++c) facc[r][c] = 0.0f;
  for (int64_t g = 0; g < p.G; ++g) {
    for (int r = 0; r < rows; ++r)
      for (int64_t c = 0; c < kBlock; ++c) iacc[r][c] = 0;
    const int64_t end = (g + 1) * p.group;
    for (int64_t k0 = g * p.group; k0 < end; k0 += kChunkAvx2) {
      const int64_t k1 = std::min(end, k0 + kChunkAvx2);
      for (int t = 0; t < tiles; ++t) {
        const int n = std::min(kTile, rows - t * kTile);
        // Every tile prefetches (the first tile alone left the next chunk's read to overlap a quarter of the
        // panel's arithmetic: 16 rows streaming from memory, one thread, 45-50 against 50-60 GMAC/s).
        if (p.bits == 8) tiles_avx2<8>(p, wsb, r0 + t * kTile, n, k0, k1, iacc[t * kTile], true);
        else tiles_avx2<4>(p, wsb, r0 + t * kTile, n, k0, k1, iacc[t * kTile], true);
      }
    }
    const float* ws = p.ws + (sb * p.G + g) * kBlock;
    for (int r = 0; r < rows; ++r) {
      const __m256i off = _mm256_set1_epi32(p.offset * p.sx[(r0 + r) * p.G + g]);
      for (int j = 0; j < 8; ++j) {
        const __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_load_si256(
            reinterpret_cast<const __m256i*>(iacc[r] + j * 8)), off));
        _mm256_store_ps(facc[r] + j * 8, _mm256_fmadd_ps(v, _mm256_loadu_ps(ws + j * 8), _mm256_load_ps(facc[r] + j * 8)));
      }
    }
  }
  finish(p, sb, r0, rows, facc);
}

// ------------------------------------------------------------------------------------------------ AVX-512 VNNI

// The accumulators are named variables, not an array: with `__m512i acc[ROWS][4]` GCC 12 copied them between
// registers and reloaded the weights inside the loop (about 90 instructions for 16 products; objdump, 2026-12-06).
// The loop is now the 4 weight loads, the row broadcasts and the products.
#define HMT_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) inline

// `vpdpbusd` as one asm statement with the accumulator in and out in the same register: through the intrinsic
// GCC 12 still moved every accumulator to another register and back at each product.
HMT_VNNI void dpbusd(__m512i& acc, __m512i w, __m512i x) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x));
}

HMT_VNNI void dot4(__m512i& a0, __m512i& a1, __m512i& a2, __m512i& a3, __m512i w0, __m512i w1, __m512i w2,
                   __m512i w3, __m512i x) {
  dpbusd(a0, w0, x);
  dpbusd(a1, w1, x);
  dpbusd(a2, w2, x);
  dpbusd(a3, w3, x);
}

HMT_VNNI __m512i broadcast4(const int8_t* p) { return _mm512_set1_epi32(load4(p)); }

// How far ahead the weights are prefetched into L2: the hardware's streamer stops at each 4 KB page, and a
// 64-column superblock is one long sequential read. Measured on the 2-core Xeon (32 layers of the 1.8B in turn,
// settings alternating in one process): no prefetch 72 / 152 ms a step at 1 / 16 rows (8-bit), 4 or 8 KB ahead
// 65–69 / 119–137 ms.
constexpr int64_t kPrefetch = 8192;

// Adds a tile row's four accumulators into its int32 sums in L1.
HMT_VNNI void add_into(int32_t* dst, __m512i a0, __m512i a1, __m512i a2, __m512i a3) {
  __m512i* d = reinterpret_cast<__m512i*>(dst);
  _mm512_store_si512(d, _mm512_add_epi32(_mm512_load_si512(d), a0));
  _mm512_store_si512(d + 1, _mm512_add_epi32(_mm512_load_si512(d + 1), a1));
  _mm512_store_si512(d + 2, _mm512_add_epi32(_mm512_load_si512(d + 2), a2));
  _mm512_store_si512(d + 3, _mm512_add_epi32(_mm512_load_si512(d + 3), a3));
}

// Rows r0..r0+ROWS−1 times inputs [k0, k1) of the superblock at `wsb`, added to iacc (ROWS × 64 int32). `lines`:
// which of a step's four 64-byte lines this tile prefetches (the tiles of a panel share the next lines between
// them, so that the read from memory goes on while every tile computes, not only while the first does).
template <int BITS, int ROWS>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void tile_vnni(const Problem& p, const uint8_t* wsb,
                                                                       int64_t r0, int64_t k0, int64_t k1,
                                                                       int32_t* iacc, unsigned lines) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const int8_t* x0 = p.xq + r0 * p.K;
  const int8_t* x1 = x0 + (ROWS > 1 ? p.K : 0);
  const int8_t* x2 = x0 + (ROWS > 2 ? 2 * p.K : 0);
  const int8_t* x3 = x0 + (ROWS > 3 ? 3 * p.K : 0);
  __m512i a00 = _mm512_setzero_si512(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
          a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
  constexpr int64_t step = BITS == 8 ? 4 : 8;
  for (int64_t k = k0; k < k1; k += step) {
    const uint8_t* wp = wsb + (k / step) * 256;
    const char* ahead = reinterpret_cast<const char*>(wp) + kPrefetch;
    for (unsigned line = 0; line < 4; ++line)
      if (lines & (1u << line)) _mm_prefetch(ahead + 64 * line, _MM_HINT_T1);
    if (BITS == 8) {
      const __m512i w0 = _mm512_loadu_si512(wp), w1 = _mm512_loadu_si512(wp + 64),
                    w2 = _mm512_loadu_si512(wp + 128), w3 = _mm512_loadu_si512(wp + 192);
      dot4(a00, a01, a02, a03, w0, w1, w2, w3, broadcast4(x0 + k));
      if (ROWS > 1) dot4(a10, a11, a12, a13, w0, w1, w2, w3, broadcast4(x1 + k));
      if (ROWS > 2) dot4(a20, a21, a22, a23, w0, w1, w2, w3, broadcast4(x2 + k));
      if (ROWS > 3) dot4(a30, a31, a32, a33, w0, w1, w2, w3, broadcast4(x3 + k));
    } else {
      const __m512i v0 = _mm512_loadu_si512(wp), v1 = _mm512_loadu_si512(wp + 64),
                    v2 = _mm512_loadu_si512(wp + 128), v3 = _mm512_loadu_si512(wp + 192);
      const __m512i l0 = _mm512_and_si512(v0, low), l1 = _mm512_and_si512(v1, low),
                    l2 = _mm512_and_si512(v2, low), l3 = _mm512_and_si512(v3, low);
      const __m512i h0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), low),
                    h1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), low),
                    h2 = _mm512_and_si512(_mm512_srli_epi16(v2, 4), low),
                    h3 = _mm512_and_si512(_mm512_srli_epi16(v3, 4), low);
      dot4(a00, a01, a02, a03, l0, l1, l2, l3, broadcast4(x0 + k));
      dot4(a00, a01, a02, a03, h0, h1, h2, h3, broadcast4(x0 + k + 4));
      if (ROWS > 1) {
        dot4(a10, a11, a12, a13, l0, l1, l2, l3, broadcast4(x1 + k));
        dot4(a10, a11, a12, a13, h0, h1, h2, h3, broadcast4(x1 + k + 4));
      }
      if (ROWS > 2) {
        dot4(a20, a21, a22, a23, l0, l1, l2, l3, broadcast4(x2 + k));
        dot4(a20, a21, a22, a23, h0, h1, h2, h3, broadcast4(x2 + k + 4));
      }
      if (ROWS > 3) {
        dot4(a30, a31, a32, a33, l0, l1, l2, l3, broadcast4(x3 + k));
        dot4(a30, a31, a32, a33, h0, h1, h2, h3, broadcast4(x3 + k + 4));
      }
    }
  }
  add_into(iacc, a00, a01, a02, a03);
  if (ROWS > 1) add_into(iacc + kBlock, a10, a11, a12, a13);
  if (ROWS > 2) add_into(iacc + 2 * kBlock, a20, a21, a22, a23);
  if (ROWS > 3) add_into(iacc + 3 * kBlock, a30, a31, a32, a33);
}

template <int BITS>
void tile_vnni_rows(const Problem& p, const uint8_t* wsb, int64_t r0, int rows, int64_t k0, int64_t k1,
                    int32_t* iacc, unsigned lines) {
  switch (rows) {
    case 1: tile_vnni<BITS, 1>(p, wsb, r0, k0, k1, iacc, lines); break;
    case 2: tile_vnni<BITS, 2>(p, wsb, r0, k0, k1, iacc, lines); break;
    case 3: tile_vnni<BITS, 3>(p, wsb, r0, k0, k1, iacc, lines); break;
    default: tile_vnni<BITS, 4>(p, wsb, r0, k0, k1, iacc, lines); break;
  }
}

// A panel of up to kPanel rows against one superblock: for each chunk of kChunk inputs, every tile of the panel
// in turn, so the weights come from memory once a panel and the panel's arithmetic overlaps their reading. (Rows
// tile by tile over the whole superblock read it from memory for the first tile and computed from L2 for the
// others: memory and arithmetic took turns.) A group's sums are exact in int32 however they are split, so
// chunking changes no bit.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void superblock_vnni(const Problem& p, int64_t sb,
                                                                             int64_t r0, int rows) {
  alignas(64) float facc[kPanel][kBlock];
  alignas(64) int32_t iacc[kPanel][kBlock];
  const uint8_t* wsb = p.w + sb * p.sb_bytes;
  const int tiles = (rows + kTile - 1) / kTile;
  for (int r = 0; r < rows; ++r)
    for (int64_t c = 0; c < kBlock; ++c) facc[r][c] = 0.0f;
  for (int64_t g = 0; g < p.G; ++g) {
    for (int r = 0; r < rows; ++r)
      for (int64_t c = 0; c < kBlock; ++c) iacc[r][c] = 0;
    const int64_t end = (g + 1) * p.group;
    for (int64_t k0 = g * p.group; k0 < end; k0 += kChunk) {
      const int64_t k1 = std::min(end, k0 + kChunk);
      for (int t = 0; t < tiles; ++t) {
        // Tile t prefetches the lines i with i % tiles == t (four tiles: one line each; one tile: all four).
        unsigned lines = 0;
        for (int line = 0; line < 4; ++line)
          if (line % tiles == t) lines |= 1u << line;
        const int n = std::min(kTile, rows - t * kTile);
        if (p.bits == 8) tile_vnni_rows<8>(p, wsb, r0 + t * kTile, n, k0, k1, iacc[t * kTile], lines);
        else tile_vnni_rows<4>(p, wsb, r0 + t * kTile, n, k0, k1, iacc[t * kTile], lines);
      }
    }
    const float* ws = p.ws + (sb * p.G + g) * kBlock;
    for (int r = 0; r < rows; ++r) {
      const __m512i off = _mm512_set1_epi32(p.offset * p.sx[(r0 + r) * p.G + g]);
      for (int j = 0; j < 4; ++j) {
        const __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(iacc[r] + j * 16), off));
        _mm512_store_ps(facc[r] + j * 16,
                        _mm512_fmadd_ps(v, _mm512_loadu_ps(ws + j * 16), _mm512_load_ps(facc[r] + j * 16)));
      }
    }
  }
  finish(p, sb, r0, rows, facc);
}

// ------------------------------------------------------------------------------------------------------- the op

// Each row on its own grid: q = round-to-nearest-even(x · 127 / max|x|), and its sum over each group. The vector
// paths round with the default MXCSR mode (nearest, ties to even), as std::nearbyint does, and a maximum and an
// integer sum do not depend on their order: every path gives the same bytes. In plain C++ this was ~1 ns an
// element: ~0.5 s of a 960-token prefill of the 1.8B and ~8 ms of a 16-row step.
float row_amax_scalar(const float* row, int64_t K) {
  float amax = 0.0f;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(row[k]));
  return amax;
}

void quantize_row_scalar(const float* row, int64_t K, int64_t group, float inv, int8_t* q, int32_t* sums) {
  for (int64_t g = 0; g < K / group; ++g) {
    int32_t s = 0;
    for (int64_t k = g * group; k < (g + 1) * group; ++k) {
      const float v = std::min(127.0f, std::max(-127.0f, std::nearbyint(row[k] * inv)));
      q[k] = static_cast<int8_t>(v);
      s += q[k];
    }
    sums[g] = s;
  }
}

__attribute__((target("avx512f,avx512bw"))) float row_amax_avx512(const float* row, int64_t K) {
  __m512 m = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(row + k)));
  float amax = _mm512_reduce_max_ps(m);
  for (; k < K; ++k) amax = std::max(amax, std::fabs(row[k]));
  return amax;
}

// group is a multiple of 4 (8-bit) or 8 (4-bit); 16 at a time where it is a multiple of 16, the rest in C++.
__attribute__((target("avx512f,avx512bw"))) void quantize_row_avx512(const float* row, int64_t K, int64_t group,
                                                                      float inv, int8_t* q, int32_t* sums) {
  if (group % 16 != 0) return quantize_row_scalar(row, K, group, inv, q, sums);
  const __m512 scale = _mm512_set1_ps(inv);
  const __m512i hi = _mm512_set1_epi32(127), lo = _mm512_set1_epi32(-127);
  for (int64_t g = 0; g < K / group; ++g) {
    __m512i s = _mm512_setzero_si512();
    for (int64_t k = g * group; k < (g + 1) * group; k += 16) {
      __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(row + k), scale));
      v = _mm512_min_epi32(hi, _mm512_max_epi32(lo, v));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), _mm512_cvtepi32_epi8(v));
      s = _mm512_add_epi32(s, v);
    }
    sums[g] = _mm512_reduce_add_epi32(s);
  }
}

__attribute__((target("avx2,fma"))) float row_amax_avx2(const float* row, int64_t K) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(row + k)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float amax = 0.0f;
  for (float v : lanes) amax = std::max(amax, v);
  for (; k < K; ++k) amax = std::max(amax, std::fabs(row[k]));
  return amax;
}

__attribute__((target("avx2,fma"))) void quantize_row_avx2(const float* row, int64_t K, int64_t group, float inv,
                                                           int8_t* q, int32_t* sums) {
  if (group % 8 != 0) return quantize_row_scalar(row, K, group, inv, q, sums);
  const __m256 scale = _mm256_set1_ps(inv);
  const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
  alignas(32) int32_t lanes[8];
  for (int64_t g = 0; g < K / group; ++g) {
    __m256i s = _mm256_setzero_si256();
    for (int64_t k = g * group; k < (g + 1) * group; k += 8) {
      __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + k), scale));
      v = _mm256_min_epi32(hi, _mm256_max_epi32(lo, v));
      s = _mm256_add_epi32(s, v);
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), v);
      for (int i = 0; i < 8; ++i) q[k + i] = static_cast<int8_t>(lanes[i]);
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
    sums[g] = lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
  }
}

void quantize_rows(const float* x, int64_t M, int64_t K, int64_t group, int8_t* xq, float* xs, int32_t* sx) {
  const int64_t G = K / group;
  const Isa path = isa();
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const float* row = x + m * K;
      const float amax = path == Isa::kAvx512Vnni ? row_amax_avx512(row, K)
                         : path == Isa::kAvx2 ? row_amax_avx2(row, K) : row_amax_scalar(row, K);
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      xs[m] = amax / 127.0f;
      if (path == Isa::kAvx512Vnni) quantize_row_avx512(row, K, group, inv, xq + m * K, sx + m * G);
      else if (path == Isa::kAvx2) quantize_row_avx2(row, K, group, inv, xq + m * K, sx + m * G);
      else quantize_row_scalar(row, K, group, inv, xq + m * K, sx + m * G);
    }
  });
}

at::Tensor qgemm(const at::Tensor& x_in, const at::Tensor& packed, const at::Tensor& scales,
                 const c10::optional<at::Tensor>& bias, int64_t n, int64_t bits, int64_t group) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "hmt_cpu::qgemm: x must be float32 [M, K]");
  TORCH_CHECK(bits == 8 || bits == 4, "hmt_cpu::qgemm: bits must be 8 or 4");
  const auto x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), superblocks = (n + kBlock - 1) / kBlock;
  TORCH_CHECK(group > 0 && K % group == 0 && group % (bits == 8 ? 4 : 8) == 0,
              "hmt_cpu::qgemm: group must divide K and be a multiple of ", bits == 8 ? 4 : 8);
  const int64_t G = K / group, sb_bytes = K * kBlock * bits / 8;
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.numel() == superblocks * sb_bytes,
              "hmt_cpu::qgemm: the packed weight does not match K and n");
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() &&
              scales.numel() == superblocks * G * kBlock, "hmt_cpu::qgemm: the scales do not match K, n and group");
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.scalar_type() == at::kFloat && b.numel() == n, "hmt_cpu::qgemm: bias must be float32 [n]");
  }
  auto out = at::empty({M, n}, x.options());
  if (M == 0) return out;
  auto xq = at::empty({M, K}, x.options().dtype(at::kChar));
  auto xs = at::empty({M}, x.options());
  auto sx = at::empty({M, G}, x.options().dtype(at::kInt));
  quantize_rows(x.data_ptr<float>(), M, K, group, xq.data_ptr<int8_t>(), xs.data_ptr<float>(), sx.data_ptr<int32_t>());
  const Problem p{xq.data_ptr<int8_t>(), xs.data_ptr<float>(), sx.data_ptr<int32_t>(), packed.data_ptr<uint8_t>(),
                  scales.data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr, out.data_ptr<float>(),
                  M, n, K, G, group, sb_bytes, static_cast<int>(bits), bits == 8 ? 64 : 8};
  const Isa path = isa();
  // The threads split the columns, never a row's sum: a row's result is the same whoever computes it.
  at::parallel_for(0, superblocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t sb = begin; sb < end; ++sb)
      for (int64_t r0 = 0; r0 < M; r0 += path == Isa::kScalar ? kTile : kPanel) {
        const int64_t left = M - r0;
        if (path == Isa::kAvx512Vnni) superblock_vnni(p, sb, r0, static_cast<int>(std::min<int64_t>(kPanel, left)));
        else if (path == Isa::kAvx2) superblock_avx2(p, sb, r0, static_cast<int>(std::min<int64_t>(kPanel, left)));
        else superblock_scalar(p, sb, r0, static_cast<int>(std::min<int64_t>(kTile, left)));
      }
  });
  return out;
}

std::string qgemm_isa() {
  switch (isa()) {
    case Isa::kAvx512Vnni: return "avx512_vnni";
    case Isa::kAvx2: return "avx2";
    default: return "scalar";
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(hmt_cpu, m) {
  m.def("qgemm(Tensor x, Tensor packed, Tensor scales, Tensor? bias, int n, int bits, int group) -> Tensor");
  m.def("qgemm_isa() -> str", &qgemm_isa);
}

TORCH_LIBRARY_IMPL(hmt_cpu, CPU, m) { m.impl("qgemm", &qgemm); }
