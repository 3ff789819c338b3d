#include "cpu/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <ostream>

#include "test_util.h"

namespace mxq {
namespace {

struct RopeCase {
  int64_t tokens, heads, head_dim;
  float theta;
  int64_t first_position;
};
void PrintTo(const RopeCase& c, std::ostream* os) {
  *os << "T=" << c.tokens << " H=" << c.heads << " D=" << c.head_dim << " theta=" << c.theta
      << " pos0=" << c.first_position;
}

class CpuRope : public ::testing::TestWithParam<RopeCase> {};

// The formula in f64: pair (i, i + D/2) rotated by pos * theta^(-2i/D).
TEST_P(CpuRope, MatchesRotateHalfFormula) {
  const RopeCase& c = GetParam();
  std::mt19937_64 rng(c.tokens * 7 + c.head_dim);
  std::vector<float> x = test::random_floats(rng, c.tokens * c.heads * c.head_dim);
  std::vector<int64_t> pos(c.tokens);
  for (int64_t t = 0; t < c.tokens; ++t) pos[t] = c.first_position + 3 * t;  // not contiguous on purpose
  std::vector<double> want(x.size());
  const int64_t half = c.head_dim / 2;
  for (int64_t t = 0; t < c.tokens; ++t)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double a = pos[t] * std::pow(static_cast<double>(c.theta), -2.0 * i / c.head_dim);
        const size_t base = (t * c.heads + h) * c.head_dim;
        want[base + i] = x[base + i] * std::cos(a) - x[base + i + half] * std::sin(a);
        want[base + i + half] = x[base + i + half] * std::cos(a) + x[base + i] * std::sin(a);
      }
  ASSERT_TRUE(rope(x.data(), c.tokens, c.heads, c.head_dim, pos.data(), c.theta));
  // note: the op rounds inv_freq and then the angle to f32 as HF does, each costing up to p * 2^-24 rad at
  // position p; times |x| <~ 8 (4 sigma of a pair) that gives 16 p 2^-24 on top of f32 rounding.
  const double max_pos = static_cast<double>(pos.back());
  EXPECT_LE(test::max_abs_diff(x, want), 1e-5 + 16.0 * max_pos * 0x1p-24);
}

// Position 0 is the identity, and a rotation keeps each pair's norm.
TEST_P(CpuRope, PositionZeroIsIdentityAndPairsKeepTheirNorm) {
  const RopeCase& c = GetParam();
  std::mt19937_64 rng(c.tokens * 11 + c.head_dim);
  std::vector<float> x = test::random_floats(rng, c.tokens * c.heads * c.head_dim), y = x;
  std::vector<int64_t> zero(c.tokens, 0), pos(c.tokens, c.first_position + 1);
  ASSERT_TRUE(rope(y.data(), c.tokens, c.heads, c.head_dim, zero.data(), c.theta));
  EXPECT_EQ(x, y);
  ASSERT_TRUE(rope(y.data(), c.tokens, c.heads, c.head_dim, pos.data(), c.theta));
  const int64_t half = c.head_dim / 2;
  for (size_t base = 0; base < x.size(); base += c.head_dim)
    for (int64_t i = 0; i < half; ++i) {
      const double before = std::hypot(x[base + i], x[base + i + half]);
      EXPECT_NEAR(std::hypot(y[base + i], y[base + i + half]), before, 1e-5 * (1 + before));
    }
}

INSTANTIATE_TEST_SUITE_P(CpuRope, CpuRope,
                         ::testing::Values(RopeCase{1, 1, 2, 10000.0f, 0}, RopeCase{5, 4, 64, 10000.0f, 1},
                                           RopeCase{3, 8, 128, 1000000.0f, 4000},
                                           RopeCase{17, 2, 128, 1000000.0f, 30000},
                                           RopeCase{64, 2, 16, 500000.0f, 7}),
                         [](const ::testing::TestParamInfo<RopeCase>& i) {
                           return "T" + std::to_string(i.param.tokens) + "_H" +
                                  std::to_string(i.param.heads) + "_D" + std::to_string(i.param.head_dim) +
                                  "_pos" + std::to_string(i.param.first_position);
                         });

TEST(CpuRope, RefusesOddHeadDimThetaAndNegativePositionByName) {
  std::vector<float> x(16, 1.0f);
  const int64_t pos = 0, neg = -1;
  EXPECT_NE(rope(x.data(), 1, 1, 3, &pos, 1e4f).error().message.find("head_dim must be even"),
            std::string::npos);
  EXPECT_NE(rope(x.data(), 1, 1, 4, &pos, NAN).error().message.find("rope_theta"), std::string::npos);
  EXPECT_NE(rope(x.data(), 1, 1, 4, &neg, 1e4f).error().message.find("negative"), std::string::npos);
}

}  // namespace
}  // namespace mxq
