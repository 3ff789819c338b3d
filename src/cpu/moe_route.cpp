#include "cpu/moe_route.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "cpu/moe_router.h"

namespace mxq {

Status moe_route(const float* logits, int64_t tokens, int64_t experts, int64_t top_k, bool norm_topk_prob,
                 int32_t* ids, float* weights, int32_t* counts, int32_t* offsets, int32_t* sorted_rows,
                 int32_t* row_of, int32_t* active) {
  if (auto st = moe_router(logits, tokens, experts, top_k, norm_topk_prob, ids, weights); !st) return st;
  const int64_t n = tokens * top_k;
  std::fill(counts, counts + experts, 0);
  for (int64_t i = 0; i < n; ++i) ++counts[ids[i]];
  offsets[0] = 0;
  for (int64_t e = 0; e < experts; ++e) offsets[e + 1] = offsets[e] + counts[e];
  if (active) {
    int32_t* a = active;
    for (int64_t e = 0; e < experts; ++e)
      if (counts[e] > 0) *a++ = static_cast<int32_t>(e);
    std::fill(a, active + experts, -1);
  }
  std::vector<int32_t> cursor(offsets, offsets + experts);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t p = cursor[static_cast<size_t>(ids[i])]++;
    sorted_rows[p] = static_cast<int32_t>(i);
    row_of[i] = p;
  }
  return {};
}

void add_scaled_row(float* d, const float* s, float w, int64_t width) {
  for (int64_t j = 0; j < width; ++j) d[j] += s[j] * w;
}

void moe_combine(const float* y, int64_t width, const int32_t* ids, const float* weights,
                 const int32_t* row_of, int64_t tokens, int64_t top_k, float* out) {
  std::vector<int64_t> order(static_cast<size_t>(top_k));
  for (int64_t t = 0; t < tokens; ++t) {
    std::iota(order.begin(), order.end(), t * top_k);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
    float* o = out + t * width;
    std::fill(o, o + width, 0.0f);
    for (int64_t i : order) add_scaled_row(o, y + static_cast<int64_t>(row_of[i]) * width, weights[i], width);
  }
}

}  // namespace mxq
