// Unchecked GEMV launchers, the part compiled by nvcc (which cannot parse fmt); gemv_mx.cpp checks the
// arguments and calls these. Shapes and the layout contract: gemv_mx.h, gemv_layout.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

cudaError_t launch_gemv_mxfp8(const uint16_t* x, int m, const uint8_t* values, const uint8_t* scales,
                              uint16_t* y, int n, int k, cudaStream_t stream);
cudaError_t launch_gemv_mxfp4(const uint16_t* x, int m, const uint8_t* values, const uint8_t* scales,
                              uint16_t* y, int n, int k, cudaStream_t stream);

}  // namespace mxq::cuda
