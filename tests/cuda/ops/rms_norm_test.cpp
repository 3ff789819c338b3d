// GPU rms_norm (f32 and bf16 input) and add_rms_norm against cpu/rms_norm on fresh random rows: the residual
// update bitwise, the bf16 output within two bf16 half-ulps; ragged dims, device token count below capacity.
#include "cuda/ops/rms_norm.h"

#include "../op_test_util.h"
#include "cpu/rms_norm.h"

namespace mxq::cuda {
namespace {

struct NormCase {
  int64_t dim, tokens, capacity;
};
void PrintTo(const NormCase& c, std::ostream* os) {
  *os << "dim=" << c.dim << " tokens=" << c.tokens << "/" << c.capacity;
}

class RmsNorm : public ::testing::TestWithParam<NormCase> {};

TEST_P(RmsNorm, MatchesCpuTwin) {
  const NormCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const size_t n = static_cast<size_t>(c.tokens * c.dim), cap = static_cast<size_t>(c.capacity * c.dim);
  const float eps = 1e-6f;
  const auto w = test::normal_bf16(rng, static_cast<size_t>(c.dim));
  const auto xb = test::normal_bf16(rng, cap, 3.0f);  // bf16 input (a linear's output)
  std::vector<float> xf(cap);                         // f32 input (the residual stream)
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (auto& v : xf) v = nd(rng);
  const auto wf = test::to_f32(w), xbf = test::to_f32(xb);

  auto dw = test::must(test::upload(w));
  auto dxb = test::must(test::upload(xb));
  auto dxf = test::must(test::upload(xf));
  auto dn = test::must(test::upload(std::vector<int32_t>{static_cast<int32_t>(c.tokens)}));
  auto o1 = test::must(test::poisoned<uint16_t>(cap));
  auto o2 = test::must(test::poisoned<uint16_t>(cap));
  auto o3 = test::must(test::poisoned<uint16_t>(cap));
  auto dres = test::must(test::upload(xf));  // residual starts as the f32 input
  const int32_t* num = dn.as<int32_t>();
  ASSERT_EQ(launch_rms_norm_f32(dxf.as<float>(), dw.as<uint16_t>(), eps, c.dim, num, c.capacity,
                                o1.as<uint16_t>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(launch_rms_norm_bf16(dxb.as<uint16_t>(), dw.as<uint16_t>(), eps, c.dim, num, c.capacity,
                                 o2.as<uint16_t>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(launch_add_rms_norm(dxb.as<uint16_t>(), dres.as<float>(), dw.as<uint16_t>(), eps, c.dim, num,
                                c.capacity, o3.as<uint16_t>(), nullptr),
            cudaSuccess);

  std::vector<float> ref1(n), ref2(n), ref3(n), res(xf.begin(), xf.begin() + static_cast<int64_t>(n));
  rms_norm(xf.data(), c.tokens, c.dim, wf.data(), eps, ref1.data());
  rms_norm(xbf.data(), c.tokens, c.dim, wf.data(), eps, ref2.data());
  add_rms_norm(xbf.data(), res.data(), c.tokens, c.dim, wf.data(), eps, ref3.data());

  const auto g1 = test::must(test::download<uint16_t>(o1, cap));
  const auto g2 = test::must(test::download<uint16_t>(o2, cap));
  const auto g3 = test::must(test::download<uint16_t>(o3, cap));
  const auto gres = test::must(test::download<float>(dres, cap));
  const std::vector<uint16_t> h1(g1.begin(), g1.begin() + static_cast<int64_t>(n)),
      h2(g2.begin(), g2.begin() + static_cast<int64_t>(n)),
      h3(g3.begin(), g3.begin() + static_cast<int64_t>(n));
  test::expect_close_bf16(h1, ref1, test::kBf16Rtol, 1e-6, "rms_norm_f32");
  test::expect_close_bf16(h2, ref2, test::kBf16Rtol, 1e-6, "rms_norm_bf16");
  test::expect_close_bf16(h3, ref3, test::kBf16Rtol, 1e-6, "add_rms_norm out");
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(gres[i]), std::bit_cast<uint32_t>(res[i])) << "residual " << i;
  for (size_t i = n; i < cap; ++i) {
    ASSERT_EQ(g1[i] & g2[i] & g3[i], 0xFFFF) << "row past num_tokens written at " << i;
    ASSERT_EQ(std::bit_cast<uint32_t>(gres[i]), std::bit_cast<uint32_t>(xf[i])) << "residual past num_tokens";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNorm,
                         ::testing::Values(NormCase{8, 1, 1}, NormCase{384, 7, 8}, NormCase{1000, 33, 40},
                                           NormCase{4096, 5, 5}, NormCase{5120, 64, 70}, NormCase{2056, 1, 3},
                                           NormCase{8192, 3, 4}));

TEST(RmsNormArgs, RefusesDimNotMultipleOf8) {
  EXPECT_EQ(launch_rms_norm_f32(nullptr, nullptr, 1e-6f, 12, nullptr, 1, nullptr, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace mxq::cuda
