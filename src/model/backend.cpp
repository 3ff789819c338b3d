#include "model/backend.h"

#include <climits>

namespace mxq {

Status check_kv_shape(const KvShape& s) {
  if (s.layers <= 0 || s.kv_heads <= 0 || s.head_dim <= 0 || s.num_blocks <= 0 || s.block_size <= 0 ||
      s.max_blocks <= 0 || s.max_tokens <= 0 || s.max_seqs <= 0)
    return fail(
        "create_kv: every KV shape field must be positive (layers {}, kv_heads {}, head_dim {}, num_blocks "
        "{}, "
        "block_size {}, max_blocks {}, max_tokens {}, max_seqs {})",
        s.layers, s.kv_heads, s.head_dim, s.num_blocks, s.block_size, s.max_blocks, s.max_tokens, s.max_seqs);
  if (s.num_blocks > INT32_MAX / s.block_size)
    return fail("create_kv: {} blocks of {} slots exceed int32 slot ids", s.num_blocks, s.block_size);
  return {};
}

Status check_block_copy(const KvShape& s, int32_t src, int32_t dst, int32_t slots) {
  if (src < 0 || src >= s.num_blocks || dst < 0 || dst >= s.num_blocks || slots < 0 || slots > s.block_size)
    return fail("copy_kv_block: {} slots of block {} into block {}, the pool has {} blocks of {} slots",
                slots, src, dst, s.num_blocks, s.block_size);
  return {};
}

}  // namespace mxq
