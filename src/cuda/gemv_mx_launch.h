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

// Which GEMV kernel the MX launchers run, process-wide. kAuto (the default): the streaming kernel
// (gemv_mx_stream.cuh, 4 stages of 4 groups, 1 block per SM) where it applies (K % 128 == 0, aligned
// planes), else the register kernel (gemv_mx_kernel.cuh). The others exist to measure and test each
// variant from one build (tests, `mxq bench linear --gemv-study`); a streaming variant that does not apply
// to a call falls back to the register kernel as kAuto does.
enum class GemvKernel : int {
  kAuto = 0,
  kRegister = 1,      // the register-prefetch kernel for every call
  kStreamS4U2x2 = 2,  // streaming: 4 stages of 2 groups, 2 blocks per SM
  kStreamS8U2 = 3,    // streaming: 8 stages of 2 groups, 1 block per SM
};
inline constexpr GemvKernel kGemvKernels[] = {GemvKernel::kAuto, GemvKernel::kRegister,
                                              GemvKernel::kStreamS4U2x2, GemvKernel::kStreamS8U2};
const char* gemv_kernel_name(GemvKernel k);
void set_gemv_kernel(GemvKernel k);
GemvKernel gemv_kernel();

}  // namespace mxq::cuda
