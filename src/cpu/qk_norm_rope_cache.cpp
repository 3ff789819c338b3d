#include "cpu/qk_norm_rope_cache.h"

#include <algorithm>
#include <vector>

#include "cpu/rms_norm.h"
#include "cpu/rope.h"

namespace mxq {

Status qk_norm_rope_cache(const float* qkv, int64_t tokens, int64_t q_heads, int64_t kv_heads,
                          int64_t head_dim, const float* q_norm, const float* k_norm, float eps,
                          const int64_t* positions, float theta, const int32_t* slot_mapping,
                          int64_t num_slots, float* q_out, float* k_cache, float* v_cache) {
  for (int64_t t = 0; t < tokens; ++t)
    if (slot_mapping[t] >= num_slots)
      return fail("qk_norm_rope_cache: token {} maps to slot {} outside the cache of {} slots", t,
                  slot_mapping[t], num_slots);
  const int64_t qw = q_heads * head_dim, kw = kv_heads * head_dim, width = qw + 2 * kw;
  std::vector<float> k(static_cast<size_t>(tokens * kw));
  for (int64_t t = 0; t < tokens; ++t) {
    std::copy(qkv + t * width, qkv + t * width + qw, q_out + t * qw);
    std::copy(qkv + t * width + qw, qkv + t * width + qw + kw, k.begin() + t * kw);
  }
  // self_attn.q_norm / k_norm, then rotary embedding: the CPU forward's order
  head_rms_norm(q_out, tokens, q_heads, head_dim, q_norm, eps);
  head_rms_norm(k.data(), tokens, kv_heads, head_dim, k_norm, eps);
  if (auto st = rope(q_out, tokens, q_heads, head_dim, positions, theta); !st) return st;
  if (auto st = rope(k.data(), tokens, kv_heads, head_dim, positions, theta); !st) return st;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    std::copy(k.begin() + t * kw, k.begin() + (t + 1) * kw, k_cache + slot * kw);
    std::copy(qkv + t * width + qw + kw, qkv + (t + 1) * width, v_cache + slot * kw);
  }
  return {};
}

}  // namespace mxq
