#include "cpu/moe_router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "cpu/softmax.h"

namespace mxq {

namespace {

// The first k entries of `order` become the top-k expert ids of `probs`, descending.
void top_k_lower_index(const std::vector<float>& probs, int64_t k, std::vector<int32_t>& order) {
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
  });
}

// note: the same standard algorithms, call for call, as torch's CPU topk_impl_loop (largest=True,
// sorted=True), with its NaN-first comparator; the tie order then follows from libstdc++.
void top_k_torch_cpu(const std::vector<float>& probs, int64_t k, std::vector<int32_t>& order) {
  using Entry = std::pair<double, int64_t>;  // torch widens float to its CPU acc type, double
  std::vector<Entry> queue(probs.size());
  for (size_t j = 0; j < probs.size(); ++j) queue[j] = {probs[j], static_cast<int64_t>(j)};
  const auto larger = [](const Entry& x, const Entry& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
  };
  const auto n = static_cast<int64_t>(queue.size());
  if (k * 64 <= n) {
    std::partial_sort(queue.begin(), queue.begin() + k, queue.end(), larger);
  } else {
    std::nth_element(queue.begin(), queue.begin() + k - 1, queue.end(), larger);
    std::sort(queue.begin(), queue.begin() + k - 1, larger);
  }
  for (int64_t j = 0; j < k; ++j) order[j] = static_cast<int32_t>(queue[j].second);
}

}  // namespace

Status moe_router(const float* logits, int64_t tokens, int64_t experts, int64_t top_k, bool norm_topk_prob,
                  int32_t* expert_ids, float* expert_weights, TopkTies ties) {
  if (experts <= 0 || experts > std::numeric_limits<int32_t>::max())
    return fail("moe_router: expected 1 ..= 2^31-1 experts, got {}", experts);
  if (top_k < 1 || top_k > experts)
    return fail("moe_router: num_experts_per_tok must be in [1, {}], got {}", experts, top_k);
  std::vector<float> probs(static_cast<size_t>(experts));
  std::vector<int32_t> order(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    softmax(logits + t * experts, 1, experts, probs.data());
    if (ties == TopkTies::kTorchCpu)
      top_k_torch_cpu(probs, top_k, order);
    else
      top_k_lower_index(probs, top_k, order);
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
