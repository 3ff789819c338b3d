// Block quantizers from any source dtype (bf16, f16, f32) and with any MXFP8 scale rule (ceil, ocp, floor,
// ct): the cases the bf16 default kernels (quantize_mxfp8.cu, quantize_mxfp4.cu, quantize_fp8_b128.cu) do
// not cover. Byte-exact twins of the CPU quantize (format/quantize.cpp, spec/formats.md):
//   MXFP8: b from the block amax by the rule (scale_rule.h's bit formulas), elements e4m3(x · 2^(127-b)),
//          saturating; rule ct adds +0 after the rounded product (compressed-tensors' zero point: a -0 input
//          or a negative product that underflows f32 encodes as 0x00).
//   MXFP4: rule ct only, elements e2m1(x · 2^(127-b)), sign from x.   FP8-B128: as quantize_fp8_b128.cu.
// Layouts: input row-major [rows, cols]; MX: one thread per 1x32 block (cols % 32 == 0), block i at
// elements i·32, scale byte i; FP8-B128: one CUDA block (256 threads) per 128x128 block, thread t holds
// columns 8·(t%16)..+7 of rows t/16 + 16·p. Element conversions to f32 are exact (f16 subnormals too).
#include <cuda_fp16.h>

#include "cuda/quantize/quantize_encode.cuh"
#include "cuda/quantize/quantize_launch.h"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 256;

template <QuantSrc S>
__device__ __forceinline__ float to_f32(uint32_t bits) {
  if constexpr (S == QuantSrc::kBF16) return quant::bf16_bits_to_f32(bits);
  if constexpr (S == QuantSrc::kF16) return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  return __uint_as_float(bits);
}

// 8 consecutive elements at element index e (16-byte aligned for 16-bit sources, 32-byte for f32).
template <QuantSrc S>
__device__ __forceinline__ void load8(const void* x, int64_t e, float (&v)[8]) {
  if constexpr (S == QuantSrc::kF32) {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const float*>(x) + e);
    const uint4 a = __ldg(p), b = __ldg(p + 1);
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __uint_as_float(w[i]);
  } else {
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(x) + e));
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = to_f32<S>((w[i / 2] >> (16 * (i % 2))) & 0xFFFFu);
  }
}

template <QuantSrc S>
__device__ __forceinline__ float load1(const void* x, int64_t e) {
  if constexpr (S == QuantSrc::kF32) return __ldg(static_cast<const float*>(x) + e);
  return to_f32<S>(__ldg(static_cast<const uint16_t*>(x) + e));
}

// E8M0 byte of a finite amax >= 0 by rule; emax = 8 (E4M3) or 2 (E2M1). Mirrors scale_rule.h.
template <QuantRule R, bool kFp4>
__device__ __forceinline__ uint32_t mx_scale(float amax) {
  constexpr int kEmax = kFp4 ? 2 : 8;
  const uint32_t bits = __float_as_uint(amax);
  const int e = static_cast<int>(bits >> 23);
  const uint32_t man = bits & 0x7FFFFFu;
  if constexpr (R == QuantRule::kCeil) return quant::mxfp8_ceil_scale(amax);  // note: MXFP8 only
  int b = 0;
  if constexpr (R == QuantRule::kOcp) b = e == 0 ? 0 : e - kEmax;
  // note: the floor reference clamps amax to FLT_MIN (e = 1) before its log2
  if constexpr (R == QuantRule::kFloor) b = e == 0 ? 1 : e;
  if constexpr (R == QuantRule::kCt) b = e == 0 ? 0 : e + (man >= 0x600000u ? 1 : 0) - kEmax;
  return static_cast<uint32_t>(b < 0 ? 0 : (b > 254 ? 254 : b));
}

template <QuantSrc S, QuantRule R, bool kFp4>
__global__ void __launch_bounds__(kThreads)
    quantize_mx_src_kernel(const void* __restrict__ x, int64_t blocks, uint8_t* __restrict__ values,
                           uint8_t* __restrict__ scales, unsigned long long* bad_block) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= blocks) return;
  float v[32];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float part[8];
    load8<S>(x, i * 32 + 8 * q, part);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[8 * q + j] = part[j];
  }
  float amax = 0.0f;
  bool finite = true;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    finite = finite && quant::is_finite_f32(v[j]);
    amax = fmaxf(amax, fabsf(v[j]));
  }
  if (!finite) atomicMin(bad_block, static_cast<unsigned long long>(i));
  const uint32_t b = mx_scale<R, kFp4>(amax);
  const float mul = quant::exp2_int(127 - static_cast<int>(b));
  if constexpr (kFp4) {
    uint32_t out[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 32; ++j)
      out[j / 8] |= quant::f32_to_e2m1(__fmul_rn(v[j], mul), v[j]) << (4 * (j % 8));
    *reinterpret_cast<uint4*>(values + i * 16) = make_uint4(out[0], out[1], out[2], out[3]);
  } else {
    // note: rule ct adds compressed-tensors' zero point (+0) to the rounded product, so a product that is
    // zero in f32 becomes +0 (0x00). __fmul_rn / __fadd_rn: nvcc's default --fmad=true would fuse
    // `v * mul + 0.0f` into one FMA, which keeps the sign of an underflowing product (issue 22).
    constexpr bool kZeroPoint = R == QuantRule::kCt;
    uint32_t out[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float p = __fmul_rn(v[j], mul);
      const float s = kZeroPoint ? __fadd_rn(p, 0.0f) : p;
      out[j / 4] |= quant::f32_to_e4m3(s) << (8 * (j % 4));
    }
    uint4* dst = reinterpret_cast<uint4*>(values + i * 32);
    dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
    dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
  }
  scales[i] = static_cast<uint8_t>(b);
}

