// FP8-B128 (DeepSeek style) quantize kernel: bf16 [rows, cols] → E4M3 [rows, cols] + f32 weight_scale_inv
// [cdiv(rows,128), cdiv(cols,128)], both row-major. Per block amax' = max(amax, 1e-4); elements
// e4m3(x · m), scale = amax' / 448; short edge blocks count only their real elements.
// (the multiplier is m = fl(fl(1 / amax') · 448), torch's evaluation of 448 / amax': quantize_encode.cuh)
// Layout: a CTA (256 threads) works on one 128x128 tile at a time, tiles numbered row-major over the scales
// plane; thread t covers columns 8·(t%16)..+7 of rows t/16 + 16·p (p < 8) of the tile, held in registers
// between the amax pass and the encode pass (one DRAM read). QuantLaunch::ctas_per_sm = 0: one CTA per tile;
// 1..4 (default 3 while the tiles fit one round of it): a grid of that many CTAs per SM, CTA k taking tiles
// k, k + grid, ..., with the next tile's 8 loads issued before the current tile's reduction and encode (the
// loads of a tile overlap the previous tile's barrier, arithmetic and stores).
//
// note: in the striding kernel the tile's amax is an integer max of the |x| bit patterns (as the MX kernels:
// one compare also flags Inf / NaN), and two elements go to E4M3 in one cvt (sm_89+); in both kernels the
// product x · m is f32, rounded once (__fmul_rn: never contracted), as the CPU codec's.
#include <algorithm>

#include "cuda/common/pdl.cuh"
#include "cuda/quantize/quantize_encode.cuh"
#include "cuda/quantize/quantize_launch.h"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 256, kTile = 128, kPasses = kTile / (kThreads / 16);

using Regs = uint32_t[kPasses][4];

// kVec: cols % 8 == 0, so each thread's 8 columns are one aligned 16-byte load and 8-byte store.
template <bool kVec>
__device__ __forceinline__ void load_tile(const uint16_t* __restrict__ x, int64_t rows, int64_t cols,
                                          int64_t r0, int64_t c, Regs& w) {
  const int tr = threadIdx.x / 16;
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
  }
}

template <bool kVec>
__device__ __forceinline__ void encode_tile(const Regs& w, int64_t rows, int64_t cols, int64_t tile_row,
                                            int64_t tile_col, int parity, uint8_t* __restrict__ values,
                                            float* __restrict__ scales, unsigned long long* bad_block) {
  uint32_t m = 0;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) m = max(m, quant::amax_bits8(w[p]));
  const float factor = quant::fp8_b128_tile_factor<kThreads>(quant::bf16_bits_to_f32(m), m < 0x7F80u, cols,
                                                             tile_row, tile_col, parity, bad_block, scales);
  const int tr = threadIdx.x / 16;
  const int64_t c = tile_col * kTile + 8 * (threadIdx.x % 16);
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int64_t r = tile_row * kTile + tr + 16 * p;
    if (r >= rows) continue;
    uint32_t q[4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
      q[e] = quant::f32x2_to_e4m3x2(__fmul_rn(__uint_as_float(w[p][e] << 16), factor),
                                    __fmul_rn(__uint_as_float(w[p][e] & 0xFFFF0000u), factor));
    const uint32_t lo = __byte_perm(q[0], q[1], 0x5410), hi = __byte_perm(q[2], q[3], 0x5410);
    if constexpr (kVec) {
      if (c < cols) *reinterpret_cast<uint2*>(values + r * cols + c) = make_uint2(lo, hi);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (c + e < cols) values[r * cols + c + e] = static_cast<uint8_t>((e < 4 ? lo : hi) >> (8 * (e % 4)));
    }
  }
}

