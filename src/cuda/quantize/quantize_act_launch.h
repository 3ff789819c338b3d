// Unchecked launchers of the activation quantizers (nvcc side); quantize_act.cpp checks the arguments.
// Contract: quantize_act.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

cudaError_t launch_quantize_act_fp8_b128(const uint16_t* x, int64_t m, int64_t k, uint8_t* values,
                                         float* scales, int64_t scale_ld, cudaStream_t stream);
cudaError_t launch_fake_quant_mxfp8(const uint16_t* x, int64_t m, int64_t k, uint16_t* y, cudaStream_t stream);

}  // namespace mxq::cuda
