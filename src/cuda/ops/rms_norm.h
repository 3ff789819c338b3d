// GPU RMSNorm and the fused residual add + RMSNorm of the decoder layer (twins: cpu/rms_norm.h).
// Graph-capturable: the token count is read on device. Tensors and layouts: rms_norm.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

// out[t] = w * (x[t] * rsqrt(mean(x[t]^2) + eps)) for t < *num_tokens (null: max_tokens). x f32 (the residual
// stream, model.embed_tokens output) or bf16; w, out bf16. dim % 8 == 0.
cudaError_t launch_rms_norm_f32(const float* x, const uint16_t* w, float eps, int64_t dim,
                                const int32_t* num_tokens, int64_t max_tokens, uint16_t* out,
                                cudaStream_t stream);
cudaError_t launch_rms_norm_bf16(const uint16_t* x, const uint16_t* w, float eps, int64_t dim,
                                 const int32_t* num_tokens, int64_t max_tokens, uint16_t* out,
                                 cudaStream_t stream);

// residual[t] += x[t] (f32 += bf16, exact add order of cpu/add_rms_norm), out[t] = rms_norm(residual[t])
// bf16. dim % 8 == 0.
cudaError_t launch_add_rms_norm(const uint16_t* x, float* residual, const uint16_t* w, float eps, int64_t dim,
                                const int32_t* num_tokens, int64_t max_tokens, uint16_t* out,
                                cudaStream_t stream);

}  // namespace mxq::cuda
