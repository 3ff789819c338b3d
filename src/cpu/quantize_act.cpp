#include "cpu/quantize_act.h"

#include <cstring>
#include <string>

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

}  // namespace mxq
