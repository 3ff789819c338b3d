// Device element and scale encoders for the quantize kernels, bit-exact with spec/formats.md: RNE, ties to
// even, saturating; scale bytes from exponent and mantissa bits (never a floating-point log2).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace mxq::cuda::quant {

// f32 → E4M3 (float8_e4m3fn) byte: RNE, saturating to ±448, sign of zero kept; input is never NaN.
__device__ __forceinline__ uint32_t f32_to_e4m3(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(v));
  return r & 0xFFu;
#else
  const uint32_t sign = (__float_as_uint(v) >> 24) & 0x80u;
  const float a = fabsf(v);
  uint32_t code;
  if (a >= 448.0f) {
    code = 0x7E;
  } else if (a < 0.015625f) {  // note: below 2^-6 the codes are multiples of 2^-9 (subnormals, up to 0x08)
    code = static_cast<uint32_t>(__float2int_rn(a * 512.0f));
  } else {  // note: round the f32 mantissa to 3 bits (RNE), then rebias the exponent 127 → 7
    uint32_t ua = __float_as_uint(a);
    ua += 0x7FFFFu + ((ua >> 20) & 1u);
    code = (ua >> 20) - (120u << 3);
  }
  return sign | code;
#endif
}

// f32 → E2M1 code: RNE to the nearest code, ties to the even code (= even mantissa bit), saturating at ±6.
// The sign comes from `sign_src`, the unscaled input: strictly negative → bit 3 (a negative value that
// rounds or underflows to zero is code 8; -0.0 is code 0, as compressed-tensors gives).
__device__ __forceinline__ uint32_t f32_to_e2m1(float v, float sign_src) {
  const float a = fabsf(v);
  // Below 1 the codes are 0, 0.5, 1 (codes 0..2): round 2a to an integer, RNE, by adding 2^23 in f32.
  const uint32_t low = __float_as_uint(fmaf(a, 2.0f, 8388608.0f)) - 0x4B000000u;
  // From 1 up: round the f32 mantissa to 1 bit (RNE); (exponent, bit) - (126, 0) is the code; saturate at 7.
  uint32_t u = __float_as_uint(a);
  u += 0x1FFFFFu + ((u >> 22) & 1u);
  const uint32_t high = min((u >> 22) - (126u << 1), 7u);
  const uint32_t code = a < 1.0f ? low : high;
  return sign_src < 0.0f ? code | 8u : code;
}

// Two f32 → two E4M3 bytes (lo in bits 7:0, hi in bits 15:8), each as f32_to_e4m3: one cvt on sm_89+.
__device__ __forceinline__ uint32_t f32x2_to_e4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;"
      : "=h"(r)
      : "f"(hi), "f"(lo));  // note: first source → bits 15:8
  return r;
#else
  return f32_to_e4m3(lo) | f32_to_e4m3(hi) << 8;
#endif
}

// Lane-wise bf16x2 a·b + c, one rounding (RNE); subnormals kept.
__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

__device__ __forceinline__ uint32_t min_u16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t d;
  asm("min.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return __vminu2(a, b);
#endif
}

__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return __vmaxu2(a, b);
#endif
}

// The largest |x| bit pattern among 8 bf16 (4 words): |x| patterns order as the magnitudes do, and Inf / NaN
// are the largest, so the result is >= 0x7F80 exactly when one of them is not finite.
__device__ __forceinline__ uint32_t amax_bits8(const uint32_t (&w)[4]) {
  uint32_t m = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) m = max_u16x2(m, w[e] & 0x7FFF7FFFu);
  return max(m & 0xFFFFu, m >> 16);
}

// 2^e for e in [-127, 127] as f32 (2^-127 is subnormal).
__device__ __forceinline__ float exp2_int(int e) {
  return e == -127 ? __uint_as_float(0x00400000u) : __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
}

// f32 bits as (k, mantissa) with value = 1.mantissa · 2^k, subnormals normalised; x must be > 0.
__device__ __forceinline__ void split_f32(float x, int& k, uint32_t& mant) {
  const uint32_t u = __float_as_uint(x);
  const uint32_t field = u >> 23;
  if (field != 0) {
    k = static_cast<int>(field) - 127;
    mant = u & 0x7FFFFFu;
  } else {
    const int lead = 31 - __clz(u);  // note: subnormal: value = u · 2^-149
    k = lead - 149;
    mant = (u << (23 - lead)) & 0x7FFFFFu;
  }
}

// MXFP8 rule `ceil`: b = clamp(ceil(log2(max(amax, FLT_MIN) / 448)) + 127, 0, 254).
__device__ __forceinline__ uint32_t mxfp8_ceil_scale(float amax) {
  const float q = __fdiv_rn(fmaxf(amax, 1.17549435e-38f), 448.0f);  // note: IEEE division, as the CPU
  int k;
  uint32_t mant;
  split_f32(q, k, mant);
  const int b = k + (mant != 0 ? 1 : 0) + 127;
  return static_cast<uint32_t>(b < 0 ? 0 : (b > 254 ? 254 : b));
}

// MXFP4 rule `ct`: amax = m·2^k, b = clamp(127 + k - 2 + [m >= 1.75], 0, 254); amax = 0 → 0.
__device__ __forceinline__ uint32_t mxfp4_ct_scale(float amax) {
  if (amax == 0.0f) return 0;
  int k;
  uint32_t mant;
  split_f32(amax, k, mant);
  const int b = 127 + k - 2 + (mant >= 0x600000u ? 1 : 0);  // note: 0x600000 = mantissa of 1.75
  return static_cast<uint32_t>(b < 0 ? 0 : (b > 254 ? 254 : b));
}

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t h) { return __uint_as_float(h << 16); }

