// GPU MoE routing and grouping (softmax, top-k, renormalise, token → expert grouping) and the weighted
// combine of expert outputs (twins: cpu/moe_route.h). Graph-capturable: the token count is read on device.
// Tensors and layouts: moe_route.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

struct MoeRouteArgs {
  const float* logits_f32;      // router logits [max_tokens, experts], f32 ...
  const uint16_t* logits_bf16;  // ... or bf16 (exactly one of the two)
  const int32_t* num_tokens;    // int32 [1] (null = max_tokens)
  int32_t* ids;                 // int32 [max_tokens, top_k]: experts by descending weight, ties → lower id
  float* weights;               // f32 [max_tokens, top_k]
  int32_t* counts;              // int32 [experts]
  int32_t* offsets;             // int32 [experts + 1]
  int32_t* sorted_rows;  // int32 [max_tokens * top_k]: entries t * top_k + j grouped by expert, in order
  int32_t* row_of;       // int32 [max_tokens, top_k]: position of entry (t, j) in sorted_rows
  int max_tokens, experts, top_k;  // experts <= 1024, top_k <= min(32, experts)
  bool norm_topk_prob;
  int32_t* active = nullptr;  // int32 [experts] or null: experts with entries, ascending, then -1 (the slots
                              // of the grouped expert linear, cuda/linear/moe_grouped_linear.h)
};

// cudaErrorInvalidValue: experts outside [1, 1024], top_k outside [1, min(32, experts)], max_tokens < 0,
// not exactly one logits pointer, a null output.
cudaError_t launch_moe_route(const MoeRouteArgs& a, cudaStream_t stream);

// out[t, :] = Σ_j weights[t, j] · y[row_of[t, j], :] over token t's choices in increasing expert id, f32
// multiply then f32 add from 0 (cpu/moe_combine), rounded once to bf16. y bf16 [max_tokens * top_k, width]
// (the grouped down_proj output, row p = sorted_rows position p); out bf16 [max_tokens, width]; width % 8 ==
// 0.
cudaError_t launch_moe_combine(const uint16_t* y, int64_t width, const int32_t* ids, const float* weights,
                               const int32_t* row_of, const int32_t* num_tokens, int max_tokens, int top_k,
                               uint16_t* out, cudaStream_t stream);

}  // namespace mxq::cuda
