// Scalar element codecs (E4M3, E5M2, E2M1, E8M0, BF16, F16). Decoders are exact and table-free here;
// encoders (codec.cpp) round to nearest, ties to even, as spec/formats.md pins them.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace mxq {

// ---- decoders ------------------------------------------------------------------------------------------
inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (man << 13));  // inf / nan
  if (exp == 0) return (sign ? -1.0f : 1.0f) * std::ldexp(static_cast<float>(man), -24);
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

// float8_e4m3fn: bias 7, no inf, 0x7F / 0xFF are NaN, max 448, min subnormal 2^-9.
inline float e4m3_to_f32(uint8_t c) {
  const float sign = (c & 0x80) ? -1.0f : 1.0f;
  const int exp = (c >> 3) & 0xF, man = c & 0x7;
  if (exp == 0xF && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -9);
  return sign * std::ldexp(static_cast<float>(8 + man), exp - 10);
}

// float8_e5m2: bias 15, IEEE-like (inf = 0x7C, NaN = 0x7D..0x7F).
inline float e5m2_to_f32(uint8_t c) {
  const float sign = (c & 0x80) ? -1.0f : 1.0f;
  const int exp = (c >> 2) & 0x1F, man = c & 0x3;
  if (exp == 0x1F) return man ? std::numeric_limits<float>::quiet_NaN() : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -16);
  return sign * std::ldexp(static_cast<float>(4 + man), exp - 17);
}

// E2M1 (fp4): code in bits 3:0, bit 3 = sign, magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}.
inline constexpr float kE2M1Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
inline float e2m1_to_f32(uint8_t code) {
  const float v = kE2M1Values[code & 0x7];
  return (code & 0x8) ? -v : v;
}

// E8M0 scale: 2^(b-127); 255 is NaN; 0 is 2^-127 (no zero).
inline float e8m0_to_f32(uint8_t b) {
  if (b == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  if (b == 0) return std::bit_cast<float>(0x00400000u);  // 2^-127 is an f32 subnormal
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 23);
}

// ---- encoders (codec.cpp) ------------------------------------------------------------------------------
uint16_t f32_to_bf16(float x);  // RNE; NaN stays NaN
uint16_t f32_to_f16(float x);   // RNE; overflow -> inf
uint8_t f32_to_e4m3(float x);   // RNE, saturating to +-448; NaN -> 0x7F (0xFF if sign set); -0 -> 0x80
uint8_t f32_to_e5m2(float x);   // RNE, saturating to +-57344; NaN -> 0x7F/0xFF
uint8_t f32_to_e2m1(float x);   // RNE to code (ties to even code), saturating at +-6; -0-rounding -> code 8
                                // except an input of exactly +-0 -> code 0 (compressed-tensors)
// E8M0 by rounding |x| up to a power of two (TransformerEngine float_to_e8m0, cvt.rp.satfinite.ue8m0):
// 0 -> 0x00, values <= 2^-127 -> 0x00, saturating at 0xFE (+-inf too), NaN -> 0xFF; the sign is ignored.
uint8_t f32_to_e8m0(float x);

}  // namespace mxq