constexpr int kTile = 128, kPasses = kTile / (kThreads / 16);

// kVec: cols % 8 == 0, so each thread's 8 columns are one aligned vector load.
template <QuantSrc S, bool kVec>
__global__ void __launch_bounds__(kThreads)
    quantize_b128_src_kernel(const void* __restrict__ x, int64_t rows, int64_t cols,
                             uint8_t* __restrict__ values, float* __restrict__ scales,
                             unsigned long long* bad_block) {
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tr = threadIdx.x / 16;
  const int64_t c = c0 + 8 * (threadIdx.x % 16);
  float v[kPasses][8];
  float amax = 0.0f;
  bool finite = true;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int64_t r = r0 + tr + 16 * p;
#pragma unroll
    for (int e = 0; e < 8; ++e) v[p][e] = 0.0f;
    if (r < rows) {
      if constexpr (kVec) {
        if (c < cols) load8<S>(x, r * cols + c, v[p]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (c + e < cols) v[p][e] = load1<S>(x, r * cols + c + e);
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      finite = finite && quant::is_finite_f32(v[p][e]);
      amax = fmaxf(amax, fabsf(v[p][e]));
    }
  }
  const float factor = quant::fp8_b128_tile_factor<kThreads>(amax, finite, cols, bad_block, scales);
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int64_t r = r0 + tr + 16 * p;
    if (r >= rows) continue;
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (c + e < cols)
        values[r * cols + c + e] = static_cast<uint8_t>(quant::f32_to_e4m3(__fmul_rn(v[p][e], factor)));
  }
}

template <QuantSrc S>
cudaError_t launch_for_src(QuantFormat f, QuantRule rule, const void* x, int64_t rows, int64_t cols,
                           uint8_t* values, void* scales, unsigned long long* bad, cudaStream_t stream) {
  if (f == QuantFormat::kFP8_B128) {
    const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                    static_cast<unsigned>((rows + kTile - 1) / kTile));
    auto* s = static_cast<float*>(scales);
    if (cols % 8 == 0)
      quantize_b128_src_kernel<S, true><<<grid, kThreads, 0, stream>>>(x, rows, cols, values, s, bad);
    else
      quantize_b128_src_kernel<S, false><<<grid, kThreads, 0, stream>>>(x, rows, cols, values, s, bad);
    return cudaGetLastError();
  }
  const int64_t blocks = rows * (cols / 32);
  const unsigned grid = static_cast<unsigned>((blocks + kThreads - 1) / kThreads);
  auto* s = static_cast<uint8_t*>(scales);
#define MXQ_QUANT_MX(RULE, FP4) \
  quantize_mx_src_kernel<S, RULE, FP4><<<grid, kThreads, 0, stream>>>(x, blocks, values, s, bad)
  if (f == QuantFormat::kMXFP4)
    MXQ_QUANT_MX(QuantRule::kCt, true);
  else if (rule == QuantRule::kCeil)
    MXQ_QUANT_MX(QuantRule::kCeil, false);
  else if (rule == QuantRule::kOcp)
    MXQ_QUANT_MX(QuantRule::kOcp, false);
  else if (rule == QuantRule::kFloor)
    MXQ_QUANT_MX(QuantRule::kFloor, false);
  else
    MXQ_QUANT_MX(QuantRule::kCt, false);
#undef MXQ_QUANT_MX
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_quantize_src(QuantFormat format, QuantRule rule, QuantSrc src, const void* x, int64_t rows,
                                int64_t cols, uint8_t* values, void* scales, unsigned long long* bad_block,
                                cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  switch (src) {
    case QuantSrc::kBF16:
      return launch_for_src<QuantSrc::kBF16>(format, rule, x, rows, cols, values, scales, bad_block, stream);
    case QuantSrc::kF16:
      return launch_for_src<QuantSrc::kF16>(format, rule, x, rows, cols, values, scales, bad_block, stream);
    case QuantSrc::kF32:
      break;
  }
  return launch_for_src<QuantSrc::kF32>(format, rule, x, rows, cols, values, scales, bad_block, stream);
}

}  // namespace mxq::cuda
