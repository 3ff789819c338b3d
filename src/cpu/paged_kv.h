// A paged KV cache as the CUDA engine lays it out (vLLM style), in f32 for the CPU twins of the paged ops.
#pragma once

#include <cstdint>

namespace mxq {

// k, v: [num_blocks, block_size, kv_heads, head_dim] row-major; entry (slot, h) at (slot * kv_heads + h) *
// head_dim, slot = block * block_size + offset. block_tables: int32 [sequences, max_blocks], row s lists the
// physical blocks of sequence s in position order (position p lives in block block_tables[s][p / block_size]
// at offset p % block_size).
struct PagedKvView {
  const float* k;
  const float* v;
  const int32_t* block_tables;
  int64_t num_blocks, block_size, max_blocks, kv_heads, head_dim;
};

}  // namespace mxq
