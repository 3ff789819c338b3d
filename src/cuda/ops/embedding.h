// GPU token embedding gather (twin: cpu/embedding.h). Graph-capturable: the token count is read on device.
// Tensors and layouts: embedding.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

// table: bf16 [vocab, hidden] (hidden % 8 == 0, 16-byte aligned); ids: int32 [max_tokens]; num_tokens: int32
// [1] on device (null: all max_tokens); out: [max_tokens, hidden]. An id outside [0, vocab) writes a zero row
// and atomicMin's its token index into *bad_token (sticky: the engine sets it to INT32_MAX once).
// cudaErrorInvalidValue: hidden not a positive multiple of 8, vocab < 1, max_tokens < 0, a null pointer.
cudaError_t launch_embedding_f32(const uint16_t* table, int64_t vocab, int64_t hidden, const int32_t* ids,
                                 const int32_t* num_tokens, int64_t max_tokens, float* out,
                                 int32_t* bad_token, cudaStream_t stream);
cudaError_t launch_embedding_bf16(const uint16_t* table, int64_t vocab, int64_t hidden, const int32_t* ids,
                                  const int32_t* num_tokens, int64_t max_tokens, uint16_t* out,
                                  int32_t* bad_token, cudaStream_t stream);

}  // namespace mxq::cuda
