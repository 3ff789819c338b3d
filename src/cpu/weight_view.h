// How a CPU op sees one weight: its format, logical [rows, cols] = [N, K] and the two canonical planes.
// note: values are row-major [N, K] as stored (MXFP4: element 2j in bits 3:0 of byte j of a row);
// scales are E8M0 [N, K/32] for MX and f32 [cdiv(N,128), cdiv(K,128)] for FP8-B128. Neither plane needs
// any alignment: they may point straight into an mmapped checkpoint.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/error.h"
#include "format/formats.h"

namespace mxq {

struct WeightView {
  Format format;
  int64_t rows, cols;
  const uint8_t* values;
  const uint8_t* scales;  // nullptr for formats without a scale plane
};

// Whether the CPU backend reads this format as a weight (linear) at all.
bool cpu_linear_supports(Format f);

// Refuses, naming `what`, a view the CPU ops cannot read: unsupported format, negative shape, K not a
// multiple of 32 for MX formats, or a missing plane.
Status check_weight_view(const WeightView& w, std::string_view what);

}  // namespace mxq
