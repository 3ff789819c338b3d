// Unchecked launcher of the sm_90a FP8-B128 GEMM (the part compiled by nvcc); gemm_fp8_b128_sm90.cpp checks
// the arguments. Contract and layout: gemm_fp8_b128_sm90.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

// Which kernel shape the launch uses: kAuto picks (gemm_fp8_b128_sm90.cu); the others force one (tests and
// `mxq-bench linear` run each): 128 x 128 tiles, 128 x 64 tiles, 128 x 128 tiles in 2-CTA clusters that
// share (multicast) the W tile.
enum class Fp8GemmTile : uint8_t { kAuto, kN128, kN64, kN128Pair };

// y [m, n] bf16 = (xq · xs) · (W · ws)^T. xq: E4M3 [m, k] row-major; xs: f32 [k/128][xs_ld] (row r of block b
// at b·xs_ld + r, xs_ld >= m, a multiple of 4); wv: E4M3 [n, k]; wsc: f32 block scales, block (nb, kb) at
// nb·ws_ld + kb. n, k multiples of 128; m >= 1. Runs only on compute capability 9.0
// (cudaErrorNoKernelImageForDevice elsewhere).
cudaError_t launch_gemm_fp8_b128_sm90(const uint8_t* xq, const float* xs, int64_t xs_ld, int m,
                                      const uint8_t* wv, const float* wsc, int64_t ws_ld, int n, int k,
                                      uint16_t* y, Fp8GemmTile tile, cudaStream_t stream);

}  // namespace mxq::cuda
