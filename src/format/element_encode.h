// Branch-free f32 -> element encoders shared by the scalar codecs (codec.cpp) and the block quantizers
// (quantize.cpp), so the exhaustive codec tests pin the exact code the quantizer loops run. Every step is
// integer bit arithmetic or one exactly-rounded f32 add, so a loop over a block vectorizes (selects, no
// branches) and no value is rounded twice (N-09).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace mxq::detail {

inline constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu;
inline constexpr uint32_t kF32InfBits = 0x7F800000u;

// cond ? a : b as a bit blend: a ternary here becomes control flow that GCC's -O2 vectorizer rejects.
inline uint32_t select(bool cond, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(cond);
  return (a & mask) | (b & ~mask);
}

// Shared RNE on the normal range of a small float format: drop `shift` mantissa bits of |x| with round to
// nearest even and move the exponent from bias 127 to `bias`. Exponent carries fall out of the integer add.
template <int kShift, int kBias>
inline uint32_t round_normal(uint32_t abs_bits) {
  const uint32_t lsb = (abs_bits >> kShift) & 1u;
  return (abs_bits - (static_cast<uint32_t>(127 - kBias) << 23) + ((1u << (kShift - 1)) - 1u) + lsb) >>
         kShift;
}

// note: subnormals by one f32 add: |x| + C, with ulp(C) equal to the target's subnormal step, rounds |x| to
// that step with the FPU's own RNE (exact single rounding, also for f32 denormals). bits(sum) - bits(C) is
// then the code, and it runs on into the first normal code (8 for E4M3, 4 for E5M2, 0x400 for F16).
template <uint32_t kMagicBits>
inline uint32_t round_subnormal(uint32_t abs_bits) {
  const float sum = std::bit_cast<float>(abs_bits) + std::bit_cast<float>(kMagicBits);
  return std::bit_cast<uint32_t>(sum) - kMagicBits;
}

// E4M3 (float8_e4m3fn): RNE, saturating to +-448 (inf too), NaN -> 0x7F|sign, sign of zero kept.
inline uint8_t encode_e4m3(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x), a = bits & kF32AbsMask;
  const uint32_t sign = (bits >> 24) & 0x80u;
  // note: 0x3C800000 = 2^-6, the smallest normal E4M3; 0x46800000 = 2^14, whose ulp is 2^-9.
  const uint32_t normal =
      std::min(round_normal<20, 7>(a), 0x7Eu);  // note: 0x7E = 448; past the 464 tie saturates
  const uint32_t sub = round_subnormal<0x46800000u>(a);
  return static_cast<uint8_t>(select(a < 0x3C800000u, sub, select(a > kF32InfBits, 0x7Fu, normal)) | sign);
}

// E5M2: RNE, saturating to +-57344 (inf too), NaN -> 0x7F|sign.
inline uint8_t encode_e5m2(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x), a = bits & kF32AbsMask;
  const uint32_t sign = (bits >> 24) & 0x80u;
  // note: 0x38800000 = 2^-14, the smallest normal E5M2; 0x43000000 = 2^7, whose ulp is 2^-16.
  const uint32_t normal = std::min(round_normal<21, 15>(a), 0x7Bu);  // note: 0x7B = 57344
  const uint32_t sub = round_subnormal<0x43000000u>(a);
  return static_cast<uint8_t>(select(a < 0x38800000u, sub, select(a > kF32InfBits, 0x7Fu, normal)) | sign);
}

// E2M1 magnitude code 0..7 of |x| (already scaled), RNE with ties to the even code, saturating at 6.
// note: the thresholds are the midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5; `>` where the lower code is
// even (it wins the tie), `>=` where the upper one is.
inline uint8_t encode_e2m1_magnitude(float a) {
  return static_cast<uint8_t>((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                              (a >= 3.5f) + (a > 5.0f));
}

// E2M1 code of `scaled`, the sign taken from `sign_src`: strictly negative -> bit 3 (so a negative value
// that rounds to zero is code 8, -0.0 is code 0). The quantizer passes the unscaled input as `sign_src`, so
// an element that underflows to -0 while scaling still counts as negative.
inline uint8_t encode_e2m1_signed(float scaled, float sign_src) {
  const float a = std::bit_cast<float>(std::bit_cast<uint32_t>(scaled) & kF32AbsMask);
  return static_cast<uint8_t>(encode_e2m1_magnitude(a) | ((sign_src < 0.0f) << 3));
}

// E8M0 round-up of |x| from its bits: the biased exponent, +1 when any mantissa bit is set, saturating at
// 254. note: for an f32 subnormal, anything above 2^-127 (mantissa 0x400000) rounds up to 2^-126 (b = 1).
inline uint8_t encode_e8m0_ceil(uint32_t abs_bits) {
  if (abs_bits > kF32InfBits) return 0xFF;
  const uint32_t e = abs_bits >> 23, man = abs_bits & 0x7FFFFFu;
  const uint32_t b = e != 0 ? e + (man != 0) : (man > 0x400000u);
  return static_cast<uint8_t>(b > 254u ? 254u : b);
}

}  // namespace mxq::detail
