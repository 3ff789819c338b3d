#include "cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/softmax.h"

namespace mxq {

Status attention(const float* q, int64_t tokens, int64_t q_heads, const float* k_cache, const float* v_cache,
                 int64_t seq_len, int64_t kv_heads, int64_t head_dim, float* out, ThreadPool& pool) {
  if (q_heads <= 0 || kv_heads <= 0 || head_dim <= 0 || tokens < 0)
    return fail("attention: expected positive heads and head_dim, got q_heads {}, kv_heads {}, head_dim {}",
                q_heads, kv_heads, head_dim);
  if (q_heads % kv_heads != 0)
    return fail("attention: q_heads ({}) must be a multiple of kv_heads ({})", q_heads, kv_heads);
  if (tokens > seq_len)
    return fail("attention: {} query tokens but only {} entries in the KV cache", tokens, seq_len);
  const int64_t group = q_heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int64_t q_stride = q_heads * head_dim, kv_stride = kv_heads * head_dim;
  // note: one task = one (token, head) row; grain 4 keeps tasks above a few microseconds for short caches.
  pool.parallel_for(tokens * q_heads, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(seq_len));
    for (int64_t row = begin; row < end; ++row) {
      const int64_t t = row / q_heads, h = row % q_heads, kvh = h / group;
      const int64_t visible = seq_len - tokens + t + 1;
      const float* qv = q + t * q_stride + h * head_dim;
      for (int64_t s = 0; s < visible; ++s) {
        const float* kv = k_cache + s * kv_stride + kvh * head_dim;
        float dot = 0.0f;
        for (int64_t d = 0; d < head_dim; ++d) dot += qv[d] * kv[d];
        scores[s] = dot * scale;
      }
      softmax(scores.data(), 1, visible, scores.data());
      float* o = out + t * q_stride + h * head_dim;
      std::fill(o, o + head_dim, 0.0f);
      for (int64_t s = 0; s < visible; ++s) {
        const float* vv = v_cache + s * kv_stride + kvh * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) o[d] += scores[s] * vv[d];
      }
    }
  });
  return {};
}

}  // namespace mxq
