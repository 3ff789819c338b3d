// Every built-in layout, probed on ragged and stacked shapes: canonical → native → canonical is the
// identity bitwise, pads come out zero, the learned layout reproduces the prepare on fresh bytes, and
// sparse scatter/gather agrees with a full re-layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "layout/prepare.h"
#include "layout_test_util.h"

namespace mxq {
namespace {

using testing::native_map;
using testing::random_plane;

struct RoundTripCase {
  const char* layout;
  Format format;
  std::vector<int64_t> shape;
  PlaneKind values_kind, scales_kind;
};
void PrintTo(const RoundTripCase& c, std::ostream* os) {
  *os << c.layout << " " << traits(c.format).name << " [";
  for (size_t i = 0; i < c.shape.size(); ++i) *os << (i ? "," : "") << c.shape[i];
  *os << "]";
}

constexpr PlaneKind kId = PlaneKind::kIdentity, kSep = PlaneKind::kSeparable;
const RoundTripCase kRoundTripCases[] = {
    // the CPU backend reads canonical planes; a transposed view moves nothing, in every format
    {"row_major", Format::kMXFP8, {3, 64}, kId, kId},
    {"row_major", Format::kMXFP4, {2, 5, 96}, kId, kId},
    {"row_major", Format::kFP8_B128, {130, 300}, kId, kId},
    {"row_major", Format::kBF16, {7, 9}, kId, kId},
    {"transposed_view", Format::kMXFP8, {33, 160}, kId, kId},
    {"transposed_view", Format::kFP8_B128, {2, 129, 131}, kId, kId},
    // 128x4: rows padded to 128, scale columns to 4
    {"scale_swizzle_128x4", Format::kMXFP8, {1, 32}, kId, kSep},
    {"scale_swizzle_128x4", Format::kMXFP8, {257, 224}, kId, kSep},
    {"scale_swizzle_128x4", Format::kMXFP4, {3, 100, 160}, kId, kSep},
    // f32 block scales: 4-byte entries transposed whole
    {"scales_mn_major", Format::kFP8_B128, {130, 300}, kId, kSep},
    {"scales_mn_major", Format::kFP8_B128, {3, 256, 1000}, kId, kSep},
    {"trtllm_moe_w13", Format::kMXFP8, {3, 256, 256}, kSep, kSep},
    {"trtllm_moe_w13", Format::kMXFP4, {2, 128, 384}, kSep, kSep},
    {"trtllm_moe_w2", Format::kMXFP8, {2, 384, 128}, kSep, kSep},
    {"trtllm_moe_w2", Format::kMXFP4, {1, 128, 128}, kSep, kSep},
    {"marlin", Format::kMXFP8, {192, 160}, kSep, kSep},
    {"marlin", Format::kMXFP8, {3, 64, 32}, kSep, kSep},
};

class LayoutRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(LayoutRoundTrip, CanonicalNativeCanonicalIsIdentity) {
  const RoundTripCase& c = GetParam();
  auto g = tensor_geometry("w", c.format, c.shape);
  ASSERT_TRUE(g) << g.error().message;
  auto layout = probe_builtin("w", c.layout, c.format, c.shape);
  ASSERT_TRUE(layout) << layout.error().message;
  EXPECT_EQ(layout->name, c.layout);
  EXPECT_EQ(layout->values.kind, c.values_kind);
  EXPECT_EQ(layout->scales.kind, c.scales_kind);

