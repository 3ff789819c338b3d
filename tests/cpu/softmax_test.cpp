// softmax / log_softmax / argmax and swiglu: elementwise ops against f64 references.
#include "cpu/softmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <ostream>

#include "cpu/swiglu.h"
#include "test_util.h"

namespace mxq {
namespace {

struct RowsCase {
  int64_t rows, n;
  float stddev;
};
void PrintTo(const RowsCase& c, std::ostream* os) {
  *os << "rows=" << c.rows << " n=" << c.n << " sd=" << c.stddev;
}
std::string rows_name(const ::testing::TestParamInfo<RowsCase>& i) {
  return "rows" + std::to_string(i.param.rows) + "_n" + std::to_string(i.param.n) + "_case" +
         std::to_string(i.index);
}

class CpuSoftmax : public ::testing::TestWithParam<RowsCase> {};

TEST_P(CpuSoftmax, SoftmaxAndLogSoftmaxMatchF64) {
  const RowsCase& c = GetParam();
  std::mt19937_64 rng(c.n + c.rows);
  std::vector<float> x = test::random_floats(rng, c.rows * c.n, c.stddev), p(x.size()), lp(x.size());
  std::vector<double> want_p(x.size()), want_lp(x.size());
  for (int64_t r = 0; r < c.rows; ++r) {
    double m = -INFINITY, z = 0;
    for (int64_t i = 0; i < c.n; ++i) m = std::max(m, static_cast<double>(x[r * c.n + i]));
    for (int64_t i = 0; i < c.n; ++i) z += std::exp(x[r * c.n + i] - m);
    for (int64_t i = 0; i < c.n; ++i) {
      want_lp[r * c.n + i] = x[r * c.n + i] - m - std::log(z);
      want_p[r * c.n + i] = std::exp(want_lp[r * c.n + i]);
    }
  }
  softmax(x.data(), c.rows, c.n, p.data());
  log_softmax(x.data(), c.rows, c.n, lp.data());
  EXPECT_LE(test::nmse(p, want_p), 1e-11);
  EXPECT_LE(test::max_abs_diff(lp, want_lp), 1e-5 * (1 + c.stddev));
}

// note: stddev 30 makes logits of a peaked LM head; without the max subtraction exp would overflow.
INSTANTIATE_TEST_SUITE_P(CpuSoftmax, CpuSoftmax,
                         ::testing::Values(RowsCase{1, 1, 1.0f}, RowsCase{3, 7, 1.0f},
                                           RowsCase{2, 151936, 4.0f}, RowsCase{4, 1000, 30.0f}),
                         rows_name);

TEST(CpuSoftmax, ArgmaxTakesTheFirstMaximum) {
  const float x[] = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  EXPECT_EQ(argmax(x, 5), 1);
  EXPECT_EQ(argmax(x, 1), 0);
  EXPECT_EQ(argmax(x, 0), -1);
  const float neg[] = {-INFINITY, -5.0f, -INFINITY};
  EXPECT_EQ(argmax(neg, 3), 1);
}

class CpuSwiglu : public ::testing::TestWithParam<RowsCase> {};

TEST_P(CpuSwiglu, MatchesSiluTimesUp) {
  const RowsCase& c = GetParam();
  std::mt19937_64 rng(c.n * 3 + 1);
  std::vector<float> gate = test::random_floats(rng, c.rows * c.n, c.stddev),
                     up = test::random_floats(rng, gate.size());
  std::vector<float> out(gate.size());
  std::vector<double> want(gate.size());
  for (size_t i = 0; i < gate.size(); ++i)
    want[i] = gate[i] / (1.0 + std::exp(-static_cast<double>(gate[i]))) * up[i];
  swiglu(gate.data(), up.data(), static_cast<int64_t>(gate.size()), out.data());
  EXPECT_LE(test::nmse(out, want), 1e-12);
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
}

INSTANTIATE_TEST_SUITE_P(CpuSwiglu, CpuSwiglu,
                         ::testing::Values(RowsCase{1, 1, 1.0f}, RowsCase{3, 768, 1.0f},
                                           RowsCase{17, 3072, 4.0f}, RowsCase{2, 999, 100.0f}),
                         rows_name);

}  // namespace
}  // namespace mxq
