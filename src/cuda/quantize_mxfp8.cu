// MXFP8 quantize, rule ceil: bf16 [rows, cols] → E4M3 values (32 bytes per block at i*32) + E8M0 scales.
// Layout: one thread per 1x32 block; block i covers x[i*32, i*32+32) of the flattened row-major input (cols
// is a multiple of 32, so blocks never straddle rows) and writes scale byte i, which is exactly the row-major
// [rows, cols/32] scales plane.
#include "cuda/quantize_encode.cuh"
#include "cuda/quantize_launch.h"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    quantize_mxfp8_ceil_kernel(const uint16_t* __restrict__ x, int64_t blocks, uint8_t* __restrict__ values,
                               uint8_t* __restrict__ scales, unsigned long long* bad_block) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= blocks) return;
  uint32_t w[16];
  const float amax = quant::load_mx_block(x, i, w, bad_block);
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

unsigned grid_for(int64_t blocks) { return static_cast<unsigned>((blocks + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t launch_quantize_mxfp8_ceil(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                                       uint8_t* scales, unsigned long long* bad_block, cudaStream_t stream) {
  const int64_t blocks = rows * (cols / 32);
  if (blocks == 0) return cudaSuccess;
  quantize_mxfp8_ceil_kernel<<<grid_for(blocks), kThreads, 0, stream>>>(x, blocks, values, scales, bad_block);
  return cudaGetLastError();
}

}  // namespace mxq::cuda
