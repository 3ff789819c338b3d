// GPU causal flash attention for a batch of variable-length query chunks over the paged KV cache (prefill and
// chunked prefill with a cached prefix; twin: cpu/attention_prefill.h). Graph-capturable: cu_seqlens,
// seq_lens and block tables are read on device; the grid depends on capacities only. Tensors:
// attention_prefill.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

struct PrefillArgs {
  const uint16_t* q;            // bf16 [max_tokens, q_heads, head_dim] (qk_norm_rope_cache's q_out)
  const uint16_t* k_cache;      // bf16 [num_blocks, block_size, kv_heads, head_dim], this step's K written
  const uint16_t* v_cache;      // same layout
  const int32_t* block_tables;  // int32 [max_seqs, max_blocks]
  const int32_t* cu_seqlens;    // int32 [max_seqs + 1]: query rows of sequence s are [cu[s], cu[s + 1])
  const int32_t* seq_lens;      // int32 [max_seqs]: cache entries of s (cached prefix + its queries)
  uint16_t* out;                // bf16 [max_tokens, q_heads, head_dim]
  int max_tokens, max_seqs, max_blocks, block_size, q_heads, kv_heads, head_dim;  // head_dim 64 or 128
};

// Device-side contract the engine keeps (not checked on the device, which never syncs): cu_seqlens
// non-decreasing with cu[max_seqs] <= max_tokens, q_len <= seq_lens[s] <= max_blocks * block_size,
// every table entry a sequence uses is a block of the cache.
// cudaErrorInvalidValue: head_dim not 64/128, q_heads not a multiple of kv_heads, a non-positive capacity,
// a null pointer.
cudaError_t launch_attention_prefill(const PrefillArgs& a, cudaStream_t stream);

}  // namespace mxq::cuda
