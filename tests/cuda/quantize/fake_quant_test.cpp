// The W8A8 mode's MXFP8 activation quantize-dequantize (cuda/quantize/quantize_act.h fake_quant_mxfp8)
// against its CPU twin, bitwise: random rows over wide exponent ranges (bf16's whole normal range included,
// so the f32 dequantize overflows to inf where a block's amax rounds up past bf16's top), every bf16 bit
// pattern (consecutive patterns as blocks, and each pattern beside a random large element), zero blocks, bf16
// subnormals, and blocks holding Inf or NaN (32 NaN out); y poisoned first. Also the refusals.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../gpu_test_util.h"
#include "cpu/quantize_act.h"
#include "cuda/quantize/quantize_act.h"

namespace mxq::cuda {
namespace {

void expect_matches_cpu(const std::vector<uint16_t>& x, int64_t m, int64_t k) {
  std::vector<uint16_t> want(x.size());
  const Status cst = mxq::fake_quant_mxfp8(x.data(), m, k, want.data());
  ASSERT_TRUE(cst) << cst.error().message;
  auto dx = test::upload(x);
  auto dy = test::poisoned<uint16_t>(x.size());
  ASSERT_TRUE(dx && dy);
  const Status st = cuda::fake_quant_mxfp8(dx->as<uint16_t>(), m, k, dy->as<uint16_t>(), nullptr);
  ASSERT_TRUE(st) << st.error().message;
  auto y = test::download<uint16_t>(*dy, x.size());
  ASSERT_TRUE(y) << y.error().message;
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ((*y)[i], want[i]) << "row " << i / k << " col " << i % k << " x 0x" << std::hex << x[i];
}

struct FqCase {
  int64_t m, k;
  int lo, hi;  // exponent range of the random elements
};

class FakeQuantMxfp8 : public ::testing::TestWithParam<FqCase> {};

TEST_P(FakeQuantMxfp8, BitwiseEqualsCpuTwin) {
  const FqCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> x = test::random_bf16(rng, static_cast<size_t>(c.m * c.k), c.lo, c.hi);
  // note: some blocks zero, some with a subnormal, an Inf, a NaN (when there are enough blocks)
  const int64_t blocks = c.m * c.k / 32;
  for (int64_t b = 0; b < blocks; b += 7) {
    uint16_t* p = x.data() + b * 32;
    switch ((b / 7) % 5) {
      case 0:
        std::fill(p, p + 32, uint16_t{0});
        break;
      case 1:
        p[rng() % 32] = static_cast<uint16_t>(1 + rng() % 127);
        break;
      case 2:
        p[rng() % 32] = 0xFF80;
        break;  // -Inf
      case 3:
        p[rng() % 32] = 0x7FC1;
        break;  // NaN
      default:
        p[rng() % 32] = 0x8000;
        break;  // -0
    }
  }
  expect_matches_cpu(x, c.m, c.k);
}

INSTANTIATE_TEST_SUITE_P(Shapes, FakeQuantMxfp8,
                         ::testing::Values(FqCase{1, 32, -6, 2}, FqCase{1, 4096, -6, 2},
                                           FqCase{8, 4096, -30, 30}, FqCase{17, 12288, -126, 128},
                                           FqCase{300, 2048, -6, 2}, FqCase{3, 96, -126, -100},
                                           FqCase{5, 160, 100, 128}),
                         [](const auto& info) {
                           const FqCase& c = info.param;
                           return "m" + std::to_string(c.m) + "_k" + std::to_string(c.k) + "_e" +
                                  std::to_string(c.lo + 200) + "_" + std::to_string(c.hi + 200);
                         });

TEST(FakeQuantMxfp8Every, Bf16PatternMatchesCpuTwin) {
  // Every bf16 pattern, 32 consecutive ones a block; then each beside a random element of exponent
  // -20..100 (its block's scale), 31 patterns and that element a block.
  std::vector<uint16_t> x(65536);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint16_t>(i);
  expect_matches_cpu(x, 2048, 32);
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> y;
  for (uint32_t i = 0; i < 65536; i += 31) {
    for (uint32_t j = i; j < i + 31; ++j) y.push_back(static_cast<uint16_t>(j & 0xFFFF));
    y.push_back(static_cast<uint16_t>((rng() & 0x8000) | (107 + rng() % 121) << 7 | (rng() & 0x7F)));
  }
  expect_matches_cpu(y, static_cast<int64_t>(y.size() / 32), 32);
}

TEST(FakeQuantMxfp8Refuses, ShapeAndOverlap) {
  auto d = test::poisoned<uint16_t>(256);
  ASSERT_TRUE(d);
  uint16_t* p = d->as<uint16_t>();
  Status st = cuda::fake_quant_mxfp8(p, 2, 48, p + 128, nullptr);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("multiple of 32"), std::string::npos) << st.error().message;
  st = cuda::fake_quant_mxfp8(p, 2, 64, p + 64, nullptr);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("overlaps"), std::string::npos) << st.error().message;
  EXPECT_TRUE(cuda::fake_quant_mxfp8(p, 2, 64, p + 128, nullptr));
}

}  // namespace
}  // namespace mxq::cuda
