// MXFP8 activation quantize-dequantize (the W8A8 mode of the MX linears, cuda/linear/linear.h): bf16 x [m, k]
// → bf16 y [m, k], each 1x32 block of a row quantized as the MXFP8 weight quantizer does (rule ceil, byte for
// byte quantize_mxfp8.cu's elements and scale) and dequantized: y = bf16_rn(f32(e4m3) · 2^(b-127)), the f32
// product exact (at most 2^135.8 and at least 2^-136; above f32's range it is inf, as on the CPU), one RNE
// rounding to bf16. A block holding an Inf or NaN comes out as 32 NaN (E8M0 255, the MX NaN scale), so a
// bad activation propagates as it would through the bf16 linear. CPU twin: cpu/quantize_act.h
// (fake_quant_mxfp8).
// Layout: quantize_mx_kernel.cuh (four threads a block, 16 bytes in and 16 bytes out each).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "cuda/quantize/quantize_act_launch.h"
#include "cuda/quantize/quantize_mx_kernel.cuh"

namespace mxq::cuda {
namespace {

struct Mxfp8FakeQuantEnc {
  static constexpr bool kScales = false;
  __device__ static uint32_t scale(float amax) { return quant::mxfp8_ceil_scale(amax); }
  __device__ static void store(const uint32_t (&w)[4], uint32_t b, uint32_t m, uint8_t* __restrict__ values,
                               int64_t g, bool live) {
    uint32_t p[4];
    quant::mxfp8_encode8(w, quant::scale_factor_bf16x2(b), p);
    const float s = quant::exp2_int(static_cast<int>(b) - 127);
    uint32_t out[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const __half2 h(
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(p[e] & 0xFFFFu), __NV_E4M3));
      const float2 f = __half22float2(h);
      const __nv_bfloat162 r = __floats2bfloat162_rn(__fmul_rn(f.x, s), __fmul_rn(f.y, s));
      out[e] = m >= 0x7F80u ? 0x7FC07FC0u : *reinterpret_cast<const uint32_t*>(&r);
    }
    if (live) reinterpret_cast<uint4*>(values)[g] = make_uint4(out[0], out[1], out[2], out[3]);
  }
};

}  // namespace

cudaError_t launch_fake_quant_mxfp8(const uint16_t* x, int64_t m, int64_t k, uint16_t* y,
                                    cudaStream_t stream) {
  const int64_t blocks = m * (k / 32);
  if (blocks == 0) return cudaSuccess;
  // note: unroll 2 (two blocks' parts a thread), the MXFP8 weight quantizer's default.
  return quant::launch_quantize_mx<Mxfp8FakeQuantEnc>(x, blocks, reinterpret_cast<uint8_t*>(y), nullptr,
                                                      nullptr, stream, 2);
}

}  // namespace mxq::cuda
