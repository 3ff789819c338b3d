// Weight-only GEMV for decode (M = 1..32) on FP8-B128 weights: y[M,N] = x[M,K] · W[N,K]^T, x and y bf16,
// reading the same native weights as the cuBLASLt large-M path (gemm_fp8_b128_cublaslt.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/error.h"
#include "cuda/linear/gemm_fp8_b128_cublaslt.h"

namespace mxq::cuda {

inline constexpr int64_t kGemvFp8B128MaxM = 32;

// Refuses by name m outside 1..32, K not a positive multiple of 16, N < 1, or a null pointer.
Status gemv_fp8_b128(const uint16_t* x, int64_t m, const Fp8B128Weights& w, uint16_t* y, cudaStream_t stream);

}  // namespace mxq::cuda
