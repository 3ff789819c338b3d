// Causal GQA attention of a batch of variable-length query chunks over a paged KV cache: the CPU twin of
// cuda/attention_prefill (and, with one query per sequence, of cuda/paged_attention_decode).
#pragma once

#include <cstdint>

#include "base/error.h"
#include "cpu/paged_kv.h"
#include "cpu/parallel.h"

namespace mxq {

// q, out: [total_tokens, q_heads, head_dim], total_tokens = cu_seqlens[sequences]; sequence s owns query rows
// [cu_seqlens[s], cu_seqlens[s + 1]) and has seq_lens[s] entries in the cache (its cached prefix plus these
// queries, already written). Query i of s sits at position seq_lens[s] - q_len + i and sees keys 0 ..= that
// position; the math is cpu/attention's (gathered into a contiguous cache, then the same call).
// Refuses a decreasing cu_seqlens, q_len > seq_len, a seq_len beyond max_blocks * block_size, a block id
// outside [0, num_blocks), or what cpu/attention refuses.
Status attention_prefill(const float* q, const int32_t* cu_seqlens, const int32_t* seq_lens,
                         int64_t sequences, int64_t q_heads, const PagedKvView& kv, float* out,
                         ThreadPool& pool = default_pool());

}  // namespace mxq
