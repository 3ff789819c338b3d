// Unchecked GEMM launchers, the part compiled by nvcc; gemm_mx.cpp checks the arguments and calls these.
// Shapes and the layout contract: gemm_mx.h, gemv_layout.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

// kAuto: the wgmma kernel on compute capability 9.0 (sm_90a), the mma.sync kernel elsewhere. kPortable: the
// mma.sync kernel everywhere (tests run it on Hopper too).
enum class GemmPath { kAuto, kPortable };

// ws: f32 scratch of ws_floats for split-K partials (sm_90a, grids that leave SMs idle); null/0: no split.
cudaError_t launch_gemm_mxfp8(const uint16_t* x, int m, const uint8_t* values, const uint8_t* scales,
                              uint16_t* y, int n, int k, GemmPath path, float* ws, int64_t ws_floats,
                              cudaStream_t stream);
cudaError_t launch_gemm_mxfp4(const uint16_t* x, int m, const uint8_t* values, const uint8_t* scales,
                              uint16_t* y, int n, int k, GemmPath path, float* ws, int64_t ws_floats,
                              cudaStream_t stream);

}  // namespace mxq::cuda
