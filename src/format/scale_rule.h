// E8M0 scale-byte math for MX blocks, from the f32 bits of the block amax (inline: the quantizer calls it
// once per 32 elements). Public names live in quantize.h.
#pragma once

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cstdint>

#include "format/element_encode.h"
#include "format/quantize.h"

namespace mxq::detail {

// Element format of an MX block: emax = floor(log2(elem_max)).
struct MxElement {
  int emax;
  float elem_max;
};
inline constexpr MxElement kMxE4M3{8, 448.0f};
inline constexpr MxElement kMxE2M1{2, 6.0f};

// `amax_bits`: f32 bits of a finite amax >= 0. e = biased f32 exponent (0 for zero and subnormals),
// so for a normal amax = m·2^k, e = k + 127 and floor(log2 amax) + 127 = e.
inline uint8_t mx_scale_from_bits(ScaleRule rule, MxElement el, uint32_t amax_bits) {
  const int e = static_cast<int>(amax_bits >> 23);
  const uint32_t man = amax_bits & 0x7FFFFFu;
  int b = 0;
  switch (rule) {
    case ScaleRule::kCeil: {
      // note: ceil(log2 q) + 127 is q's E8M0 round-up; q <= 2^-127 gives 0, as the clamp to 0 would.
      const float q = std::max(std::bit_cast<float>(amax_bits), FLT_MIN) / el.elem_max;
      b = encode_e8m0_ceil(std::bit_cast<uint32_t>(q));
      break;
    }
    case ScaleRule::kOcp:
      b = e == 0 ? 0 : e - el.emax;
      break;
    case ScaleRule::kFloor:
      b = e == 0 ? 1 : e;  // note: the reference clamps amax to FLT_MIN (e = 1) before its log2
      break;
    case ScaleRule::kCt:
      // note: m >= 1.75 <=> the top two mantissa bits are set (compressed-tensors adds 1 << (mant-2) to the
      // bit pattern and masks the mantissa off). Subnormal amax rounds to 0 or 2^-126: both clamp to 0.
      b = e == 0 ? 0 : e + (man >= 0x600000u) - el.emax;
      break;
  }
  return static_cast<uint8_t>(std::clamp(b, 0, 254));
}

// 2^(127-b) as f32 for every byte b < 255: the exact multiplier that maps a block onto its elements.
// note: b = 254 gives 2^-127, an f32 subnormal, still exact; b = 255 (NaN) is never produced.
inline float mx_inv_scale(uint8_t b) {
  return b == 254 ? std::bit_cast<float>(0x00400000u)
                  : std::bit_cast<float>(static_cast<uint32_t>(254 - b) << 23);
}

}  // namespace mxq::detail
