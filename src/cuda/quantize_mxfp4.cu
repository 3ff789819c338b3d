// MXFP4 quantize, rule ct: bf16 [rows, cols] → packed E2M1 values (16 bytes per block at i*16) + E8M0 scales.
// Layout (quantize_mx_kernel.cuh): four threads per 1x32 block, each thread `unroll` (QuantLaunch, default by
// size: 2 or 4) such parts; thread q of block i writes value bytes [4q, 4q+4) of the block.
//
// note: the encode works on bf16 pairs, two elements per instruction (the ALU pipe bounded the one-element
// f32 encode at ~70% of copy). For |x| scaled by the block's power of two, t = |x| · 2^(127-b) < 8 (rule ct),
// and bf16 arithmetic rounds once (RNE) from the exact product, so
//   c1 = bf16(t + 64)  - bf16(64)       rounds t to a multiple of 0.5 (the bf16 ulp at 64): the code below 2,
//   c2 = bf16(t + 128) - bf16(128) + 2  rounds t to an integer: the code in [2, 4),
//   c4 = bf16(t + 256) - bf16(256) + 4  rounds t to an even integer: the code in [4, 8),
// and the E2M1 code (RNE, ties to the even code, saturating at 6) is min(c1, c2, c4, 7): each ci is exact in
// its own range and not below the exact code elsewhere. Checked exhaustively on the host for every finite
// bf16 |x| and every scale 2^-127..2^127 (see tests/cuda/quantize_test.cpp, EveryBf16Value, for the GPU).
#include "cuda/quantize_launch.h"
#include "cuda/quantize_mx_kernel.cuh"

namespace mxq::cuda {
namespace {

using quant::fma_bf16x2;
using quant::min_u16x2;

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

struct Mxfp4CtEnc {
  static constexpr bool kScales = true;
  __device__ static uint32_t scale(float amax) { return quant::mxfp4_ct_scale(amax); }
  __device__ static void store(const uint32_t (&w)[4], uint32_t b, uint32_t, uint8_t* __restrict__ values,
                               int64_t g, bool live) {
    const uint32_t f2 = quant::scale_factor_bf16x2(b);
    uint32_t t[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t c = e2m1_pair(w[e], w[e] & 0x7FFF7FFFu, f2);
      t[e] = c | c >> 12;  // note: byte 0 = element 2e in bits 3:0, element 2e+1 in bits 7:4
    }
    const uint32_t lo = __byte_perm(t[0], t[1], 0x0040), hi = __byte_perm(t[2], t[3], 0x0040);
    if (live) reinterpret_cast<uint32_t*>(values)[g] = __byte_perm(lo, hi, 0x5410);
  }
};

}  // namespace

cudaError_t launch_quantize_mxfp4_ct(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                                     uint8_t* scales, unsigned long long* bad_block, cudaStream_t stream,
                                     QuantLaunch shape) {
  const int64_t blocks = rows * (cols / 32);
  if (blocks == 0) return cudaSuccess;
  // note: measured (bench/RESULTS.md, quant7): 2 is faster up to 6144x4096 (25M elements: 0.5% there, 1.3%
  // at 4096x4096, 14% at 2048x768; at 1536x2048 the two swap places between PDL on and off), 4 is 1.3-2.5%
  // faster at 4096x12288 and 24576x4096; 8 is slowest everywhere.
  return quant::launch_quantize_mx<Mxfp4CtEnc>(
      x, blocks, values, scales, bad_block, stream,
      shape.unroll != 0 ? shape.unroll : (rows * cols < (int64_t{1} << 25) ? 2 : 4));
}

}  // namespace mxq::cuda
