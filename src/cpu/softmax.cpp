#include "cpu/softmax.h"

#include <algorithm>
#include <cmath>

namespace mxq {

float sum_f32(const float* x, int64_t n) {
  // note: two levels (8 interleaved lanes within 1024-element blocks, then the block totals) keep the
  // rounding error of a 150k-entry vocabulary sum near (128 + n/1024) ulps rather than n/8.
  constexpr int64_t kBlock = 1024;
  float total = 0.0f;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    float lanes[8] = {};
    int64_t i = b;
    for (; i + 8 <= e; i += 8)
      for (int j = 0; j < 8; ++j) lanes[j] += x[i + j];
    float block = 0.0f;
    for (; i < e; ++i) block += x[i];
    for (float lane : lanes) block += lane;
    total += block;
  }
  return total;
}

namespace {
float row_max(const float* x, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::fmax(m, x[i]);
  return m;
}
}  // namespace

void softmax(const float* x, int64_t rows, int64_t n, float* out) {
  for (int64_t r = 0; r < rows; ++r, x += n, out += n) {
    const float m = row_max(x, n);
    for (int64_t i = 0; i < n; ++i) out[i] = std::exp(x[i] - m);
    const float inv = 1.0f / sum_f32(out, n);
    for (int64_t i = 0; i < n; ++i) out[i] *= inv;
  }
}

void log_softmax(const float* x, int64_t rows, int64_t n, float* out) {
  for (int64_t r = 0; r < rows; ++r, x += n, out += n) {
    const float m = row_max(x, n);
    for (int64_t i = 0; i < n; ++i) out[i] = std::exp(x[i] - m);
    const float log_sum = std::log(sum_f32(out, n));
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] - m - log_sum;
  }
}

int64_t argmax(const float* x, int64_t n) {
  if (n <= 0) return -1;
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace mxq
