// FP8-B128 (DeepSeek style) quantize kernel: bf16 [rows, cols] → E4M3 [rows, cols] + f32 weight_scale_inv
// [cdiv(rows,128), cdiv(cols,128)], both row-major. Per block amax' = max(amax, 1e-4); elements
// e4m3(x · (448 / amax')), scale = amax' / 448; short edge blocks count only their real elements.
// Layout: one CUDA block (256 threads) per 128x128 block; thread t covers columns 8·(t%16)..+7 of rows
// t/16 + 16·p (p < 8), held in registers between the amax pass and the encode pass (one DRAM read).
#include "cuda/quantize_encode.cuh"
#include "cuda/quantize_launch.h"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 256, kTile = 128, kPasses = kTile / (kThreads / 16);

// kVec: cols % 8 == 0, so each thread's 8 columns are one aligned 16-byte load and 8-byte store.
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    quantize_fp8_b128_kernel(const uint16_t* __restrict__ x, int64_t rows, int64_t cols,
                             uint8_t* __restrict__ values, float* __restrict__ scales,
                             unsigned long long* bad_block) {
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tr = threadIdx.x / 16;
  const int64_t c = c0 + 8 * (threadIdx.x % 16);
  uint32_t w[kPasses][4];
  float amax = 0.0f;
  bool finite = true;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int64_t r = r0 + tr + 16 * p;
    w[p][0] = w[p][1] = w[p][2] = w[p][3] = 0;
    if (r < rows) {
      if constexpr (kVec) {
        if (c < cols) {
          const uint4 v = __ldg(reinterpret_cast<const uint4*>(x + r * cols + c));
          w[p][0] = v.x, w[p][1] = v.y, w[p][2] = v.z, w[p][3] = v.w;
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (c + e < cols)
            w[p][e / 2] |= static_cast<uint32_t>(__ldg(x + r * cols + c + e)) << (16 * (e % 2));
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float v = quant::bf16_bits_to_f32((w[p][e / 2] >> (16 * (e % 2))) & 0xFFFFu);
      finite = finite && quant::is_finite_f32(v);
      amax = fmaxf(amax, fabsf(v));
    }
  }
  const float factor = quant::fp8_b128_tile_factor<kThreads>(amax, finite, cols, bad_block, scales);
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int64_t r = r0 + tr + 16 * p;
    if (r >= rows) continue;
    uint32_t out[2] = {0, 0};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float v = quant::bf16_bits_to_f32((w[p][e / 2] >> (16 * (e % 2))) & 0xFFFFu);
      out[e / 4] |= quant::f32_to_e4m3(v * factor) << (8 * (e % 4));
    }
    if constexpr (kVec) {
      if (c < cols) *reinterpret_cast<uint2*>(values + r * cols + c) = make_uint2(out[0], out[1]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (c + e < cols) values[r * cols + c + e] = static_cast<uint8_t>(out[e / 4] >> (8 * (e % 4)));
    }
  }
}

}  // namespace

cudaError_t launch_quantize_fp8_b128(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                                     float* scales, unsigned long long* bad_block, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                  static_cast<unsigned>((rows + kTile - 1) / kTile));
  if (cols % 8 == 0)
    quantize_fp8_b128_kernel<true><<<grid, kThreads, 0, stream>>>(x, rows, cols, values, scales, bad_block);
  else
    quantize_fp8_b128_kernel<false><<<grid, kThreads, 0, stream>>>(x, rows, cols, values, scales, bad_block);
  return cudaGetLastError();
}

}  // namespace mxq::cuda
