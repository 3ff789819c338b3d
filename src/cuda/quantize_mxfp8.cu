// MXFP8 quantize, rule ceil: bf16 [rows, cols] → E4M3 values (32 bytes per block at i*32) + E8M0 scales.
// Layout: four threads per 1x32 block, each thread `unroll` (QuantLaunch, default 2) such parts; block i
// covers x[i*32, i*32+32) of the flattened row-major input (cols is a multiple of 32, so blocks never
// straddle rows). Thread q of block i reads elements [8q, 8q+8) (one 16-byte load: a warp reads 512
// contiguous bytes), writes value bytes [8q, 8q+8) of the block (one 8-byte store: a warp writes 256
// contiguous bytes), and thread 0 writes scale byte i, which is exactly the row-major [rows, cols/32] scales
// plane.
//
// note: the block's amax is an integer max of the |x| bit patterns (monotone for non-negative bf16; Inf and
// NaN are the largest patterns, so one compare flags a non-finite block). The scaling x · 2^(127-b) runs on
// bf16 pairs (one fma.rn.bf16x2 with -0 as addend per two elements): it is exact, since a bf16 times a power
// of two stays a bf16 unless it leaves the normal range, and under rule ceil |x| · 2^(127-b) <= 448 (no
// overflow) while a product below 2^-126 encodes to a signed zero either way (the E4M3 grid ends at 2^-9).
// The two scaled elements then go to E4M3 in one cvt (sm_89+).
#include "cuda/pdl.cuh"
#include "cuda/quantize_encode.cuh"
#include "cuda/quantize_launch.h"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 256;

template <int kUnroll>
__global__ void __launch_bounds__(kThreads)
    quantize_mxfp8_ceil_kernel(const uint16_t* __restrict__ x, int64_t blocks, uint8_t* __restrict__ values,
                               uint8_t* __restrict__ scales, unsigned long long* bad_block) {
  // note: a CTA covers kUnroll x kThreads / 4 blocks; its j-th pass covers kThreads / 4 consecutive blocks,
  // and all kUnroll loads are issued before the first use.
  pdl::enter();
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x;
  uint4 r[kUnroll];
  quant::load_block_parts<kThreads>(x, base, blocks, r);
#pragma unroll
  for (int j = 0; j < kUnroll; ++j) {
    const int64_t g = base + j * kThreads, i = g >> 2;
    const bool live = i < blocks;
    const uint32_t w[4] = {r[j].x, r[j].y, r[j].z, r[j].w};
    const uint32_t m = quant::block_amax4(quant::amax_bits8(w));
    const bool q0 = live && (g & 3) == 0;
    if (m >= 0x7F80u && q0) atomicMin(bad_block, static_cast<unsigned long long>(i));
    const uint32_t b = quant::mxfp8_ceil_scale(quant::bf16_bits_to_f32(m));
    const uint32_t f2 = quant::scale_factor_bf16x2(b);
    uint32_t p[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t t = quant::fma_bf16x2(w[e], f2, 0x80008000u);  // note: + (-0) keeps the sign of zero
      p[e] = quant::f32x2_to_e4m3x2(__uint_as_float(t << 16), __uint_as_float(t & 0xFFFF0000u));
    }
    if (live)
      reinterpret_cast<uint2*>(values)[g] =
          make_uint2(__byte_perm(p[0], p[1], 0x5410), __byte_perm(p[2], p[3], 0x5410));
    if (q0) scales[i] = static_cast<uint8_t>(b);
  }
}

}  // namespace

cudaError_t launch_quantize_mxfp8_ceil(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                                       uint8_t* scales, unsigned long long* bad_block, cudaStream_t stream,
                                       QuantLaunch shape) {
  const int64_t blocks = rows * (cols / 32);
  if (blocks == 0) return cudaSuccess;
  // note: 2 was fastest on every Qwen3 shape (bench/RESULTS.md, quant7: 2.5% over 4 at 4096x4096, 10% at
  // 2048x768; 8 was slowest everywhere).
  const int u = shape.unroll == 0 ? 2 : shape.unroll;
  if (u != 2 && u != 4 && u != 8) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((blocks * 4 + kThreads * u - 1) / (kThreads * u)));
  if (u == 2)
    return launch_pdl(quantize_mxfp8_ceil_kernel<2>, grid, kThreads, 0, stream, x, blocks, values, scales,
                      bad_block);
  if (u == 4)
    return launch_pdl(quantize_mxfp8_ceil_kernel<4>, grid, kThreads, 0, stream, x, blocks, values, scales,
                      bad_block);
  return launch_pdl(quantize_mxfp8_ceil_kernel<8>, grid, kThreads, 0, stream, x, blocks, values, scales,
                    bad_block);
}

}  // namespace mxq::cuda
