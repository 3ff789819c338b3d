// Scalar f32 -> element encoders. E4M3 / E5M2 / E2M1 are the exact functions the block quantizers inline
// (element_encode.h); BF16 / F16 follow the same integer-RNE scheme.
#include "format/codec.h"

#include "format/element_encode.h"

namespace mxq {

uint16_t f32_to_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & detail::kF32AbsMask) > detail::kF32InfBits)
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // note: force the quiet bit so NaN stays NaN
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7FFFu + lsb) >> 16);  // overflow carries into inf, as RNE must
}

uint16_t f32_to_f16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x), a = bits & detail::kF32AbsMask;
  const uint32_t sign = (bits >> 16) & 0x8000u;
  if (a > detail::kF32InfBits) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  // note: 0x38800000 = 2^-14, the smallest normal f16; 0x3F000000 = 0.5, whose ulp is 2^-24.
  uint32_t code = a < 0x38800000u ? detail::round_subnormal<0x3F000000u>(a) : detail::round_normal<13, 15>(a);
  code = code > 0x7C00u ? 0x7C00u : code;  // note: RNE already carries 65520 and up into 0x7C00 (inf)
  return static_cast<uint16_t>(sign | code);
}

uint8_t f32_to_e4m3(float x) { return detail::encode_e4m3(x); }
uint8_t f32_to_e5m2(float x) { return detail::encode_e5m2(x); }
uint8_t f32_to_e2m1(float x) { return detail::encode_e2m1_signed(x, x); }
uint8_t f32_to_e8m0(float x) {
  return detail::encode_e8m0_ceil(std::bit_cast<uint32_t>(x) & detail::kF32AbsMask);
}

}  // namespace mxq
