// Decode attention (one query token per sequence) over a paged KV cache: the CPU twin of
// cuda/paged_attention_decode.
#pragma once

#include <cstdint>

#include "base/error.h"
#include "cpu/paged_kv.h"
#include "cpu/parallel.h"

namespace mxq {

// q, out: [sequences, q_heads, head_dim]; sequence s attends to its seq_lens[s] cache entries (the last one
// is its own token). A sequence with seq_lens[s] == 0 (a padding slot) gets a zero output row.
// note: attention_prefill with cu_seqlens = 0, 1, ..., sequences; refuses what it refuses.
Status paged_attention_decode(const float* q, const int32_t* seq_lens, int64_t sequences, int64_t q_heads,
                              const PagedKvView& kv, float* out, ThreadPool& pool = default_pool());

}  // namespace mxq
