#include "cpu/rope.h"

#include <cmath>
#include <vector>

namespace mxq {

Result<std::vector<float>> rope_inv_freq(float theta, int64_t head_dim) {
  if (head_dim <= 0 || head_dim % 2 != 0)
    return fail("rope: head_dim must be even and positive, got {}", head_dim);
  if (!std::isfinite(theta) || theta <= 1.0f)
    return fail("rope: rope_theta must be finite and > 1, got {}", theta);
  const int64_t half = head_dim / 2;
  // note: HF builds inv_freq in f32 as 1 / theta ** (arange(0, D, 2).float() / D); the pow is taken in f64
  // and rounded, which matches torch's f32 pow to the last bit on all but rare entries.
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[i] =
        1.0f / static_cast<float>(std::pow(static_cast<double>(theta), static_cast<double>(exponent)));
  }
  return inv_freq;
}

Status rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, const int64_t* positions,
            float theta) {
  auto table = rope_inv_freq(theta, head_dim);
  if (!table) return tl::unexpected(table.error());
  const std::vector<float>& inv_freq = *table;
  const int64_t half = head_dim / 2;
  std::vector<float> cos_a(static_cast<size_t>(half)), sin_a(static_cast<size_t>(half));
  for (int64_t t = 0; t < tokens; ++t) {
    if (positions[t] < 0) return fail("rope: position of token {} is negative ({})", t, positions[t]);
    // note: the angle is the f32 product, as HF's position_ids.float() * inv_freq; cos/sin are then exact
    // roundings of that f32 angle (f64 libm, rounded once).
    const float pos = static_cast<float>(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(pos * inv_freq[i]);
      cos_a[i] = static_cast<float>(std::cos(a));
      sin_a[i] = static_cast<float>(std::sin(a));
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float lo = v[i], hi = v[i + half];
        v[i] = lo * cos_a[i] - hi * sin_a[i];
        v[i + half] = hi * cos_a[i] + lo * sin_a[i];
      }
    }
  }
  return {};
}

}  // namespace mxq
