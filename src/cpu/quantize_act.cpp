#include "cpu/quantize_act.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "format/codec.h"
#include "format/formats.h"
#include "format/quantize.h"

namespace mxq {

Status quantize_act_fp8_b128(const uint16_t* x, int64_t m, int64_t k, uint8_t* values, float* scales) {
  if (m < 0 || k < 0) return fail("quantize_act_fp8_b128: shape [{}, {}] (expected non-negative)", m, k);
  const int64_t blocks = cdiv(k, 128);
  // note: one row is a [1, k] FP8-B128 tensor: its 128x128 blocks are the 1x128 blocks of the row, so the
  // weight quantizer's exact rule (and its NaN refusal) applies unchanged.
  for (int64_t r = 0; r < m; ++r) {
    const std::string name = "activation row " + std::to_string(r);
    if (Status st = quantize(Format::kFP8_B128, ScaleRule::kCeil, Format::kBF16, x + r * k, 1, k,
                             values + r * k, reinterpret_cast<uint8_t*>(scales + r * blocks), name);
        !st)
      return st;
  }
  return {};
}

Status fake_quant_mxfp8(const uint16_t* x, int64_t m, int64_t k, uint16_t* y) {
  if (m < 0 || k < 0 || k % 32 != 0)
    return fail("fake_quant_mxfp8: shape [{}, {}] (expected non-negative, k a multiple of 32)", m, k);
  uint8_t values[32], scale = 0;
  float deq[32];
  for (int64_t i = 0; i < m * (k / 32); ++i) {
    const uint16_t* xb = x + i * 32;
    bool finite = true;
    for (int e = 0; e < 32; ++e) finite = finite && std::isfinite(bf16_to_f32(xb[e]));
    if (finite) {
      // note: one block is a [1, 32] MX tensor: the weight quantizer's rule and bytes apply unchanged.
      if (Status st = quantize(Format::kMXFP8, ScaleRule::kCeil, Format::kBF16, xb, 1, 32, values, &scale,
                               "activation block");
          !st)
        return st;
      dequantize(Format::kMXFP8, values, &scale, 1, 32, deq);
    } else {
      std::fill(deq, deq + 32, std::numeric_limits<float>::quiet_NaN());
    }
    for (int e = 0; e < 32; ++e) y[i * 32 + e] = f32_to_bf16(deq[e]);
  }
  return {};
}

}  // namespace mxq
