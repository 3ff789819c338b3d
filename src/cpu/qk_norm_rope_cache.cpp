#include "cpu/qk_norm_rope_cache.h"

#include <algorithm>
#include <vector>

#include "cpu/rms_norm.h"
#include "cpu/rope.h"

namespace mxq {

Status qk_norm_rope_cache(const QkNormRopeCacheArgs& a, ThreadPool& pool) {
  if ((a.k_in == nullptr) != (a.v_in == nullptr))
    return fail("qk_norm_rope_cache: k_in and v_in come together (separate inputs), got only {}",
                a.k_in ? "k_in" : "v_in");
  for (int64_t t = 0; t < a.tokens; ++t)
    if (a.slot_mapping[t] >= a.num_slots)
      return fail("qk_norm_rope_cache: token {} maps to slot {} outside the cache of {} slots", t,
                  a.slot_mapping[t], a.num_slots);
  const int64_t T = a.tokens, D = a.head_dim, qw = a.q_heads * D, kw = a.kv_heads * D;
  const bool separate = a.k_in != nullptr;
  const int64_t q_stride = separate ? qw : qw + 2 * kw;  // floats between two tokens' q rows
  const auto k_row = [&](int64_t t) { return separate ? a.k_in + t * kw : a.qkv + t * q_stride + qw; };
  const auto v_row = [&](int64_t t) { return separate ? a.v_in + t * kw : a.qkv + t * q_stride + qw + kw; };
  std::vector<float> k(static_cast<size_t>(T * kw));
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(a.qkv + t * q_stride, qw, a.q_out + t * qw);
    std::copy_n(k_row(t), kw, k.begin() + t * kw);
  }
  // self_attn.q_norm / k_norm, then rotary embedding: the CPU forward's order
  head_rms_norm(a.q_out, T, a.q_heads, D, a.q_norm, a.eps, pool);
  head_rms_norm(k.data(), T, a.kv_heads, D, a.k_norm, a.eps, pool);
  if (auto st = rope(a.q_out, T, a.q_heads, D, a.positions, a.theta); !st) return st;
  if (auto st = rope(k.data(), T, a.kv_heads, D, a.positions, a.theta); !st) return st;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t slot = a.slot_mapping[t];
    if (slot < 0) continue;
    std::copy_n(k.begin() + t * kw, kw, a.k_cache + slot * kw);
    std::copy_n(v_row(t), kw, a.v_cache + slot * kw);
  }
  return {};
}

}  // namespace mxq
