// Helpers shared by the prepare_*.cpp routines (not part of the layout module's interface).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "layout/layout.h"
#include "layout/probe.h"

namespace mxq {

// Planes sized as the geometry says.
Status check_planes(std::string_view layout, const TensorGeometry& g, const HostPlanes& in);
// E8M0 1x32 scales (MXFP8 / MXFP4).
Status check_mx(std::string_view layout, const TensorGeometry& g);

// 128x4 swizzle of every expert's [N, K/32] scales, experts concatenated; native row j of an expert takes
// canonical row src_row[j] (identity when src_row is empty). Pads are zero.
std::vector<uint8_t> swizzle_scales(const TensorGeometry& g, std::span<const uint8_t> scales,
                                    std::span<const int64_t> src_row);

}  // namespace mxq
