#include "cpu/moe_router.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "cpu/softmax.h"

namespace mxq {

Status moe_router(const float* logits, int64_t tokens, int64_t experts, int64_t top_k, bool norm_topk_prob,
                  int32_t* expert_ids, float* expert_weights) {
  if (experts <= 0 || experts > std::numeric_limits<int32_t>::max())
    return fail("moe_router: expected 1 ..= 2^31-1 experts, got {}", experts);
  if (top_k < 1 || top_k > experts)
    return fail("moe_router: num_experts_per_tok must be in [1, {}], got {}", experts, top_k);
  std::vector<float> probs(static_cast<size_t>(experts));
  std::vector<int32_t> order(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    softmax(logits + t * experts, 1, experts, probs.data());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int32_t a, int32_t b) {
      return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
    });
    int32_t* ids = expert_ids + t * top_k;
    float* weights = expert_weights + t * top_k;
    float sum = 0.0f;
    for (int64_t j = 0; j < top_k; ++j) {
      ids[j] = order[j];
      weights[j] = probs[order[j]];
      sum += weights[j];
    }
    if (norm_topk_prob)
      for (int64_t j = 0; j < top_k; ++j) weights[j] /= sum;
  }
  return {};
}

}  // namespace mxq
