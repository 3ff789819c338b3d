#include "cpu/paged_attention_decode.h"

#include <algorithm>

#include "cpu/attention_prefill.h"

namespace mxq {

Status paged_attention_decode(const float* q, const int32_t* seq_lens, int64_t sequences, int64_t q_heads,
                              const PagedKvView& kv, float* out, ThreadPool& pool) {
  const int64_t row = q_heads * kv.head_dim;
  const int32_t cu[2] = {0, 1};
  for (int64_t s = 0; s < sequences; ++s) {
    if (seq_lens[s] <= 0) {
      std::fill(out + s * row, out + (s + 1) * row, 0.0f);
      continue;
    }
    PagedKvView one = kv;  // note: one sequence at a time, its block-table row as a table of one row
    one.block_tables = kv.block_tables + s * kv.max_blocks;
    if (auto st = attention_prefill(q + s * row, cu, seq_lens + s, 1, q_heads, one, out + s * row, pool); !st)
      return fail_in(fmt::format("paged_attention_decode sequence {}", s), st.error());
  }
  return {};
}

}  // namespace mxq
