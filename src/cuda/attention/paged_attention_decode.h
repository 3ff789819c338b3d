// GPU decode attention over the paged KV cache (flash-decoding, split-K), one query token per sequence
// (twin: cpu/paged_attention_decode.h). Graph-capturable: sequence lengths and block tables are read on
// device; the grid depends on capacities only. Tensors and layouts: paged_attention_decode.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace mxq::cuda {

struct PagedDecodeArgs {
  const uint16_t* q;            // bf16 [max_seqs, q_heads, head_dim]
  const uint16_t* k_cache;      // bf16 [num_blocks, block_size, kv_heads, head_dim]
  const uint16_t* v_cache;      // same layout
  const int32_t* block_tables;  // int32 [max_seqs, max_blocks]
  const int32_t* seq_lens;      // int32 [max_seqs]: cache entries per sequence (0 = padding: zero output)
  float* workspace;             // paged_attention_decode_workspace_bytes(...) bytes, no initial contents
  uint16_t* out;                // bf16 [max_seqs, q_heads, head_dim]
  int max_seqs, max_blocks, block_size, q_heads, kv_heads, head_dim;  // head_dim 64 or 128
};

// Device-side contract the engine keeps (not checked on the device, which never syncs): seq_lens[s] <=
// max_blocks * block_size, every table entry a sequence uses is a block of the cache.
// Scratch for the split-K partials: [max_seqs, q_heads, partitions] x (head_dim + 2) f32.
size_t paged_attention_decode_workspace_bytes(int max_seqs, int q_heads, int head_dim, int max_blocks,
                                              int block_size);

// cudaErrorInvalidValue: head_dim not 64/128, q_heads not a multiple of kv_heads, a non-positive capacity or
// a null pointer.
cudaError_t launch_paged_attention_decode(const PagedDecodeArgs& a, cudaStream_t stream);

}  // namespace mxq::cuda
