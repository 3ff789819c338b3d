// GPU MoE routing, grouping and combine against cpu/moe_route on fresh random router logits (f32 and bf16,
// the bf16 ones full of exact ties): expert ids equal (ties → lower expert), weights within f32 noise, the
// grouping (counts, offsets, sorted_rows, row_of) bitwise, the combine within bf16 rounding; E / top_k of
// the default, Qwen3-30B-A3B and larger MoE shapes, device token count below capacity.
#include "cuda/ops/moe_route.h"

#include <numeric>

#include "../op_test_util.h"
#include "cpu/moe_route.h"

namespace mxq::cuda {
namespace {

struct MoeCase {
  int experts, top_k, tokens, capacity, width;
  bool bf16_logits, norm;
};
void PrintTo(const MoeCase& c, std::ostream* os) {
  *os << "E=" << c.experts << " k=" << c.top_k << " tokens=" << c.tokens << "/" << c.capacity
      << " H=" << c.width << (c.bf16_logits ? " bf16" : " f32") << (c.norm ? " norm" : "");
}

class MoeRoute : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeRoute, MatchesCpuTwin) {
  const MoeCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const size_t n_logits = static_cast<size_t>(c.capacity) * c.experts;
  // note: bf16 logits at stddev 0.05 collide often, so the tie rule is exercised, not just present
  const auto lb = test::normal_bf16(rng, n_logits, c.bf16_logits ? 0.05f : 1.5f);
  std::vector<float> lf = test::to_f32(lb);
  if (!c.bf16_logits) {
    // note: f32 logits a shuffled 0.03-spaced ladder plus jitter: no two experts within the few ulps by which
    // the GPU's expf and f32 sum order may move a probability, so the top-k sets must agree exactly.
    std::uniform_real_distribution<float> jitter(-0.005f, 0.005f);
    std::vector<int> order(static_cast<size_t>(c.experts));
    for (int t = 0; t < c.capacity; ++t) {
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      for (int e = 0; e < c.experts; ++e)
        lf[static_cast<size_t>(t) * c.experts + e] =
            0.03f * static_cast<float>(order[e]) - 1.0f + jitter(rng);
    }
  }
  const size_t n = static_cast<size_t>(c.tokens) * c.top_k, cap = static_cast<size_t>(c.capacity) * c.top_k;
  std::vector<int32_t> ids(n), counts(c.experts), offsets(c.experts + 1), sorted(n), row_of(n);
  std::vector<float> w(n);
  ASSERT_TRUE(moe_route(lf.data(), c.tokens, c.experts, c.top_k, c.norm, ids.data(), w.data(), counts.data(),
                        offsets.data(), sorted.data(), row_of.data()));

  auto dlb = test::must(test::upload(lb));
  auto dlf = test::must(test::upload(lf));
  auto dn = test::must(test::upload(std::vector<int32_t>{c.tokens}));
  auto gids = test::must(test::poisoned<int32_t>(cap));
  auto gw = test::must(test::poisoned<float>(cap));
  auto gcounts = test::must(test::poisoned<int32_t>(static_cast<size_t>(c.experts)));
  auto goff = test::must(test::poisoned<int32_t>(static_cast<size_t>(c.experts) + 1));
  auto gsorted = test::must(test::poisoned<int32_t>(cap));
  auto grow = test::must(test::poisoned<int32_t>(cap));
  MoeRouteArgs a{c.bf16_logits ? nullptr : dlf.as<float>(),
                 c.bf16_logits ? dlb.as<uint16_t>() : nullptr,
                 dn.as<int32_t>(),
                 gids.as<int32_t>(),
                 gw.as<float>(),
                 gcounts.as<int32_t>(),
                 goff.as<int32_t>(),
                 gsorted.as<int32_t>(),
                 grow.as<int32_t>(),
                 c.capacity,
                 c.experts,
                 c.top_k,
                 c.norm};
  ASSERT_EQ(launch_moe_route(a, nullptr), cudaSuccess);
  const auto hid = test::must(test::download<int32_t>(gids, cap));
  const auto hw = test::must(test::download<float>(gw, cap));
  const auto hc = test::must(test::download<int32_t>(gcounts, static_cast<size_t>(c.experts)));
  const auto ho = test::must(test::download<int32_t>(goff, static_cast<size_t>(c.experts) + 1));
  const auto hs = test::must(test::download<int32_t>(gsorted, cap));
  const auto hr = test::must(test::download<int32_t>(grow, cap));
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(hid[i], ids[i]) << "entry " << i << " (token " << i / c.top_k << ")";
    ASSERT_NEAR(hw[i], w[i], 2e-6 * std::max(1.0f, std::abs(w[i]))) << "weight " << i;
  }
  for (size_t i = n; i < cap; ++i) ASSERT_EQ(hid[i], -1) << "entry past num_tokens written";
  EXPECT_EQ(hc, counts);
  EXPECT_EQ(ho, offsets);
  EXPECT_EQ(std::vector<int32_t>(hs.begin(), hs.begin() + static_cast<int64_t>(n)), sorted);
  EXPECT_EQ(std::vector<int32_t>(hr.begin(), hr.begin() + static_cast<int64_t>(n)), row_of);

  // combine: expert outputs y [cap, H] in sorted-row order
  const auto y = test::normal_bf16(rng, cap * c.width);
  const auto yf = test::to_f32(y);
  std::vector<float> ref(static_cast<size_t>(c.tokens) * c.width);
  moe_combine(yf.data(), c.width, ids.data(), w.data(), row_of.data(), c.tokens, c.top_k, ref.data());
  auto dy = test::must(test::upload(y));
  auto dout = test::must(test::poisoned<uint16_t>(static_cast<size_t>(c.capacity) * c.width));
  ASSERT_EQ(
      launch_moe_combine(dy.as<uint16_t>(), c.width, gids.as<int32_t>(), gw.as<float>(), grow.as<int32_t>(),
                         dn.as<int32_t>(), c.capacity, c.top_k, dout.as<uint16_t>(), nullptr),
      cudaSuccess);
  const auto got = test::must(test::download<uint16_t>(dout, static_cast<size_t>(c.capacity) * c.width));
  test::expect_close_bf16({got.begin(), got.begin() + static_cast<int64_t>(ref.size())}, ref, test::kBf16Rtol,
                          1e-5 * test::rms(ref), "combine");
  for (size_t i = ref.size(); i < got.size(); ++i) ASSERT_EQ(got[i], 0xFFFF) << "row past num_tokens written";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MoeRoute,
    ::testing::Values(MoeCase{8, 2, 1, 1, 64, false, true}, MoeCase{128, 8, 7, 9, 2048, false, true},
                      MoeCase{128, 8, 300, 320, 64, true, true}, MoeCase{60, 4, 33, 33, 128, false, false},
                      MoeCase{512, 10, 70, 80, 256, true, true}, MoeCase{1024, 32, 5, 6, 8, false, true},
                      MoeCase{3, 3, 40, 40, 16, true, false}));

TEST(MoeRouteArgs, RefusesBadShapes) {
  MoeRouteArgs a{};
  a.experts = 2000, a.top_k = 2, a.max_tokens = 1;
  EXPECT_EQ(launch_moe_route(a, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace mxq::cuda
