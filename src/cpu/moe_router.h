// The Qwen3-MoE router after its gate projection (HF Qwen3MoeTopKRouter): softmax over experts in f32,
// top-k, optional renormalisation of the k weights (norm_topk_prob).
#pragma once

#include <cstdint>

#include "base/error.h"

namespace mxq {

// logits: [tokens, experts]; expert_ids, expert_weights: [tokens, top_k], each row in descending weight
// with equal weights ordered by the lower expert index first (torch.topk on CPU).
// Refuses top_k outside [1, experts].
Status moe_router(const float* logits, int64_t tokens, int64_t experts, int64_t top_k, bool norm_topk_prob,
                  int32_t* expert_ids, float* expert_weights);

}  // namespace mxq
