// The attention prologue after the q / k / v projections, fused as the CUDA engine runs it: per-head q_norm /
// k_norm, RoPE, q out, k and v written into a paged KV cache at each token's slot. CPU twin of
// cuda/attention/qk_norm_rope_cache, with the same two input forms (one interleaved qkv row, or q, k and v as
// three projections wrote them); composed of cpu/rms_norm head_rms_norm and cpu/rope, so it computes what the
// CPU forward (model/qwen3.cpp) does step by step.
#pragma once

#include <cstdint>

#include "base/error.h"
#include "cpu/parallel.h"

namespace mxq {

struct QkNormRopeCacheArgs {
  // [tokens, (q_heads + 2 kv_heads) * head_dim] (q heads, then k, then v); or, when k_in is set, q alone,
  // [tokens, q_heads * head_dim], with k_in / v_in [tokens, kv_heads * head_dim]
  const float* qkv = nullptr;
  const float* k_in = nullptr;
  const float* v_in = nullptr;
  int64_t tokens = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  const float *q_norm = nullptr, *k_norm = nullptr;  // [head_dim]
  float eps = 0.0f;
  const int64_t* positions = nullptr;  // [tokens]
  float theta = 0.0f;
  const int32_t* slot_mapping = nullptr;  // [tokens] (slot < 0: no KV write)
  int64_t num_slots = 0;
  float* q_out = nullptr;  // [tokens, q_heads, head_dim]
  // [num_slots, kv_heads, head_dim] (cpu/paged_kv.h with num_slots = blocks * block_size)
  float *k_cache = nullptr, *v_cache = nullptr;
};

// Refuses k_in without v_in (or v_in without k_in), a slot >= num_slots (by token) and what cpu/rope refuses.
Status qk_norm_rope_cache(const QkNormRopeCacheArgs& a, ThreadPool& pool = default_pool());

}  // namespace mxq
