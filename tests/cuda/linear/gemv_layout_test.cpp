// The GEMV native layout is a byte permutation of the canonical plane (what refit's layout probe relies on),
// placed where gemv_layout.h's contract says.
#include "cuda/linear/gemv_layout.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

namespace mxq::cuda {
namespace {

struct LayoutCase {
  Format format;
  int64_t rows, cols;
};
void PrintTo(const LayoutCase& c, std::ostream* os) {
  *os << traits(c.format).name << " [" << c.rows << ", " << c.cols << "]";
}

class GemvLayout : public ::testing::TestWithParam<LayoutCase> {};

// Probe: byte i of the canonical plane holds a distinct 32-bit index spread over 4 probes (one byte each).
TEST_P(GemvLayout, PrepareIsAPermutation) {
  const LayoutCase c = GetParam();
  const int64_t bytes = values_bytes(c.format, c.rows, c.cols);
  std::vector<uint32_t> seen(static_cast<size_t>(bytes), 0);
  for (int probe = 0; probe < 4; ++probe) {
    std::vector<uint8_t> canonical(static_cast<size_t>(bytes)), native(static_cast<size_t>(bytes), 0);
    for (int64_t i = 0; i < bytes; ++i)
      canonical[static_cast<size_t>(i)] = static_cast<uint8_t>(i >> (8 * probe));
    ASSERT_TRUE(prepare_gemv_values(c.format, canonical.data(), native.data(), c.rows, c.cols));
    for (int64_t i = 0; i < bytes; ++i)
      seen[static_cast<size_t>(i)] |= uint32_t{native[static_cast<size_t>(i)]} << (8 * probe);
  }
  std::vector<uint32_t> sorted = seen;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < bytes; ++i)
    ASSERT_EQ(sorted[static_cast<size_t>(i)], static_cast<uint32_t>(i)) << "not a permutation";
  // Rows never mix: every native byte of row r came from row r.
  const int64_t row_bytes = values_bytes(c.format, 1, c.cols);
  for (int64_t i = 0; i < bytes; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)] / row_bytes, i / row_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemvLayout,
    ::testing::Values(LayoutCase{Format::kMXFP8, 3, 64}, LayoutCase{Format::kMXFP8, 5, 96},
                      LayoutCase{Format::kMXFP8, 2, 4096}, LayoutCase{Format::kMXFP4, 3, 128},
                      LayoutCase{Format::kMXFP4, 2, 160}, LayoutCase{Format::kMXFP4, 2, 224},
                      LayoutCase{Format::kMXFP4, 4, 4128}),
    [](const auto& info) {
      return std::string(info.param.format == Format::kMXFP8 ? "mxfp8" : "mxfp4") + "_" +
             std::to_string(info.param.rows) + "x" + std::to_string(info.param.cols);
    });

// Positions worked by hand from the contract: canonical k0 + 16j + 4t + e → k0 + 4J·t + 4j + e.
TEST(GemvLayoutContract, HandWorkedPositions) {
  EXPECT_EQ(gemv_native_elem(Format::kMXFP8, 64, 4), 16);   // j=0 t=1 → 16
  EXPECT_EQ(gemv_native_elem(Format::kMXFP8, 64, 16), 4);   // j=1 t=0 → 4
  EXPECT_EQ(gemv_native_elem(Format::kMXFP8, 64, 63), 63);  // j=3 t=3 e=3 → 48+12+3
  EXPECT_EQ(gemv_native_elem(Format::kMXFP8, 96, 68), 72);  // tail group of 32 (J=2): t=1 → 64+8
  EXPECT_EQ(gemv_native_elem(Format::kMXFP4, 128, 4), 32);  // J=8: t=1 → 32
  EXPECT_EQ(gemv_native_elem(Format::kMXFP4, 128, 17), 5);  // j=1 t=0 e=1 → 4+1
  EXPECT_EQ(gemv_native_elem(Format::kMXFP4, 224, 128 + 20), 128 + 24 + 4);  // tail of 96 (J=6): j=1 t=1
}

TEST(GemvLayoutContract, RefusesByName) {
  std::vector<uint8_t> a(64), b(64);
  const auto bf16 = prepare_gemv_values(Format::kBF16, a.data(), b.data(), 1, 32);
  ASSERT_FALSE(bf16);
  EXPECT_NE(bf16.error().message.find("bf16"), std::string::npos);
  const auto ragged = prepare_gemv_values(Format::kMXFP8, a.data(), b.data(), 1, 48);  // covers N-13
  ASSERT_FALSE(ragged);
  EXPECT_NE(ragged.error().message.find("48"), std::string::npos);
}

}  // namespace
}  // namespace mxq::cuda
