#include "format/formats.h"

#include <gtest/gtest.h>

namespace mxq {
namespace {

TEST(Formats, PlaneSizes) {
  EXPECT_EQ(values_bytes(Format::kMXFP4, 3, 64), 3 * 32);
  EXPECT_EQ(scales_bytes(Format::kMXFP8, 3, 64), 3 * 2);
  EXPECT_EQ(scales_bytes(Format::kFP8_B128, 129, 300), 2 * 3 * 4);  // short final blocks are legal
  EXPECT_FALSE(is_quantized(Format::kBF16));
}

}  // namespace
}  // namespace mxq
