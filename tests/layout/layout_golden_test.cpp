// Learned layouts against native-position maps computed by torch re-typings of vLLM / FlashInfer
// (tests/golden/make_layout_golden.py), bitwise, including where sparse delta bytes land.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "layout/prepare.h"
#include "layout_test_util.h"

namespace mxq {
namespace {

using testing::load_native_map;
using testing::native_map;

struct GoldenCase {
  const char* golden;  // tests/golden/layout/<golden>_<plane>.npy
  const char* layout;
  Format format;
  std::vector<int64_t> shape;
  bool values_move;  // false: the values plane must come out identity (no golden file)
};
void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.golden << " (" << c.layout << ")"; }

const GoldenCase kGoldenCases[] = {
    {"swizzle_mxfp8_200x320", "scale_swizzle_128x4", Format::kMXFP8, {200, 320}, false},
    {"swizzle_mxfp8_2x130x96", "scale_swizzle_128x4", Format::kMXFP8, {2, 130, 96}, false},
    {"swizzle_mxfp4_1x32", "scale_swizzle_128x4", Format::kMXFP4, {1, 32}, false},
    {"mn_major_b128_520x390", "scales_mn_major", Format::kFP8_B128, {520, 390}, false},
    {"mn_major_b128_2x300x260", "scales_mn_major", Format::kFP8_B128, {2, 300, 260}, false},
    {"trtllm_w13_mxfp8_2x128x128", "trtllm_moe_w13", Format::kMXFP8, {2, 128, 128}, true},
    {"trtllm_w13_mxfp4_1x256x128", "trtllm_moe_w13", Format::kMXFP4, {1, 256, 128}, true},
    {"trtllm_w2_mxfp8_1x128x128", "trtllm_moe_w2", Format::kMXFP8, {1, 128, 128}, true},
    {"marlin_mxfp8_64x64", "marlin", Format::kMXFP8, {64, 64}, true},
    {"marlin_mxfp8_128x96", "marlin", Format::kMXFP8, {128, 96}, true},
    {"marlin_mxfp8_64x32", "marlin", Format::kMXFP8, {64, 32}, true},
    {"marlin_mxfp8_2x64x64", "marlin", Format::kMXFP8, {2, 64, 64}, true},
};

class LayoutGolden : public ::testing::TestWithParam<GoldenCase> {};

void expect_map_equal(const std::vector<int64_t>& want, const std::vector<int64_t>& got, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what << ": native bytes";
  int bad = 0;
  for (size_t q = 0; q < want.size(); ++q)
    if (got[q] != want[q] && ++bad <= 5)
      ADD_FAILURE() << what << ": native byte " << q << " holds canonical " << got[q] << ", oracle "
                    << want[q];
  EXPECT_EQ(bad, 0) << what;
}

// The layout probed from mxq's prepare routine equals the oracle's native map byte for byte (pads included).
TEST_P(LayoutGolden, ProbedLayoutMatchesOracle) {
  const GoldenCase& c = GetParam();
  auto layout = probe_builtin("golden", c.layout, c.format, c.shape);
  ASSERT_TRUE(layout) << layout.error().message;
  if (c.values_move) {
    EXPECT_EQ(layout->values.kind, PlaneKind::kSeparable);
    expect_map_equal(load_native_map(std::string(c.golden) + "_values"), native_map(layout->values),
                     "values");
  } else {
    EXPECT_EQ(layout->values.kind, PlaneKind::kIdentity);
  }
  EXPECT_EQ(layout->scales.kind, PlaneKind::kSeparable);
  expect_map_equal(load_native_map(std::string(c.golden) + "_scales"), native_map(layout->scales), "scales");
}

// covers N-14: a sparse delta in canonical coordinates (every 7th scale byte and every 11th value byte)
// lands exactly where the oracle says those canonical bytes live, nothing else changes, and gather reads
// the new bytes back.
TEST_P(LayoutGolden, DeltaTargetsOraclePositions) {
  const GoldenCase& c = GetParam();
  auto layout = probe_builtin("golden", c.layout, c.format, c.shape);
  ASSERT_TRUE(layout) << layout.error().message;
  for (Plane p : {Plane::kValues, Plane::kScales}) {
    if (p == Plane::kValues && !c.values_move) continue;
    const PlaneLayout& l = layout->plane(p);
    const std::vector<int64_t> oracle =
        load_native_map(std::string(c.golden) + "_" + std::string(plane_name(p)));
    ASSERT_EQ(static_cast<int64_t>(oracle.size()), l.native_bytes);
    std::vector<int64_t> canonical_at(static_cast<size_t>(l.canonical.bytes()), -1);
    for (size_t q = 0; q < oracle.size(); ++q)
      if (oracle[q] >= 0) canonical_at[oracle[q]] = static_cast<int64_t>(q);
    std::vector<uint8_t> native(static_cast<size_t>(l.native_bytes), 0);
    const int64_t stride = p == Plane::kValues ? 11 : 7;
    std::vector<int64_t> indices;
    std::vector<uint8_t> bytes;
    for (int64_t i = 3; i < l.canonical.bytes(); i += stride) {
      indices.push_back(i);
      bytes.push_back(static_cast<uint8_t>(1 + i % 255));
    }
    ASSERT_TRUE(scatter(l, indices, bytes, native));
    std::vector<uint8_t> want(native.size(), 0);
    for (size_t j = 0; j < indices.size(); ++j) want[canonical_at[indices[j]]] = bytes[j];
    EXPECT_EQ(native, want) << plane_name(p);
    std::vector<uint8_t> back(bytes.size());
    ASSERT_TRUE(gather(l, indices, native, back));
    EXPECT_EQ(back, bytes) << plane_name(p);
  }
}

INSTANTIATE_TEST_SUITE_P(Oracle, LayoutGolden, ::testing::ValuesIn(kGoldenCases),
                         [](const auto& info) { return std::string(info.param.golden); });

}  // namespace
}  // namespace mxq
