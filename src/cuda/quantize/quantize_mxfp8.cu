// MXFP8 quantize, rule ceil: bf16 [rows, cols] → E4M3 values (32 bytes per block at i*32) + E8M0 scales.
// Layout (quantize_mx_kernel.cuh): four threads per 1x32 block, each thread `unroll` (QuantLaunch, default 2)
// such parts; thread q of block i writes value bytes [8q, 8q+8) of the block (one 8-byte store: a warp writes
// 256 contiguous bytes).
//
// note: the scaling x · 2^(127-b) runs on
// bf16 pairs (one fma.rn.bf16x2 with -0 as addend per two elements): it is exact, since a bf16 times a power
// of two stays a bf16 unless it leaves the normal range, and under rule ceil |x| · 2^(127-b) <= 448 (no
// overflow) while a product below 2^-126 encodes to a signed zero either way (the E4M3 grid ends at 2^-9).
// The two scaled elements then go to E4M3 in one cvt (sm_89+).
#include "cuda/quantize/quantize_launch.h"
#include "cuda/quantize/quantize_mx_kernel.cuh"

namespace mxq::cuda {
namespace {

struct Mxfp8CeilEnc {
  static constexpr bool kScales = true;
  __device__ static uint32_t scale(float amax) { return quant::mxfp8_ceil_scale(amax); }
  __device__ static void store(const uint32_t (&w)[4], uint32_t b, uint32_t, uint8_t* __restrict__ values,
                               int64_t g, bool live) {
    uint32_t p[4];
    quant::mxfp8_encode8(w, quant::scale_factor_bf16x2(b), p);
    if (live)
      reinterpret_cast<uint2*>(values)[g] =
          make_uint2(__byte_perm(p[0], p[1], 0x5410), __byte_perm(p[2], p[3], 0x5410));
  }
};

}  // namespace

cudaError_t launch_quantize_mxfp8_ceil(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                                       uint8_t* scales, unsigned long long* bad_block, cudaStream_t stream,
                                       QuantLaunch shape) {
  const int64_t blocks = rows * (cols / 32);
  if (blocks == 0) return cudaSuccess;
  // note: 2 was fastest on every Qwen3 shape (bench/RESULTS.md, GPU quantize: 2.5% over 4 at 4096x4096, 10%
  // at 2048x768; 8 was slowest everywhere).
  return quant::launch_quantize_mx<Mxfp8CeilEnc>(x, blocks, values, scales, bad_block, stream,
                                                 shape.unroll == 0 ? 2 : shape.unroll);
}

}  // namespace mxq::cuda
