// GPU SwiGLU, the Qwen3 MLP activation (twin: cpu/swiglu.h). Graph-capturable: the token count is read on
// device. Tensors and layouts: swiglu.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

// Fused: gate_up bf16 [max_tokens, 2 * width] (per row gate then up, the layout of mlp.experts.gate_up_proj's
// output) → out bf16 [max_tokens, width]. width % 8 == 0.
cudaError_t launch_swiglu_fused(const uint16_t* gate_up, int64_t width, const int32_t* num_tokens,
                                int64_t max_tokens, uint16_t* out, cudaStream_t stream);
// Separate: gate, up bf16 [max_tokens, width] each → out bf16 [max_tokens, width]. width % 8 == 0.
cudaError_t launch_swiglu(const uint16_t* gate, const uint16_t* up, int64_t width, const int32_t* num_tokens,
                          int64_t max_tokens, uint16_t* out, cudaStream_t stream);

}  // namespace mxq::cuda
