#include "cpu/linear.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/block_decode.h"
#include "cpu/dequantize_row.h"

namespace mxq {
namespace {

// note: 4 dequantized weight rows (4 x K f32, in L1/L2) meet every row of x, two at a time sharing each load
// of x, so a weight byte is read from memory once per call.
constexpr int64_t kRowTile = 4;
// note: a parallel chunk should carry at least ~64k multiply-adds, or waking the pool costs more.
constexpr int64_t kMinMacsPerTask = 1 << 16;

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// s0 = x · w0 (and s1 = x · w1 when w1 is given) over `cols`, in gemv_rows' order: four 8-lane accumulators
// over the 32-element blocks, summed as (a0 + a1) + (a2 + a3), then the tail one by one. note: the same
// order for one row and for many is what makes a request's logits independent of how its prompt was cut into
// chunks and of what else runs in the step (prefix-cache hits leave one-token chunks).
void dot_pair(const float* x, const float* w0, const float* w1, int64_t cols, float* s0, float* s1) {
  constexpr int64_t kBlock = cpu_detail::kBlock;
  const int64_t blocks = cols / kBlock;
  __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  __m256 b[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t blk = 0; blk < blocks; ++blk)
    for (int i = 0; i < 4; ++i) {
      const int64_t k = kBlock * blk + 8 * i;
      const __m256 xv = _mm256_loadu_ps(x + k);
      a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), xv, a[i]);
      if (w1) b[i] = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), xv, b[i]);
    }
  float sa = hsum(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
  float sb = hsum(_mm256_add_ps(_mm256_add_ps(b[0], b[1]), _mm256_add_ps(b[2], b[3])));
  for (int64_t j = blocks * kBlock; j < cols; ++j) {
    sa += x[j] * w0[j];
    if (w1) sb += x[j] * w1[j];
  }
  *s0 = sa;
  if (w1) *s1 = sb;
}

// Output columns [n0, n1) for all m rows of x: kRowTile weight rows are dequantized whole (the same values
// gemv_rows makes in registers), then every row of x streams past them.
void linear_columns(const float* x, int64_t m, const WeightView& w, const float* bias, float* y, int64_t n0,
                    int64_t n1) {
  const int64_t k_total = w.cols, n_total = w.rows;
  thread_local std::vector<float> rows;
  rows.resize(static_cast<size_t>(kRowTile * k_total));
  for (int64_t n = n0; n < n1; n += kRowTile) {
    const int64_t tile = std::min(kRowTile, n1 - n);
    for (int64_t r = 0; r < tile; ++r) dequantize_row(w, n + r, 0, k_total, rows.data() + r * k_total);
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * k_total;
      float* yi = y + i * n_total + n;
      for (int64_t r = 0; r < tile; r += 2) {
        const bool pair = r + 1 < tile;
        float s[2];
        dot_pair(xi, rows.data() + r * k_total, pair ? rows.data() + (r + 1) * k_total : nullptr, k_total, &s[0],
                 &s[1]);
        for (int64_t q = 0; q < (pair ? 2 : 1); ++q) yi[r + q] = bias ? s[q] + bias[n + r + q] : s[q];
      }
    }
  }
}

// M = 1 (decode): each 32-block is decoded into registers and multiplied into x straight away, so the
// weight bytes are the only memory traffic that scales with N·K.
template <Format kElement>
void gemv_rows(const float* x, const WeightView& w, const float* bias, float* y, int64_t n0, int64_t n1) {
  using cpu_detail::kBlock;
  const int64_t blocks = w.cols / kBlock, tail = w.cols - blocks * kBlock;
  const int64_t row_bytes = values_bytes(w.format, 1, w.cols);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* p = w.values + n * row_bytes;
    const cpu_detail::RowScales scale_of(w, n);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < blocks; ++b, p += cpu_detail::kBlockBytes<kElement>) {
      __m256 v[4];
      cpu_detail::decode_block<kElement>(p, v);
      const __m256 scale = _mm256_set1_ps(scale_of(b));
      for (int i = 0; i < 4; ++i)
        acc[i] = _mm256_fmadd_ps(_mm256_mul_ps(v[i], scale), _mm256_loadu_ps(x + kBlock * b + 8 * i), acc[i]);
    }
    float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    if (tail > 0) {  // plain formats and FP8-B128 only: MX rows are whole blocks
      float rest[kBlock];
      dequantize_row(w, n, blocks * kBlock, tail, rest);
      for (int64_t j = 0; j < tail; ++j) sum += x[blocks * kBlock + j] * rest[j];
    }
    y[n] = bias ? sum + bias[n] : sum;
  }
}

using GemvFn = void (*)(const float*, const WeightView&, const float*, float*, int64_t, int64_t);
GemvFn gemv_for(Format element) {
  switch (element) {
    case Format::kBF16:
      return gemv_rows<Format::kBF16>;
    case Format::kF16:
      return gemv_rows<Format::kF16>;
    case Format::kF32:
      return gemv_rows<Format::kF32>;
    case Format::kE4M3:
      return gemv_rows<Format::kE4M3>;
    case Format::kE5M2:
      return gemv_rows<Format::kE5M2>;
    case Format::kE2M1:
      return gemv_rows<Format::kE2M1>;
    default:
      return nullptr;  // not reached: check_weight_view admits only the formats above
  }
}

}  // namespace

Status linear(const float* x, int64_t m, const WeightView& w, const float* bias, float* y, ThreadPool& pool) {
  if (auto ok = check_weight_view(w, "linear weight"); !ok) return ok;
  if (m < 0) return fail("linear: expected m >= 0 rows of x, got {}", m);
  if (m == 0 || w.rows == 0) return {};
  if (m == 1) {
    const GemvFn gemv = gemv_for(traits(w.format).element);
    const int64_t grain = cdiv(kMinMacsPerTask, std::max<int64_t>(1, w.cols));
    pool.parallel_for(w.rows, grain, [&](int64_t begin, int64_t end) { gemv(x, w, bias, y, begin, end); });
    return {};
  }
  const int64_t tiles = cdiv(w.rows, kRowTile);
  const int64_t macs_per_tile = std::max<int64_t>(1, m * w.cols * kRowTile);
  pool.parallel_for(tiles, cdiv(kMinMacsPerTask, macs_per_tile), [&](int64_t begin, int64_t end) {
    linear_columns(x, m, w, bias, y, begin * kRowTile, std::min(w.rows, end * kRowTile));
  });
  return {};
}

}  // namespace mxq
