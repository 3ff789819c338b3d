// Prepares that are not byte permutations, built-in layouts given shapes their kernels do not take, and
// bad sparse indices: each is refused with one line naming the tensor, the kernel and what is wrong.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "layout/prepare.h"
#include "layout_test_util.h"

namespace mxq {
namespace {

constexpr const char* kTensor = "model.layers.3.mlp.down_proj.weight";

// A row-major or swizzled prepare with one defect applied to its output.
struct BadPrepareCase {
  const char* name;  // also the kernel name handed to probe_layout
  Format format;
  std::vector<int64_t> shape;
  std::function<Result<HostPlanes>(const TensorGeometry&, const HostPlanes&)> prepare;
  const char* expect;  // substring of the refusal
};
void PrintTo(const BadPrepareCase& c, std::ostream* os) { *os << c.name; }

Result<HostPlanes> swizzled(const TensorGeometry& g, const HostPlanes& in) {
  return prepare_scale_swizzle_128x4(g, in);
}

const BadPrepareCase kBadPrepares[] = {
    {"drops_value_byte",
     Format::kMXFP8,
     {4, 64},
     [](const TensorGeometry&, const HostPlanes& in) -> Result<HostPlanes> {
       HostPlanes out = in;
       out.values[5] = 0;  // canonical byte 5 never written: looks like padding, so it is missing
       return out;
     },
     "values plane: canonical byte 5 (row 0, byte 5) is missing"},
    {"duplicates_value_byte",
     Format::kMXFP8,
     {4, 64},
     [](const TensorGeometry&, const HostPlanes& in) -> Result<HostPlanes> {
       HostPlanes out = in;
       out.values[70] = out.values[3];
       return out;
     },
     "canonical byte 3 (row 0, byte 3) is duplicated at native bytes 3 and 70"},
    {"drops_scale_byte",
     Format::kMXFP8,
     {130, 96},
     [](const TensorGeometry& g, const HostPlanes& in) -> Result<HostPlanes> {
       auto out = swizzled(g, in);
       if (out) out->scales[16] = 0;  // row 1, column 0 of the 128x4 tile
       return out;
     },
     "scales plane: canonical byte 3 (row 1, byte 0) is missing"},
    {"flips_sign_bits",
     Format::kMXFP8,
     {4, 64},
     [](const TensorGeometry&, const HostPlanes& in) -> Result<HostPlanes> {
       HostPlanes out = in;
       for (auto& b : out.values) b ^= 0x80;
       return out;
     },
     "not a copy"},
    {"rewrites_zero_bytes",
     Format::kMXFP8,
     {4, 64},
     [](const TensorGeometry&, const HostPlanes& in) -> Result<HostPlanes> {
       // probes never hold 0x00, so only the random-plane check can see this
       HostPlanes out = in;
       for (auto& b : out.values) b = b == 0 ? 0x01 : b;
       return out;
     },
     "prepare changes byte values"},
    {"rotates_rows",
     Format::kMXFP8,
     {4, 64},
     [](const TensorGeometry& g, const HostPlanes& in) -> Result<HostPlanes> {
       HostPlanes out = in;  // a permutation, but column c of row r goes to (c + r) % W
       const int64_t w = g.values.row_bytes;
       for (int64_t r = 0; r < g.values.rows; ++r)
         for (int64_t c = 0; c < w; ++c) out.values[r * w + (c + r) % w] = in.values[r * w + c];
       return out;
     },
     "not a separable permutation: canonical byte 127 (row 1, byte 63) sits at native byte 64"},
    {"marlin_mxfp4", Format::kMXFP4, {64, 64}, prepare_marlin, "moves 4-bit elements between bytes"},
    {"prepare_error",
     Format::kMXFP8,
     {4, 64},
     [](const TensorGeometry&, const HostPlanes&) -> Result<HostPlanes> {
       return fail("kernel wants sm_100");
     },
     "prepare failed: kernel wants sm_100"},
};

class ProbeRefusal : public ::testing::TestWithParam<BadPrepareCase> {};

TEST_P(ProbeRefusal, NamesTensorKernelAndDefect) {
  const BadPrepareCase& c = GetParam();
  auto g = tensor_geometry(kTensor, c.format, c.shape);
  ASSERT_TRUE(g) << g.error().message;
  auto layout = probe_layout(kTensor, c.name, c.format, c.shape,
                             [&](const HostPlanes& in) { return c.prepare(*g, in); });
  ASSERT_FALSE(layout) << c.name << " was accepted";
  const std::string& m = layout.error().message;
  EXPECT_NE(m.find(kTensor), std::string::npos) << m;
  EXPECT_NE(m.find(std::string("kernel '") + c.name + "'"), std::string::npos) << m;
  EXPECT_NE(m.find(c.expect), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

INSTANTIATE_TEST_SUITE_P(BadPrepares, ProbeRefusal, ::testing::ValuesIn(kBadPrepares),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ProbeRefusal, NativeSizeMustNotDependOnInput) {
  int calls = 0;
  auto layout = probe_layout(kTensor, "grows", Format::kMXFP8, std::vector<int64_t>{300, 64},
                             [&](const HostPlanes& in) -> Result<HostPlanes> {
                               HostPlanes out = in;
                               out.values.resize(out.values.size() + calls++);
                               return out;
                             });
  ASSERT_FALSE(layout);
  EXPECT_NE(layout.error().message.find("native sizes change between probe runs"), std::string::npos)
      << layout.error().message;
}

struct ShapeCase {
  const char* name;
  const char* layout;
  Format format;
  std::vector<int64_t> shape;
  const char* expect;
};
void PrintTo(const ShapeCase& c, std::ostream* os) { *os << c.name; }

const ShapeCase kShapeCases[] = {
    {"marlin_n_not_64", "marlin", Format::kMXFP8, {96, 64}, "marlin: N = 96 (expected a multiple of 64)"},
    {"marlin_fp8_b128", "marlin", Format::kFP8_B128, {128, 128}, "marlin: format fp8-b128 (expected mxfp8"},
    {"trtllm_rows_not_128",
     "trtllm_moe_w13",
     Format::kMXFP8,
     {2, 64, 128},
     "trtllm_moe_w13: 64 rows per expert (expected a multiple of 128)"},
    {"trtllm_k_not_128",
     "trtllm_moe_w2",
     Format::kMXFP8,
     {1, 128, 96},
     "trtllm_moe_w2: K = 96 (expected a multiple of 128"},
    {"mn_major_mxfp8", "scales_mn_major", Format::kMXFP8, {128, 128}, "format mxfp8 (expected fp8-b128"},
    {"swizzle_bf16",
     "scale_swizzle_128x4",
     Format::kBF16,
     {128, 128},
     "format bf16 (expected mxfp8 or mxfp4"},
    // covers N-13 (K not a multiple of 32): refused before any byte is touched
    {"mx_k_not_32", "row_major", Format::kMXFP8, {4, 48}, "mxfp8 needs K a multiple of 32 (got K = 48)"},
    {"rank_1", "row_major", Format::kMXFP8, {64}, "rank 1 (expected [N, K] or [E, N, K])"},
    {"negative_dim", "row_major", Format::kMXFP8, {-1, 64}, "negative dimension -1"},
    {"overflow", "row_major", Format::kMXFP8, {int64_t{1} << 40, int64_t{1} << 40}, "overflows int64"},
    {"unknown_layout", "humming", Format::kMXFP8, {64, 64}, "unknown layout 'humming' (known: row_major"},
};

class BuiltinShapeRefusal : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(BuiltinShapeRefusal, NamesTensorAndExpectation) {
  const ShapeCase& c = GetParam();
  auto layout = probe_builtin(kTensor, c.layout, c.format, c.shape);
  ASSERT_FALSE(layout) << c.name << " was accepted";
  const std::string& m = layout.error().message;
  EXPECT_EQ(m.rfind(kTensor, 0), 0u) << m;
  EXPECT_NE(m.find(c.expect), std::string::npos) << m;
}

INSTANTIATE_TEST_SUITE_P(Shapes, BuiltinShapeRefusal, ::testing::ValuesIn(kShapeCases),
                         [](const auto& info) { return std::string(info.param.name); });

struct IndexCase {
  const char* name;
  std::vector<int64_t> indices;
  size_t bytes;
  const char* expect;
};
void PrintTo(const IndexCase& c, std::ostream* os) { *os << c.name; }

const IndexCase kIndexCases[] = {
    {"past_end", {0, 5, 4096}, 3, "index 4096 at position 2 is outside the plane [0, 4096)"},
    {"negative", {-1}, 1, "index -1 at position 0 is outside"},
    {"duplicate", {3, 3}, 2, "index 3 at position 1 does not follow 3"},
    {"unsorted", {9, 2}, 2, "index 2 at position 1 does not follow 9"},
    {"length_mismatch", {1, 2, 3}, 2, "3 indices but 2 bytes"},
};

class ScatterRefusal : public ::testing::TestWithParam<IndexCase> {};

// Layout-level guard under refit's W-01 / W-02 / W-03 / W-04: nothing is written when any index is bad.
TEST_P(ScatterRefusal, RefusesBeforeAnyWrite) {
  const IndexCase& c = GetParam();
  auto layout = probe_builtin(kTensor, "marlin", Format::kMXFP8, std::vector<int64_t>{64, 64});
  ASSERT_TRUE(layout) << layout.error().message;
  std::vector<uint8_t> native(4096, 0x5A);
  const std::vector<uint8_t> before = native;
  const std::vector<uint8_t> bytes(c.bytes, 0xFF);
  auto s = scatter(layout->values, c.indices, bytes, native);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find(c.expect), std::string::npos) << s.error().message;
  EXPECT_EQ(native, before);
  std::vector<uint8_t> out(c.bytes, 0);
  EXPECT_FALSE(gather(layout->values, c.indices, native, out));
}

INSTANTIATE_TEST_SUITE_P(Indices, ScatterRefusal, ::testing::ValuesIn(kIndexCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(LayoutBuffers, WrongSizesAreRefused) {
  auto layout = probe_builtin(kTensor, "scale_swizzle_128x4", Format::kMXFP8, std::vector<int64_t>{3, 64});
  ASSERT_TRUE(layout) << layout.error().message;
  std::vector<uint8_t> canonical(6), native(511);  // the swizzled plane is 128 x 4 = 512 bytes
  auto s = to_native(layout->scales, canonical, native);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().message, "native plane is 511 bytes (expected 512)");
  native.resize(512);
  canonical.resize(5);
  EXPECT_FALSE(to_canonical(layout->scales, native, canonical));
}

}  // namespace
}  // namespace mxq
