// Dequantizes a segment of one weight row into f32 — the inner step of linear and embedding.
#pragma once

#include <cstdint>

#include "cpu/weight_view.h"

namespace mxq {

// out[0, len) = W[row, k0 : k0 + len) as f32 (element · scale). The view must have passed
// check_weight_view; k0 must be a multiple of 32 (so a segment never starts inside a scale block).
// note: whole 32-element blocks go through AVX2 lookup tables; a ragged tail (plain formats and FP8-B128
// only, MX has K % 32 == 0) is decoded element by element with the codec.h decoders.
void dequantize_row(const WeightView& w, int64_t row, int64_t k0, int64_t len, float* out);

}  // namespace mxq
