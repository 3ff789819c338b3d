#include "cpu/rms_norm.h"

#include <algorithm>
#include <cmath>

namespace mxq {
namespace {

// note: rows are independent; below ~32k elements per task the pool costs more than the work.
constexpr int64_t kMinElementsPerTask = 1 << 15;

void norm_row(const float* x, int64_t dim, const float* weight, float eps, float* out) {
  float lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= dim; i += 8)
    for (int j = 0; j < 8; ++j) lanes[j] += x[i + j] * x[i + j];
  float sum = 0.0f;
  for (; i < dim; ++i) sum += x[i] * x[i];
  for (float lane : lanes) sum += lane;
  const float inv_rms = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
  // note: (x * inv_rms) * weight in this order, as HF: the weight multiplies the normalised value.
  for (i = 0; i < dim; ++i) out[i] = weight[i] * (x[i] * inv_rms);
}

}  // namespace

void rms_norm(const float* x, int64_t rows, int64_t dim, const float* weight, float eps, float* out,
              ThreadPool& pool) {
  pool.parallel_for(rows, kMinElementsPerTask / std::max<int64_t>(dim, 1) + 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) norm_row(x + r * dim, dim, weight, eps, out + r * dim);
  });
}

void add_rms_norm(const float* x, float* residual, int64_t rows, int64_t dim, const float* weight, float eps,
                  float* out, ThreadPool& pool) {
  pool.parallel_for(rows, kMinElementsPerTask / std::max<int64_t>(dim, 1) + 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* res = residual + r * dim;
      for (int64_t i = 0; i < dim; ++i) res[i] += x[r * dim + i];
      norm_row(res, dim, weight, eps, out + r * dim);
    }
  });
}

void head_rms_norm(float* x, int64_t tokens, int64_t heads, int64_t head_dim, const float* weight, float eps,
                   ThreadPool& pool) {
  rms_norm(x, tokens * heads, head_dim, weight, eps, x, pool);
}

}  // namespace mxq
