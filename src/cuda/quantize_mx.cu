// MXFP8 (rule ceil) and MXFP4 (rule ct) quantize kernels: bf16 [rows, cols] → canonical planes.
// Layout: one thread per 1x32 block; block i covers x[i*32, i*32+32) of the flattened row-major input (cols is
// a multiple of 32, so blocks never straddle rows), writes 32 (MXFP8) or 16 (MXFP4) value bytes at i*32 or i*16
// and scale byte i, which is exactly the row-major [rows, cols/32] scales plane.
#include "cuda/quantize_encode.cuh"
#include "cuda/quantize_launch.h"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 256;

// Loads one 32-element bf16 block (64 B) into 16 words and returns its amax; flags a NaN/Inf block.
__device__ __forceinline__ float load_block(const uint16_t* x, int64_t i, uint32_t (&w)[16],
                                            unsigned long long* bad_block) {
  const uint4* src = reinterpret_cast<const uint4*>(x + i * 32);
#pragma unroll
  for (int v = 0; v < 4; ++v) {
    const uint4 r = __ldg(src + v);
    w[4 * v] = r.x, w[4 * v + 1] = r.y, w[4 * v + 2] = r.z, w[4 * v + 3] = r.w;
  }
  float amax = 0.0f;
  bool finite = true;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float lo = quant::bf16_bits_to_f32(w[j] & 0xFFFFu), hi = quant::bf16_bits_to_f32(w[j] >> 16);
    finite = finite && quant::is_finite_f32(lo) && quant::is_finite_f32(hi);
    amax = fmaxf(amax, fmaxf(fabsf(lo), fabsf(hi)));
  }
  if (!finite) atomicMin(bad_block, static_cast<unsigned long long>(i));
  return amax;
}

__global__ void __launch_bounds__(kThreads) quantize_mxfp8_ceil_kernel(const uint16_t* __restrict__ x,
                                                                       int64_t blocks, uint8_t* __restrict__ values,
                                                                       uint8_t* __restrict__ scales,
                                                                       unsigned long long* bad_block) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= blocks) return;
  uint32_t w[16];
  const float amax = load_block(x, i, w, bad_block);
  const uint32_t b = quant::mxfp8_ceil_scale(amax);
  const float factor = quant::exp2_int(127 - static_cast<int>(b));
  uint32_t out[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint32_t word = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t pair = w[2 * j + h];
      const uint32_t lo = quant::f32_to_e4m3(quant::bf16_bits_to_f32(pair & 0xFFFFu) * factor);
      const uint32_t hi = quant::f32_to_e4m3(quant::bf16_bits_to_f32(pair >> 16) * factor);
      word |= (lo | hi << 8) << (16 * h);
    }
    out[j] = word;
  }
  uint4* dst = reinterpret_cast<uint4*>(values + i * 32);
  dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
  dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
  scales[i] = static_cast<uint8_t>(b);
}

__global__ void __launch_bounds__(kThreads) quantize_mxfp4_ct_kernel(const uint16_t* __restrict__ x, int64_t blocks,
                                                                     uint8_t* __restrict__ values,
                                                                     uint8_t* __restrict__ scales,
                                                                     unsigned long long* bad_block) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= blocks) return;
  uint32_t w[16];
  const float amax = load_block(x, i, w, bad_block);
  const uint32_t b = quant::mxfp4_ct_scale(amax);
  const float factor = quant::exp2_int(127 - static_cast<int>(b));
  // note: word w[j] holds elements 2j, 2j+1, which pack into byte j (element 2j in bits 3:0).
  uint32_t out[4] = {0, 0, 0, 0};
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float x_lo = quant::bf16_bits_to_f32(w[j] & 0xFFFFu), x_hi = quant::bf16_bits_to_f32(w[j] >> 16);
    const uint32_t lo = quant::f32_to_e2m1(x_lo * factor, x_lo), hi = quant::f32_to_e2m1(x_hi * factor, x_hi);
    out[j / 4] |= (lo | hi << 4) << (8 * (j % 4));
  }
  *reinterpret_cast<uint4*>(values + i * 16) = make_uint4(out[0], out[1], out[2], out[3]);
  scales[i] = static_cast<uint8_t>(b);
}

unsigned grid_for(int64_t blocks) { return static_cast<unsigned>((blocks + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t launch_quantize_mxfp8_ceil(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                                       uint8_t* scales, unsigned long long* bad_block, cudaStream_t stream) {
  const int64_t blocks = rows * (cols / 32);
  if (blocks == 0) return cudaSuccess;
  quantize_mxfp8_ceil_kernel<<<grid_for(blocks), kThreads, 0, stream>>>(x, blocks, values, scales, bad_block);
  return cudaGetLastError();
}

cudaError_t launch_quantize_mxfp4_ct(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                                     uint8_t* scales, unsigned long long* bad_block, cudaStream_t stream) {
  const int64_t blocks = rows * (cols / 32);
  if (blocks == 0) return cudaSuccess;
  quantize_mxfp4_ct_kernel<<<grid_for(blocks), kThreads, 0, stream>>>(x, blocks, values, scales, bad_block);
  return cudaGetLastError();
}

}  // namespace mxq::cuda
