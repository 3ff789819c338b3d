#include "cpu/linear.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "cpu/dequantize_row.h"

namespace mxq {
namespace {

// note: 4 weight rows share each load of x; 4 rows x 512 f32 = 8 KB of dequantized weight stays in L1
// while every row of x streams past it, so a weight byte is read from memory once per call.
constexpr int64_t kRowTile = 4;
constexpr int64_t kChunk = 512;
// note: a parallel chunk should carry at least ~64k multiply-adds, or waking the pool costs more.
constexpr int64_t kMinMacsPerTask = 1 << 16;

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// sums[r] = x[0, len) · rows[r][0, len) for the kRowTile rows of the tile.
void dot_tile(const float* x, const float (*rows)[kChunk], int64_t len, float* sums) {
  __m256 acc[kRowTile];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= len; k += 8) {
    const __m256 xv = _mm256_loadu_ps(x + k);
    for (int64_t r = 0; r < kRowTile; ++r) acc[r] = _mm256_fmadd_ps(xv, _mm256_load_ps(rows[r] + k), acc[r]);
  }
  for (int64_t r = 0; r < kRowTile; ++r) {
    float s = hsum(acc[r]);
    for (int64_t j = k; j < len; ++j) s += x[j] * rows[r][j];
    sums[r] = s;
  }
}

// Output columns [n0, n1) for all m rows of x.
void linear_columns(const float* x, int64_t m, const WeightView& w, const float* bias, float* y, int64_t n0,
                    int64_t n1) {
  alignas(32) float rows[kRowTile][kChunk];
  const int64_t k_total = w.cols, n_total = w.rows;
  for (int64_t n = n0; n < n1; n += kRowTile) {
    const int64_t tile = std::min(kRowTile, n1 - n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t r = 0; r < tile; ++r) y[i * n_total + n + r] = bias ? bias[n + r] : 0.0f;
    for (int64_t k0 = 0; k0 < k_total; k0 += kChunk) {
      const int64_t len = std::min(kChunk, k_total - k0);
      for (int64_t r = 0; r < tile; ++r) dequantize_row(w, n + r, k0, len, rows[r]);
      for (int64_t r = tile; r < kRowTile; ++r) std::memset(rows[r], 0, sizeof(rows[r]));
      for (int64_t i = 0; i < m; ++i) {
        float sums[kRowTile];
        dot_tile(x + i * k_total + k0, rows, len, sums);
        for (int64_t r = 0; r < tile; ++r) y[i * n_total + n + r] += sums[r];
      }
    }
  }
}

}  // namespace

Status linear(const float* x, int64_t m, const WeightView& w, const float* bias, float* y, ThreadPool& pool) {
  if (auto ok = check_weight_view(w, "linear weight"); !ok) return ok;
  if (m < 0) return fail("linear: expected m >= 0 rows of x, got {}", m);
  if (m == 0 || w.rows == 0) return {};
  const int64_t tiles = cdiv(w.rows, kRowTile);
  const int64_t macs_per_tile = std::max<int64_t>(1, m * w.cols * kRowTile);
  pool.parallel_for(tiles, cdiv(kMinMacsPerTask, macs_per_tile), [&](int64_t begin, int64_t end) {
    linear_columns(x, m, w, bias, y, begin * kRowTile, std::min(w.rows, end * kRowTile));
  });
  return {};
}

}  // namespace mxq
