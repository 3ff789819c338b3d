// The Qwen3-MoE router after its gate projection (HF Qwen3MoeTopKRouter): softmax over experts in f32,
// top-k, optional renormalisation of the k weights (norm_topk_prob).
#pragma once

#include <cstdint>

#include "base/error.h"

namespace mxq {

// Which of several experts with exactly equal probability top-k picks, and in what order.
enum class TopkTies : uint8_t {
  // Lower expert index first: one rule every backend can implement (a CUDA top-k breaks ties so).
  kLowerIndex,
  // torch.topk on CPU as transformers runs it: NOT lower-index first. torch fills (value, index) pairs in
  // index order and runs std::partial_sort when k * 64 <= n, else std::nth_element at k-1 followed by
  // std::sort of the first k-1; the tie order is whatever libstdc++'s algorithms leave (pinned by
  // tests/golden/cpu, which comes from transformers' Qwen3MoeTopKRouter).
  kTorchCpu,
};

// logits: [tokens, experts]; expert_ids, expert_weights: [tokens, top_k], each row in descending weight,
// ties ordered by `ties`. Refuses top_k outside [1, experts].
Status moe_router(const float* logits, int64_t tokens, int64_t experts, int64_t top_k, bool norm_topk_prob,
                  int32_t* expert_ids, float* expert_weights, TopkTies ties = TopkTies::kLowerIndex);

}  // namespace mxq
