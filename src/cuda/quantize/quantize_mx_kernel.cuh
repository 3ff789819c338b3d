// The MX quantize kernel shared by quantize_mxfp8.cu and fake_quant_mxfp8.cu; each supplies an encoder policy.
// note: quantize_mxfp4.cu keeps its own copy of this loop: written through this skeleton, its unroll 4 and 8
// forms compiled to other SASS that ran 5-13% slower on the Qwen3-8B shapes (H200, session 12 call C against
// session 7's launch-shape table; unroll 2 and every MXFP8 form unchanged).
// Layout: four threads per 1x32 block, each thread kUnroll such parts; block i covers x[i*32, i*32+32) of the
// flattened row-major input (cols is a multiple of 32, so blocks never straddle rows). Thread q of block i
// reads elements [8q, 8q+8) (one 16-byte load: a warp reads 512 contiguous bytes) and encodes them into its
// piece q of the block's values; thread 0 writes scale byte i, which is exactly the row-major [rows, cols/32]
// scales plane. A CTA covers kUnroll x kThreads / 4 blocks; its j-th pass covers kThreads / 4 consecutive
// blocks, and all kUnroll loads are issued before the first use.
// The block's amax is an integer max of the |x| bit patterns (monotone for non-negative bf16; Inf and NaN are
// the largest patterns, so one compare flags a non-finite block, recorded by its thread 0 in bad_block).
// Policy (Enc): scale(amax) → the block's E8M0 byte b under the format's rule; store(w, b, m, values, g,
// live) encodes the thread's 8 elements (4 bf16 pairs w; m: the block's amax bits) and writes its piece g of
// `values` when live; kScales: the kernel writes the scale bytes and flags non-finite blocks in bad_block
// (false: the activation quantize-dequantize of fake_quant_mxfp8.cu, whose output is bf16 and whose
// non-finite blocks come out NaN).
#pragma once

#include <cstdint>

#include "cuda/common/pdl.cuh"
#include "cuda/quantize/quantize_encode.cuh"

namespace mxq::cuda::quant {

inline constexpr int kMxThreads = 256;

template <class Enc, int kUnroll>
__global__ void __launch_bounds__(kMxThreads)
    quantize_mx_kernel(const uint16_t* __restrict__ x, int64_t blocks, uint8_t* __restrict__ values,
                       uint8_t* __restrict__ scales, unsigned long long* bad_block) {
  pdl::enter();
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kMxThreads * kUnroll + threadIdx.x;
  uint4 r[kUnroll];
  load_block_parts<kMxThreads>(x, base, blocks, r);
#pragma unroll
  for (int j = 0; j < kUnroll; ++j) {
    const int64_t g = base + j * kMxThreads, i = g >> 2;
    const bool live = i < blocks;
    const uint32_t w[4] = {r[j].x, r[j].y, r[j].z, r[j].w};
    const uint32_t m = block_amax4(amax_bits8(w));
    const bool q0 = live && (g & 3) == 0;
    if (Enc::kScales && m >= 0x7F80u && q0) atomicMin(bad_block, static_cast<unsigned long long>(i));
    const uint32_t b = Enc::scale(bf16_bits_to_f32(m));
    Enc::store(w, b, m, values, g, live);
    if (Enc::kScales && q0) scales[i] = static_cast<uint8_t>(b);
  }
}

// One launch over `blocks` 1x32 blocks with kUnroll = unroll (2, 4 or 8; else cudaErrorInvalidValue).
template <class Enc>
cudaError_t launch_quantize_mx(const uint16_t* x, int64_t blocks, uint8_t* values, uint8_t* scales,
                               unsigned long long* bad_block, cudaStream_t stream, int unroll) {
  if (unroll != 2 && unroll != 4 && unroll != 8) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((blocks * 4 + kMxThreads * unroll - 1) / (kMxThreads * unroll)));
  auto* kernel = unroll == 2   ? quantize_mx_kernel<Enc, 2>
                 : unroll == 4 ? quantize_mx_kernel<Enc, 4>
                               : quantize_mx_kernel<Enc, 8>;
  return launch_pdl(kernel, grid, kMxThreads, 0, stream, x, blocks, values, scales, bad_block);
}

}  // namespace mxq::cuda::quant