  const HostPlanes canonical{random_plane(g->values.bytes(), 11), random_plane(g->scales.bytes(), 12)};
  const PrepareRoutine prepare = [&] {
    for (const NamedPrepare& b : builtin_prepares())
      if (b.name == c.layout) return b.prepare;
    return PrepareRoutine{nullptr};
  }();
  ASSERT_NE(prepare, nullptr);
  auto prepared = prepare(*g, canonical);
  ASSERT_TRUE(prepared) << prepared.error().message;
  for (Plane p : {Plane::kValues, Plane::kScales}) {
    const PlaneLayout& l = layout->plane(p);
    const std::vector<uint8_t>& src = p == Plane::kValues ? canonical.values : canonical.scales;
    std::vector<uint8_t> native(static_cast<size_t>(l.native_bytes), 0xAA), back(src.size(), 0x55);
    ASSERT_TRUE(to_native(l, src, native));
    EXPECT_EQ(native, p == Plane::kValues ? prepared->values : prepared->scales) << plane_name(p);
    const std::vector<int64_t> map = native_map(l);
    int64_t pads = 0, nonzero_pads = 0;
    for (size_t q = 0; q < map.size(); ++q)
      if (map[q] < 0) ++pads, nonzero_pads += native[q] != 0;
    EXPECT_EQ(pads, l.native_bytes - l.canonical.bytes()) << plane_name(p);
    EXPECT_EQ(nonzero_pads, 0) << plane_name(p);
    ASSERT_TRUE(to_canonical(l, native, back));
    EXPECT_EQ(back, src) << plane_name(p);
  }
}

// covers N-14: scatter of a sparse canonical delta into live native bytes equals re-laying-out the
// updated canonical plane; gather reads back exactly the bytes the delta wrote.
TEST_P(LayoutRoundTrip, ScatterMatchesFullRelayout) {
  const RoundTripCase& c = GetParam();
  auto layout = probe_builtin("w", c.layout, c.format, c.shape);
  ASSERT_TRUE(layout) << layout.error().message;
  for (Plane p : {Plane::kValues, Plane::kScales}) {
    const PlaneLayout& l = layout->plane(p);
    std::vector<uint8_t> canonical = random_plane(l.canonical.bytes(), 21);
    std::vector<uint8_t> live(static_cast<size_t>(l.native_bytes));
    ASSERT_TRUE(to_native(l, canonical, live));
    std::vector<int64_t> indices;
    std::vector<uint8_t> bytes;
    for (int64_t i = 0; i < l.canonical.bytes(); i += 1 + i % 13) {
      indices.push_back(i);
      bytes.push_back(static_cast<uint8_t>(~canonical[i]));
      canonical[i] = bytes.back();
    }
    ASSERT_TRUE(scatter(l, indices, bytes, live));
    std::vector<uint8_t> fresh(live.size());
    ASSERT_TRUE(to_native(l, canonical, fresh));
    EXPECT_EQ(live, fresh) << plane_name(p);
    std::vector<uint8_t> back(bytes.size());
    ASSERT_TRUE(gather(l, indices, live, back));
    EXPECT_EQ(back, bytes) << plane_name(p);
  }
}

// Memory stays O(rows + row_bytes): the tables never grow with the tensor's byte count.
TEST_P(LayoutRoundTrip, TablesAreRowsPlusColumns) {
  const RoundTripCase& c = GetParam();
  auto layout = probe_builtin("w", c.layout, c.format, c.shape);
  ASSERT_TRUE(layout) << layout.error().message;
  for (Plane p : {Plane::kValues, Plane::kScales}) {
    const PlaneLayout& l = layout->plane(p);
    const size_t want_rows = l.kind == PlaneKind::kSeparable ? static_cast<size_t>(l.canonical.rows) : 0;
    const size_t want_cols = l.kind == PlaneKind::kSeparable ? static_cast<size_t>(l.canonical.row_bytes) : 0;
    EXPECT_EQ(l.row_off.size(), want_rows) << plane_name(p);
    EXPECT_EQ(l.col_off.size(), want_cols) << plane_name(p);
  }
}

INSTANTIATE_TEST_SUITE_P(Builtins, LayoutRoundTrip, ::testing::ValuesIn(kRoundTripCases),
                         [](const auto& info) {
                           std::string name = std::string(info.param.layout) + "_" +
                                              std::string(traits(info.param.format).name);
                           for (int64_t d : info.param.shape) name += "_" + std::to_string(d);
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

// The CUDA GEMV values layout, as its contract in cuda/linear/gemv_layout.h states it (the CUDA backend
// probes its own prepare_gemv_values; libmxq cannot link it): per row, K in groups of G = 64 (MXFP8) or 128
// (MXFP4) elements, the last possibly shorter; with J = group/16, element k0 + 16j + 4t + e goes to k0 + 4J·t
// + 4j + e. Runs of 4 elements stay whole (4 bytes of MXFP8, 2 of MXFP4), so the probe must learn it as
// separable.
struct GemvCase {
  Format format;
  int64_t rows, cols;
};
void PrintTo(const GemvCase& c, std::ostream* os) {
  *os << traits(c.format).name << " [" << c.rows << ", " << c.cols << "]";
}

class GemvContract : public ::testing::TestWithParam<GemvCase> {};

TEST_P(GemvContract, LearnedAsSeparableAndRoundTrips) {
  const GemvCase& c = GetParam();
  const std::vector<int64_t> shape = {c.rows, c.cols};
  const int64_t group = c.format == Format::kMXFP8 ? 64 : 128, per_byte = c.format == Format::kMXFP8 ? 1 : 2;
  const int64_t row_bytes = c.cols / per_byte;
  auto layout =
      probe_layout("w", "cuda_gemv", c.format, shape, [&](const HostPlanes& in) -> Result<HostPlanes> {
        HostPlanes out{std::vector<uint8_t>(in.values.size()), in.scales};
        for (int64_t r = 0; r < c.rows; ++r)
          for (int64_t k = 0; k < c.cols; k += 4) {
            const int64_t k0 = k / group * group, j_count = std::min(group, c.cols - k0) / 16, kk = k - k0;
            const int64_t native = k0 + 4 * j_count * (kk % 16 / 4) + 4 * (kk / 16);
            for (int64_t b = 0; b < 4 / per_byte; ++b)
              out.values[r * row_bytes + native / per_byte + b] = in.values[r * row_bytes + k / per_byte + b];
          }
        return out;
      });
  ASSERT_TRUE(layout) << layout.error().message;
  EXPECT_EQ(layout->values.kind, PlaneKind::kSeparable);
  EXPECT_EQ(layout->scales.kind, PlaneKind::kIdentity);
  const std::vector<uint8_t> canonical = random_plane(layout->values.canonical.bytes(), 5);
  std::vector<uint8_t> native(static_cast<size_t>(layout->values.native_bytes)), back(canonical.size());
  ASSERT_TRUE(to_native(layout->values, canonical, native));
  ASSERT_TRUE(to_canonical(layout->values, native, back));
  EXPECT_EQ(back, canonical);
}

const GemvCase kGemvCases[] = {
    {Format::kMXFP8, 3, 64},  {Format::kMXFP8, 5, 96},  {Format::kMXFP8, 2, 4096 + 32},
    {Format::kMXFP4, 3, 128}, {Format::kMXFP4, 4, 160}, {Format::kMXFP4, 1, 32},
};
INSTANTIATE_TEST_SUITE_P(CudaGemv, GemvContract, ::testing::ValuesIn(kGemvCases), [](const auto& info) {
  return std::string(traits(info.param.format).name) + "_" + std::to_string(info.param.rows) + "x" +
         std::to_string(info.param.cols);
});

}  // namespace
}  // namespace mxq
