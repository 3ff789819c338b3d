// FP8-B128 activation quantizer (per-token groups of 128, the x side of the cuBLASLt block-scaled GEMM):
// bf16 x [m, k] row-major → E4M3 values [m, k] row-major + f32 scales, K-block-major: the scale of row r,
// block b (columns 128b..128b+127) sits at scales[b · scale_ld + r], scale_ld >= m (cuBLASLt VEC128_32F
// layout for a K-major operand; rows m..scale_ld-1 are left untouched).
// Rule (byte-exact twin: src/cpu/quantize_act.cpp): amax' = max(amax, 1e-4), e4m3(x · m) with
// m = fl(fl(1 / amax') · 448) (DeepGEMM's `x * (448.0 / amax)` as torch evaluates it), scale = amax' / 448;
// a short final block counts only its real elements. Any k >= 1.
// Layout: one warp per (row, block); lane l holds columns 128b + 4l .. +3 (one 8-byte load when k % 4 == 0);
// k % 8 == 0 (every transformer width): one half-warp per (row, block), lane l of it holding columns
// 128b + 8l .. +7 (one 16-byte load, one 8-byte store).
// note: the 16-byte form halves the load instructions; it is the same rule on the same elements, so the same
// bytes (tests/cuda/quantize/quantize_act_test.cpp compares every form with the CPU twin bitwise).
// note: no NaN/Inf check (a forward cannot synchronise to report it): a NaN element encodes as E4M3 NaN
// and an Inf turns its block into NaN, so bad activations stay visible downstream.
#include <cstdint>

#include "cuda/quantize/quantize_act_launch.h"
#include "cuda/quantize/quantize_encode.cuh"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32, kBlock = 128;

template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    quantize_act_fp8_b128_kernel(const uint16_t* __restrict__ x, int64_t m, int64_t k,
                                 uint8_t* __restrict__ values, float* __restrict__ scales, int64_t scale_ld) {
  const int64_t blocks = (k + kBlock - 1) / kBlock;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (w >= m * blocks) return;
  const int lane = threadIdx.x % 32;
  const int64_t r = w / blocks, b = w % blocks, c = b * kBlock + 4 * lane;
  const uint16_t* row = x + r * k;
  uint32_t h[2] = {0, 0};
  if constexpr (kVec) {
    if (c < k) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(row + c));
      h[0] = v.x, h[1] = v.y;
    }
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (c + e < k) h[e / 2] |= static_cast<uint32_t>(__ldg(row + c + e)) << (16 * (e % 2));
  }
  float v[4], amax = 0.0f;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    v[e] = quant::bf16_bits_to_f32((h[e / 2] >> (16 * (e % 2))) & 0xFFFFu);
    amax = fmaxf(amax, fabsf(v[e]));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  const float amax_c = fmaxf(amax, 1e-4f);  // note: DeepSeek's 1e-4 floor, as the weight quantizer
  const float factor = quant::fp8_b128_factor(amax_c);
  if (lane == 0) scales[b * scale_ld + r] = __fdiv_rn(amax_c, 448.0f);
  uint32_t out = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) out |= quant::f32_to_e4m3(__fmul_rn(v[e], factor)) << (8 * e);
  uint8_t* dst = values + r * k + c;
  if constexpr (kVec) {
    if (c < k) *reinterpret_cast<uint32_t*>(dst) = out;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (c + e < k) dst[e] = static_cast<uint8_t>(out >> (8 * e));
  }
}

// k % 8 == 0: half-warp h of warp w quantizes (row, block) item 2w + h.
__global__ void __launch_bounds__(kThreads)
    quantize_act_fp8_b128_x8(const uint16_t* __restrict__ x, int64_t m, int64_t k,
                             uint8_t* __restrict__ values, float* __restrict__ scales, int64_t scale_ld) {
  const int64_t blocks = (k + kBlock - 1) / kBlock;
  const int64_t item =
      (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * 2 + (threadIdx.x / 16) % 2;
  // note: both half-warps of a warp stay for the shuffles; an item past the end loads nothing, stores
  // nothing.
  const bool live = item < m * blocks;
  const int hl = threadIdx.x % 16;
  const int64_t r = live ? item / blocks : 0, b = live ? item % blocks : 0, c = b * kBlock + 8 * hl;
  uint4 v4 = {0, 0, 0, 0};
  if (live && c < k) v4 = __ldg(reinterpret_cast<const uint4*>(x + r * k + c));
  const uint32_t h[4] = {v4.x, v4.y, v4.z, v4.w};
  float v[8], amax = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    v[e] = quant::bf16_bits_to_f32((h[e / 2] >> (16 * (e % 2))) & 0xFFFFu);
    amax = fmaxf(amax, fabsf(v[e]));
  }
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  if (!live) return;
  const float amax_c = fmaxf(amax, 1e-4f);  // note: DeepSeek's 1e-4 floor, as the weight quantizer
  const float factor = quant::fp8_b128_factor(amax_c);
  if (hl == 0) scales[b * scale_ld + r] = __fdiv_rn(amax_c, 448.0f);
  uint32_t out[2] = {0, 0};
#pragma unroll
  for (int e = 0; e < 8; ++e) out[e / 4] |= quant::f32_to_e4m3(__fmul_rn(v[e], factor)) << (8 * (e % 4));
  if (c < k) *reinterpret_cast<uint2*>(values + r * k + c) = make_uint2(out[0], out[1]);
}

}  // namespace

cudaError_t launch_quantize_act_fp8_b128(const uint16_t* x, int64_t m, int64_t k, uint8_t* values,
                                         float* scales, int64_t scale_ld, cudaStream_t stream) {
  if (m == 0 || k == 0) return cudaSuccess;
  const int64_t warps = m * ((k + kBlock - 1) / kBlock);
  // note: the 16-byte form also needs x 16-byte and values 8-byte aligned (row starts then are too)
  if (k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(values) % 8 == 0) {
    const dim3 grid8(static_cast<unsigned>((warps + 2 * kWarps - 1) / (2 * kWarps)));
    quantize_act_fp8_b128_x8<<<grid8, kThreads, 0, stream>>>(x, m, k, values, scales, scale_ld);
    return cudaGetLastError();
  }
  const dim3 grid(static_cast<unsigned>((warps + kWarps - 1) / kWarps));
  if (k % 4 == 0)
    quantize_act_fp8_b128_kernel<true><<<grid, kThreads, 0, stream>>>(x, m, k, values, scales, scale_ld);
  else
    quantize_act_fp8_b128_kernel<false><<<grid, kThreads, 0, stream>>>(x, m, k, values, scales, scale_ld);
  return cudaGetLastError();
}

}  // namespace mxq::cuda
