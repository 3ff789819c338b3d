// The attention prologue after the qkv projection, fused as the CUDA engine runs it: per-head q_norm /
// k_norm, RoPE, q out, k and v written into a paged KV cache at each token's slot. CPU twin of
// cuda/qk_norm_rope_cache; composed of cpu/rms_norm head_rms_norm and cpu/rope, so it computes what the CPU
// forward (model/qwen3.cpp) does step by step.
#pragma once

#include <cstdint>

#include "base/error.h"

namespace mxq {

// qkv: [tokens, (q_heads + 2 kv_heads) * head_dim] (q heads, then k, then v); q_norm, k_norm: [head_dim];
// positions, slot_mapping: [tokens] (slot < 0: no KV write); q_out: [tokens, q_heads, head_dim];
// k_cache, v_cache: [num_slots, kv_heads, head_dim] (cpu/paged_kv.h with num_slots = blocks * block_size).
// Refuses a slot >= num_slots (by token) and what cpu/rope refuses.
Status qk_norm_rope_cache(const float* qkv, int64_t tokens, int64_t q_heads, int64_t kv_heads,
                          int64_t head_dim, const float* q_norm, const float* k_norm, float eps,
                          const int64_t* positions, float theta, const int32_t* slot_mapping,
                          int64_t num_slots, float* q_out, float* k_cache, float* v_cache);

}  // namespace mxq
