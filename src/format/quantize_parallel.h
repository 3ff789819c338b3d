// Quantizes a [batch..., rows, cols] tensor on several threads. quantize() itself is single-threaded; rows are
// split in stripes (128-row stripes for FP8-B128 so no block straddles two threads), and each leading batch
// index (stacked MoE experts) is its own matrix, so FP8-B128 blocks never straddle two experts.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "format/quantize.h"

namespace mxq {

struct QuantizedPlanes {
  std::vector<uint8_t> values;
  std::vector<uint8_t> scales;
  std::vector<int64_t> values_shape;  // [batch..., rows, cols * bits / 8]
  std::vector<int64_t> scales_shape;  // [batch..., scale rows, scale cols]
};

// `shape` is the logical shape (rank >= 2); `x` holds its elements in `src` (BF16, F16 or F32).
Result<QuantizedPlanes> quantize_tensor(Format fmt, ScaleRule rule, Format src, std::span<const uint8_t> x,
                                        const std::vector<int64_t>& shape, std::string_view name, int threads);

}  // namespace mxq
