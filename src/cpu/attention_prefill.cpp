#include "cpu/attention_prefill.h"

#include <vector>

#include "cpu/attention.h"

namespace mxq {

Status attention_prefill(const float* q, const int32_t* cu_seqlens, const int32_t* seq_lens,
                         int64_t sequences, int64_t q_heads, const PagedKvView& kv, float* out,
                         ThreadPool& pool) {
  const int64_t row = kv.kv_heads * kv.head_dim, q_row = q_heads * kv.head_dim;
  std::vector<float> k, v;
  for (int64_t s = 0; s < sequences; ++s) {
    const int64_t q_len = cu_seqlens[s + 1] - cu_seqlens[s], len = seq_lens[s];
    if (q_len < 0) return fail("attention_prefill: cu_seqlens decreases at sequence {}", s);
    if (q_len == 0) continue;
    if (q_len > len)
      return fail("attention_prefill: sequence {} has {} queries but only {} cache entries", s, q_len, len);
    if (len > kv.max_blocks * kv.block_size)
      return fail("attention_prefill: sequence {} has {} entries, more than {} blocks of {} hold", s, len,
                  kv.max_blocks, kv.block_size);
    k.resize(static_cast<size_t>(len * row));
    v.resize(k.size());
    for (int64_t p = 0; p < len; ++p) {
      const int64_t block = kv.block_tables[s * kv.max_blocks + p / kv.block_size];
      if (block < 0 || block >= kv.num_blocks)
        return fail("attention_prefill: sequence {} position {} maps to block {} outside [0, {})", s, p,
                    block, kv.num_blocks);
      const int64_t slot = block * kv.block_size + p % kv.block_size;
      for (int64_t i = 0; i < row; ++i) {
        k[static_cast<size_t>(p * row + i)] = kv.k[slot * row + i];
        v[static_cast<size_t>(p * row + i)] = kv.v[slot * row + i];
      }
    }
    const int64_t first = cu_seqlens[s];
    if (auto st = attention(q + first * q_row, q_len, q_heads, k.data(), v.data(), len, kv.kv_heads,
                            kv.head_dim, out + first * q_row, pool);
        !st)
      return st;
  }
  return {};
}

}  // namespace mxq
