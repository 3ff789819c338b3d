// GPU SwiGLU (fused [gate | up] rows and separate buffers) against cpu/swiglu on fresh random bf16 inputs,
// ragged widths, device token count below capacity.
#include "cuda/ops/swiglu.h"

#include "../op_test_util.h"
#include "cpu/swiglu.h"

namespace mxq::cuda {
namespace {

struct SwigluCase {
  int64_t width, tokens, capacity;
};
void PrintTo(const SwigluCase& c, std::ostream* os) {
  *os << "width=" << c.width << " tokens=" << c.tokens << "/" << c.capacity;
}

class Swiglu : public ::testing::TestWithParam<SwigluCase> {};

TEST_P(Swiglu, MatchesCpuTwin) {
  const SwigluCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const size_t n = static_cast<size_t>(c.tokens * c.width), cap = static_cast<size_t>(c.capacity * c.width);
  const auto gate_up = test::normal_bf16(rng, 2 * cap, 3.0f);
  const auto gate = test::normal_bf16(rng, cap, 3.0f), up = test::normal_bf16(rng, cap);
  const auto guf = test::to_f32(gate_up), gf = test::to_f32(gate), uf = test::to_f32(up);
  std::vector<float> ref_fused(n), ref_sep(n);
  for (int64_t t = 0; t < c.tokens; ++t) {
    swiglu(guf.data() + t * 2 * c.width, guf.data() + t * 2 * c.width + c.width, c.width,
           ref_fused.data() + t * c.width);
    swiglu(gf.data() + t * c.width, uf.data() + t * c.width, c.width, ref_sep.data() + t * c.width);
  }
  auto dgu = test::must(test::upload(gate_up));
  auto dg = test::must(test::upload(gate));
  auto du = test::must(test::upload(up));
  auto dn = test::must(test::upload(std::vector<int32_t>{static_cast<int32_t>(c.tokens)}));
  auto o1 = test::must(test::poisoned<uint16_t>(cap));
  auto o2 = test::must(test::poisoned<uint16_t>(cap));
  ASSERT_EQ(launch_swiglu_fused(dgu.as<uint16_t>(), c.width, dn.as<int32_t>(), c.capacity, o1.as<uint16_t>(),
                                nullptr),
            cudaSuccess);
  ASSERT_EQ(launch_swiglu(dg.as<uint16_t>(), du.as<uint16_t>(), c.width, dn.as<int32_t>(), c.capacity,
                          o2.as<uint16_t>(), nullptr),
            cudaSuccess);
  const auto g1 = test::must(test::download<uint16_t>(o1, cap));
  const auto g2 = test::must(test::download<uint16_t>(o2, cap));
  test::expect_close_bf16({g1.begin(), g1.begin() + static_cast<int64_t>(n)}, ref_fused, test::kBf16Rtol,
                          1e-30, "fused");
  test::expect_close_bf16({g2.begin(), g2.begin() + static_cast<int64_t>(n)}, ref_sep, test::kBf16Rtol, 1e-30,
                          "separate");
  for (size_t i = n; i < cap; ++i) ASSERT_EQ(g1[i] & g2[i], 0xFFFF) << "row past num_tokens written at " << i;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Swiglu,
                         ::testing::Values(SwigluCase{8, 1, 1}, SwigluCase{1152, 7, 9},
                                           SwigluCase{768, 33, 33}, SwigluCase{12288, 4, 4},
                                           SwigluCase{3000, 65, 80}));

}  // namespace
}  // namespace mxq::cuda
