// Causal grouped-query attention of one sequence over its contiguous KV cache (HF eager attention).
#pragma once

#include <cstdint>

#include "base/error.h"
#include "cpu/parallel.h"

namespace mxq {

// q, out: [tokens, q_heads, head_dim]; k_cache, v_cache: [seq_len, kv_heads, head_dim], row-major f32.
// The queries are the last `tokens` entries of the sequence: query t sits at position seq_len - tokens + t
// and sees keys 0 ..= that position. Query head h reads KV head h / (q_heads / kv_heads) (HF repeat_kv).
// Scores are scaled by 1/sqrt(head_dim); softmax in f32 with the row max subtracted.
// Refuses tokens > seq_len, q_heads not a multiple of kv_heads, or a non-positive dimension.
Status attention(const float* q, int64_t tokens, int64_t q_heads, const float* k_cache, const float* v_cache,
                 int64_t seq_len, int64_t kv_heads, int64_t head_dim, float* out,
                 ThreadPool& pool = default_pool());

}  // namespace mxq