// One CTA per tile (ctas_per_sm = 0), grid (tiles_x, tiles_y): the kernel of the sessions before quant7,
// unchanged but for the PDL entry (note: quant7's rewrite of it with the integer amax, e4m3x2 cvt and a 1-D
// grid was 3-8% slower on the 8B shapes; its SASS showed a 64-bit division call ahead of the loads).
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    quantize_fp8_b128_tile_kernel(const uint16_t* __restrict__ x, int64_t rows, int64_t cols,
                                  uint8_t* __restrict__ values, float* __restrict__ scales,
                                  unsigned long long* bad_block) {
  pdl::enter();
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
      out[e / 4] |= quant::f32_to_e4m3(__fmul_rn(v, factor)) << (8 * (e % 4));
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

// ctas_per_sm > 0: the CTA strides over the tiles with one tile's loads in flight ahead.
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    quantize_fp8_b128_stride_kernel(const uint16_t* __restrict__ x, int64_t rows, int64_t cols,
                                    int64_t tiles_x, int64_t tiles, uint8_t* __restrict__ values,
                                    float* __restrict__ scales, unsigned long long* bad_block) {
  pdl::enter();
  const int64_t c_off = 8 * (threadIdx.x % 16);
  int64_t t = blockIdx.x;
  Regs w;
  load_tile<kVec>(x, rows, cols, t / tiles_x * kTile, t % tiles_x * kTile + c_off, w);
  {
    for (int parity = 0;; parity ^= 1) {
      const int64_t next = t + gridDim.x;  // note: uniform over the CTA, so every thread reaches the barriers
      Regs nw;
      if (next < tiles)
        load_tile<kVec>(x, rows, cols, next / tiles_x * kTile, next % tiles_x * kTile + c_off, nw);
      encode_tile<kVec>(w, rows, cols, t / tiles_x, t % tiles_x, parity, values, scales, bad_block);
      if (next >= tiles) break;
#pragma unroll
      for (int p = 0; p < kPasses; ++p)
#pragma unroll
        for (int e = 0; e < 4; ++e) w[p][e] = nw[p][e];
      t = next;
    }
  }
}

template <bool kVec>
cudaError_t launch(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values, float* scales,
                   unsigned long long* bad_block, cudaStream_t stream, int ctas_per_sm) {
  const int64_t tiles_x = (cols + kTile - 1) / kTile, tiles = tiles_x * ((rows + kTile - 1) / kTile);
  if (ctas_per_sm == 0)
    return launch_pdl(quantize_fp8_b128_tile_kernel<kVec>,
                      dim3(static_cast<unsigned>(tiles_x), static_cast<unsigned>((rows + kTile - 1) / kTile)),
                      kThreads, 0, stream, x, rows, cols, values, scales, bad_block);
  int device = 0, sms = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess)
    return e;
  const int64_t grid = std::min<int64_t>(tiles, static_cast<int64_t>(sms) * ctas_per_sm);
  return launch_pdl(quantize_fp8_b128_stride_kernel<kVec>, dim3(static_cast<unsigned>(grid)), kThreads, 0,
                    stream, x, rows, cols, tiles_x, tiles, values, scales, bad_block);
}

}  // namespace

cudaError_t launch_quantize_fp8_b128(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                                     float* scales, unsigned long long* bad_block, cudaStream_t stream,
                                     QuantLaunch shape) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  int ctas = shape.ctas_per_sm;
  if (ctas < -1 || ctas > 4) return cudaErrorInvalidValue;
  // note: measured (bench/RESULTS.md, GPU quantize): while the tiles fit one round of the striding grid at 3
  // CTAs per SM (<= 396 on an H200, the 30B-A3B expert shapes: one round, no loop) it beats one CTA per tile:
  // 4.88 / 3.64 us with PDL (5.14 / 3.92 without) against earlier sessions' 5.44 / 3.93 (no PDL). Above,
  // one CTA per tile (earlier sessions' numbers) was as fast or faster on every 8B shape (striding grid:
  // 16.4 / 22.2 / 81.2 / 41.1 us against 16.0-16.2 / 21.9-22.0 / 74.1 / 39.4); 1 and 2 CTAs per SM were
  // slower everywhere.
  if (ctas == -1) {
    int device = 0, sms = 0;
    if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
    if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        e != cudaSuccess)
      return e;
    const int64_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
    ctas = tiles <= 3 * static_cast<int64_t>(sms) ? 3 : 0;
  }
  if (cols % 8 == 0) return launch<true>(x, rows, cols, values, scales, bad_block, stream, ctas);
  return launch<false>(x, rows, cols, values, scales, bad_block, stream, ctas);
}

}  // namespace mxq::cuda