__device__ __forceinline__ bool is_finite_f32(float v) {
  return (__float_as_uint(v) & 0x7F800000u) != 0x7F800000u;
}

// MX kernels: loads 1x32 block i of bf16 (64 B) into 16 words and returns its amax; flags a NaN/Inf block.
__device__ __forceinline__ float load_mx_block(const uint16_t* x, int64_t i, uint32_t (&w)[16],
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
    const float lo = bf16_bits_to_f32(w[j] & 0xFFFFu), hi = bf16_bits_to_f32(w[j] >> 16);
    finite = finite && is_finite_f32(lo) && is_finite_f32(hi);
    amax = fmaxf(amax, fmaxf(fabsf(lo), fabsf(hi)));
  }
  if (!finite) atomicMin(bad_block, static_cast<unsigned long long>(i));
  return amax;
}

// FP8-B128 multiplier of a block with amax' = amax_c: m = fl(fl(1 / amax') * 448), the reference's
// `x * (448.0 / amax)` as torch evaluates it (reciprocal, then times 448; formats.md). Not fl(448 / amax'),
// which is one ulp off for some amax and then moves products on E4M3 ties (issue 22).
// note: the _rn intrinsics are exactly rounded and never fused or approximated (--use_fast_math, --fmad).
__device__ __forceinline__ float fp8_b128_factor(float amax_c) {
  return __fmul_rn(__frcp_rn(amax_c), 448.0f);
}

// The FP8-B128 tile epilogue shared by quantize_fp8_b128.cu (bf16) and quantize_src.cu (f16 / f32): the
// thread's amax and finiteness are combined over the block (kThreads threads, one 128x128 tile: tile
// (tile_row, tile_col) of the scales plane), the first tile with a non-finite input is recorded in bad_block,
// thread 0 writes the tile's f32 scale, and every thread gets the factor m = fl(fl(1 / amax') * 448) its
// values are multiplied by (fp8_b128_factor). parity (0 / 1) picks one of two shared buffers: a CTA that
// loops over tiles alternates it, so a fast warp's next tile never overwrites a buffer a slow warp still
// reads (the barrier between is the next call's).
template <int kThreads>
__device__ __forceinline__ float fp8_b128_tile_factor(float amax, bool finite, int64_t cols, int64_t tile_row,
                                                      int64_t tile_col, int parity,
                                                      unsigned long long* bad_block, float* scales) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  __shared__ float warp_max[2][kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[parity][threadIdx.x / 32] = amax;
  const int any_bad = __syncthreads_or(!finite);
  amax = warp_max[parity][0];
#pragma unroll
  for (int i = 1; i < kThreads / 32; ++i) amax = fmaxf(amax, warp_max[parity][i]);
  const int64_t scale_cols = (cols + 127) / 128;
  const int64_t block_index = tile_row * scale_cols + tile_col;
  if (any_bad && threadIdx.x == 0) atomicMin(bad_block, static_cast<unsigned long long>(block_index));
  const float amax_c = fmaxf(amax, 1e-4f);  // note: 1e-4 floor as DeepSeek's reference quantizer
  if (threadIdx.x == 0) scales[block_index] = __fdiv_rn(amax_c, 448.0f);
  return fp8_b128_factor(amax_c);
}

// One tile per CTA: the tile is (blockIdx.y, blockIdx.x).
template <int kThreads>
__device__ __forceinline__ float fp8_b128_tile_factor(float amax, bool finite, int64_t cols,
                                                      unsigned long long* bad_block, float* scales) {
  return fp8_b128_tile_factor<kThreads>(amax, finite, cols, blockIdx.y, blockIdx.x, 0, bad_block, scales);
}

// The four-threads-a-block MX quantizers (quantize_mxfp8.cu, quantize_mxfp4.cu): part j of a CTA is thread
// index g = base + j·kThreads, 8 elements of block g / 4; all kUnroll 16-byte loads are issued before the
// first use, zeros for threads past the last block (they must stay: their block's four threads shuffle with
// the whole warp).
template <int kThreads, int kUnroll>
__device__ __forceinline__ void load_block_parts(const uint16_t* __restrict__ x, int64_t base, int64_t blocks,
                                                 uint4 (&r)[kUnroll]) {
#pragma unroll
  for (int j = 0; j < kUnroll; ++j) {
    const int64_t g = base + j * kThreads;
    r[j] = (g >> 2) < blocks ? __ldg(reinterpret_cast<const uint4*>(x) + g) : make_uint4(0, 0, 0, 0);
  }
}

// The block's amax pattern from its four threads' (lanes 4k..4k+3 of the warp), in every one of them.
__device__ __forceinline__ uint32_t block_amax4(uint32_t m) {
  m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
  return max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 2));
}

// 2^(127 - b) (b an E8M0 scale) as a bf16 pair, for fma_bf16x2 scaling.
__device__ __forceinline__ uint32_t scale_factor_bf16x2(uint32_t b) {
  const uint32_t f = __float_as_uint(exp2_int(127 - static_cast<int>(b))) >> 16;
  return f | f << 16;
}

// MXFP8 elements: 4 bf16 pairs w scaled by f2 = scale_factor_bf16x2(b) → 4 E4M3 pairs (bits 15:0 of p[e]).
// The scaling is one fma.rn.bf16x2 per pair, exact (quantize_mxfp8.cu), then one cvt per pair.
__device__ __forceinline__ void mxfp8_encode8(const uint32_t (&w)[4], uint32_t f2, uint32_t (&p)[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const uint32_t t = fma_bf16x2(w[e], f2, 0x80008000u);  // note: + (-0) keeps the sign of zero
    p[e] = f32x2_to_e4m3x2(__uint_as_float(t << 16), __uint_as_float(t & 0xFFFF0000u));
  }
}

}  // namespace mxq::cuda::quant
