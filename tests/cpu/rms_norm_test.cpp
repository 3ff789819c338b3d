#include "cpu/rms_norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <ostream>

#include "test_util.h"

namespace mxq {
namespace {

struct NormCase {
  int64_t rows, dim;
  float eps;
};
void PrintTo(const NormCase& c, std::ostream* os) {
  *os << "rows=" << c.rows << " dim=" << c.dim << " eps=" << c.eps;
}

std::vector<double> reference_norm(const std::vector<float>& x, int64_t rows, int64_t dim,
                                   const std::vector<float>& w, double eps) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) out[r * dim + i] = w[i] * (x[r * dim + i] * inv);
  }
  return out;
}

class CpuRmsNorm : public ::testing::TestWithParam<NormCase> {};

TEST_P(CpuRmsNorm, MatchesF64) {
  const NormCase& c = GetParam();
  std::mt19937_64 rng(c.rows * 31 + c.dim);
  std::vector<float> x = test::random_floats(rng, c.rows * c.dim, 3.0f), w = test::random_floats(rng, c.dim);
  std::vector<float> out(x.size());
  rms_norm(x.data(), c.rows, c.dim, w.data(), c.eps, out.data());
  const std::vector<double> want = reference_norm(x, c.rows, c.dim, w, c.eps);
  EXPECT_LE(test::nmse(out, want), 1e-12);
  // in place gives the same bytes
  std::vector<float> inplace = x;
  rms_norm(inplace.data(), c.rows, c.dim, w.data(), c.eps, inplace.data());
  EXPECT_EQ(inplace, out);
}

TEST_P(CpuRmsNorm, FusedResidualAddUpdatesResidual) {
  const NormCase& c = GetParam();
  std::mt19937_64 rng(c.rows * 37 + c.dim);
  std::vector<float> x = test::random_floats(rng, c.rows * c.dim), res = test::random_floats(rng, x.size());
  std::vector<float> w = test::random_floats(rng, c.dim), out(x.size());
  std::vector<float> sum(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + res[i];  // one f32 add: exact reference for residual
  add_rms_norm(x.data(), res.data(), c.rows, c.dim, w.data(), c.eps, out.data());
  EXPECT_EQ(res, sum);
  EXPECT_LE(test::nmse(out, reference_norm(sum, c.rows, c.dim, w, c.eps)), 1e-12);
}

TEST_P(CpuRmsNorm, PerHeadNormSharesWeightAcrossHeads) {
  const NormCase& c = GetParam();
  const int64_t heads = 3;
  std::mt19937_64 rng(c.rows * 41 + c.dim);
  std::vector<float> x = test::random_floats(rng, c.rows * heads * c.dim),
                     w = test::random_floats(rng, c.dim);
  const std::vector<double> want = reference_norm(x, c.rows * heads, c.dim, w, c.eps);
  head_rms_norm(x.data(), c.rows, heads, c.dim, w.data(), c.eps);
  EXPECT_LE(test::nmse(x, want), 1e-12);
}

// note: dims 128 (Qwen3 head_dim) and 2560/4096 (hidden) plus ragged ones that leave a non-8 tail.
INSTANTIATE_TEST_SUITE_P(CpuRmsNorm, CpuRmsNorm,
                         ::testing::Values(NormCase{1, 128, 1e-6f}, NormCase{3, 7, 1e-6f},
                                           NormCase{17, 2560, 1e-6f}, NormCase{64, 4096, 1e-5f},
                                           NormCase{5, 333, 1e-2f}),
                         [](const ::testing::TestParamInfo<NormCase>& i) {
                           return "rows" + std::to_string(i.param.rows) + "_dim" +
                                  std::to_string(i.param.dim) + "_case" + std::to_string(i.index);
                         });

}  // namespace
}  // namespace mxq
