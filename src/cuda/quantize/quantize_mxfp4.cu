// MXFP4 quantize, rule ct: bf16 [rows, cols] → packed E2M1 values (16 bytes per block at i*16) + E8M0 scales.
// Layout: four threads per 1x32 block, each thread `unroll` (QuantLaunch, default by
// size: 2 or 4) such parts; block i
// covers x[i*32, i*32+32) of the flattened row-major input (cols is a multiple of 32, so blocks never
// straddle rows). Thread q of block i reads elements [8q, 8q+8) (one 16-byte load: a warp reads 512
// contiguous bytes), writes value bytes [4q, 4q+4) of the block, and thread 0 writes scale byte i, which is
// exactly the row-major [rows, cols/32] scales plane.
//
// note: the encode works on bf16 pairs, two elements per instruction (the ALU pipe bounded the one-element
// f32 encode at ~70% of copy). For |x| scaled by the block's power of two, t = |x| · 2^(127-b) < 8 (rule ct),
// and bf16 arithmetic rounds once (RNE) from the exact product, so
//   c1 = bf16(t + 64)  - bf16(64)       rounds t to a multiple of 0.5 (the bf16 ulp at 64): the code below 2,
//   c2 = bf16(t + 128) - bf16(128) + 2  rounds t to an integer: the code in [2, 4),
//   c4 = bf16(t + 256) - bf16(256) + 4  rounds t to an even integer: the code in [4, 8),
// and the E2M1 code (RNE, ties to the even code, saturating at 6) is min(c1, c2, c4, 7): each ci is exact in
// its own range and not below the exact code elsewhere. Checked exhaustively on the host for every finite
// bf16 |x| and every scale 2^-127..2^127 (see tests/cuda/quantize/quantize_test.cpp, EveryBf16Value, for the
// GPU). The block's amax is an integer max of the |x| bit patterns (monotone for non-negative bf16; Inf and
// NaN are the largest patterns, so one compare flags a non-finite block). note: the same loop as
// quantize_mx_kernel.cuh, kept here: through that skeleton the unroll 4 and 8 forms compiled 5-13% slower
// (session 12).
#include "cuda/common/pdl.cuh"
#include "cuda/quantize/quantize_encode.cuh"
#include "cuda/quantize/quantize_launch.h"

namespace mxq::cuda {
namespace {

using quant::fma_bf16x2;
using quant::min_u16x2;

constexpr int kThreads = 256;

// Two elements (the bf16 pair w, its magnitudes a) → their E2M1 codes in bits 3:0 (low) and 19:16 (high).
// f2: the block's factor as a bf16 pair.
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t w, uint32_t a, uint32_t f2) {
  // note: every ri is at least its magic constant, so the lane-wise subtractions never borrow.
  const uint32_t c1 = fma_bf16x2(a, f2, 0x42804280u) - 0x42804280u;
  const uint32_t c2 = fma_bf16x2(a, f2, 0x43004300u) - (0x43004300u - 0x00020002u);
  const uint32_t c4 = fma_bf16x2(a, f2, 0x43804380u) - (0x43804380u - 0x00040004u);
  const uint32_t code = min_u16x2(min_u16x2(c1, c2), min_u16x2(c4, 0x00070007u));
  // Sign bit 3 for strictly negative inputs: bit 15 of a + 0x7FFF is set iff |x| != 0 (-0.0 gives code 0).
  const uint32_t neg = (w & (a + 0x7FFF7FFFu) & 0x80008000u) >> 12;
  return code | neg;
}

template <int kUnroll>
__global__ void __launch_bounds__(kThreads)
    quantize_mxfp4_ct_kernel(const uint16_t* __restrict__ x, int64_t blocks, uint8_t* __restrict__ values,
                             uint8_t* __restrict__ scales, unsigned long long* bad_block) {
  // note: a CTA covers kUnroll x kThreads / 4 blocks; its j-th pass covers kThreads / 4 consecutive blocks
  // (a warp reads 512 contiguous bytes), and all kUnroll loads are issued before the first use.
  pdl::enter();
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x;
  uint4 r[kUnroll];
  quant::load_block_parts<kThreads>(x, base, blocks, r);
#pragma unroll
  for (int j = 0; j < kUnroll; ++j) {
    const int64_t g = base + j * kThreads, i = g >> 2;
    const bool live = i < blocks;
    const uint32_t w[4] = {r[j].x, r[j].y, r[j].z, r[j].w};
    uint32_t a[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) a[e] = w[e] & 0x7FFF7FFFu;
    const uint32_t m = quant::block_amax4(quant::amax_bits8(w));
    const bool q0 = live && (g & 3) == 0;
    if (m >= 0x7F80u && q0) atomicMin(bad_block, static_cast<unsigned long long>(i));
    const uint32_t b = quant::mxfp4_ct_scale(quant::bf16_bits_to_f32(m));
    const uint32_t f2 = quant::scale_factor_bf16x2(b);
    uint32_t t[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t c = e2m1_pair(w[e], a[e], f2);
      t[e] = c | c >> 12;  // note: byte 0 = element 2e in bits 3:0, element 2e+1 in bits 7:4
    }
    const uint32_t lo = __byte_perm(t[0], t[1], 0x0040), hi = __byte_perm(t[2], t[3], 0x0040);
    if (live) reinterpret_cast<uint32_t*>(values)[g] = __byte_perm(lo, hi, 0x5410);
    if (q0) scales[i] = static_cast<uint8_t>(b);
  }
}

}  // namespace

cudaError_t launch_quantize_mxfp4_ct(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                                     uint8_t* scales, unsigned long long* bad_block, cudaStream_t stream,
                                     QuantLaunch shape) {
  const int64_t blocks = rows * (cols / 32);
  if (blocks == 0) return cudaSuccess;
  // note: measured (bench/RESULTS.md, GPU quantize): 2 is faster up to 6144x4096 (25M elements: 0.5% there,
  // 1.3% at 4096x4096, 14% at 2048x768; at 1536x2048 the two swap places between PDL on and off), 4 is
  // 1.3-2.5% faster at 4096x12288 and 24576x4096; 8 is slowest everywhere.
  const int u = shape.unroll != 0 ? shape.unroll : (rows * cols < (int64_t{1} << 25) ? 2 : 4);
  if (u != 2 && u != 4 && u != 8) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((blocks * 4 + kThreads * u - 1) / (kThreads * u)));
  if (u == 2)
    return launch_pdl(quantize_mxfp4_ct_kernel<2>, grid, kThreads, 0, stream, x, blocks, values, scales,
                      bad_block);
  if (u == 4)
    return launch_pdl(quantize_mxfp4_ct_kernel<4>, grid, kThreads, 0, stream, x, blocks, values, scales,
                      bad_block);
  return launch_pdl(quantize_mxfp4_ct_kernel<8>, grid, kThreads, 0, stream, x, blocks, values, scales,
                    bad_block);
}

}  // namespace mxq::cuda
