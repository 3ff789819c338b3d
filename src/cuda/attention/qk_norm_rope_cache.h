// GPU fused q_norm / k_norm + RoPE + paged KV cache write, after the qkv projection (twin:
// cpu/qk_norm_rope_cache.h). Graph-capturable: token count, positions and slots are read on device.
// Tensors and layouts: qk_norm_rope_cache.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

struct QkNormRopeArgs {
  const uint16_t* qkv;          // bf16 [max_tokens, (q_heads + 2 kv_heads) * head_dim], or q alone (k_in)
  const uint16_t* q_norm;       // bf16 [head_dim] (self_attn.q_norm.weight)
  const uint16_t* k_norm;       // bf16 [head_dim] (self_attn.k_norm.weight)
  const float* inv_freq;        // f32 [head_dim / 2], cpu/rope.h rope_inv_freq
  const int32_t* positions;     // int32 [max_tokens], >= 0
  const int32_t* slot_mapping;  // int32 [max_tokens]: block * block_size + offset; < 0 = no KV write
  const int32_t* num_tokens;    // int32 [1] (null = max_tokens)
  uint16_t* q_out;              // bf16 [max_tokens, q_heads, head_dim]
  uint16_t* k_cache;            // bf16 [num_slots / block_size, block_size, kv_heads, head_dim]
  uint16_t* v_cache;            // same layout as k_cache
  int32_t* bad_token;           // int32 [1]: atomicMin'd with a token whose slot is >= num_slots (no write)
  int64_t max_tokens, num_slots;
  int q_heads, kv_heads, head_dim;  // head_dim 64 or 128
  float eps;                        // rms_norm_eps
  // Separate inputs (the q / k / v projections' outputs as written): when k_in is set, qkv holds q only,
  // bf16 [max_tokens, q_heads * head_dim], and k_in / v_in are bf16 [max_tokens, kv_heads * head_dim].
  const uint16_t* k_in = nullptr;
  const uint16_t* v_in = nullptr;
};

// cudaErrorInvalidValue: head_dim not 64/128, non-positive heads, a null pointer, k_in without v_in (or the
// reverse), max_tokens outside [0, INT_MAX].
cudaError_t launch_qk_norm_rope_cache(const QkNormRopeArgs& a, cudaStream_t stream);

}  // namespace mxq::cuda
