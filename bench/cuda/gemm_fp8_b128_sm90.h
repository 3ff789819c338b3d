// FP8-B128 linear for large M on sm_90a through our own wgmma GEMM (gemm_fp8_b128_sm90.cu, DeepGEMM's
// design):
//   y[M,N] bf16 = x[M,K] bf16 · W[N,K]^T, W in FP8-B128's native layout (gemm_fp8_b128_cublaslt.h), x first
//   quantized per 1x128 (quantize_act.h) into Fp8B128Gemm's scratch, as for cuBLASLt.
// Shapes: N and K multiples of 128 (fp8_b128_sm90_takes). Not routed by the linear table
// (cuda/linear/linear.h): cuBLASLt measured faster at M = 128, 512 and 4096 on the Qwen3-8B shapes
// (bench/history/RESULTS-log.md, "FP8-B128: our sm_90a wgmma GEMM vs cuBLASLt"); `mxq-bench linear` times it
// beside cuBLASLt, the GPU tests check it against the CPU twin and cuBLASLt.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/error.h"
#include "bench/cuda/gemm_fp8_b128_sm90_launch.h"
#include "cuda/linear/gemm_fp8_b128_cublaslt.h"

namespace mxq::cuda {

// Whether the kernel takes a weight of shape [n, k].
bool fp8_b128_sm90_takes(int64_t n, int64_t k);

// The GEMM alone on quantized activations: xq E4M3 [m, w.k], xs K-block-major f32 with leading dimension
// xs_ld (a multiple of 4, >= m). Refuses, by name, a shape the kernel does not take, m < 1, null pointers, or
// a device other than compute capability 9.0.
Status gemm_fp8_b128_sm90(const uint8_t* xq, const float* xs, int64_t xs_ld, int64_t m,
                          const Fp8B128Weights& w, uint16_t* y, cudaStream_t stream,
                          Fp8GemmTile tile = Fp8GemmTile::kAuto);

// Quantize x (bf16 [m, w.k]) with g's scratch, then the GEMM into y (bf16 [m, w.n]).
Status linear_fp8_b128_sm90(Fp8B128Gemm& g, const uint16_t* x, int64_t m, const Fp8B128Weights& w,
                            uint16_t* y, cudaStream_t stream, Fp8GemmTile tile = Fp8GemmTile::kAuto);

}  // namespace mxq::cuda
