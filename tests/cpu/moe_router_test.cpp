#include "cpu/moe_router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <ostream>

#include "test_util.h"

namespace mxq {
namespace {

struct RouterCase {
  int64_t tokens, experts, top_k;
  bool norm_topk_prob;
  int tie_groups;  // logits drawn from this many distinct values (0 = continuous, no ties)
};
void PrintTo(const RouterCase& c, std::ostream* os) {
  *os << "T=" << c.tokens << " E=" << c.experts << " k=" << c.top_k << (c.norm_topk_prob ? " norm" : "")
      << " ties=" << c.tie_groups;
}

class CpuMoeRouter : public ::testing::TestWithParam<RouterCase> {};

TEST_P(CpuMoeRouter, TopKOfF64SoftmaxWithLowerIndexFirstOnTies) {
  const RouterCase& c = GetParam();
  std::mt19937_64 rng(c.tokens * 13 + c.experts + c.tie_groups);
  std::vector<float> logits = test::random_floats(rng, c.tokens * c.experts, 2.0f);
  if (c.tie_groups > 0)
    for (float& l : logits) l = static_cast<float>(rng() % c.tie_groups) * 0.25f;  // many exact ties
  std::vector<int32_t> ids(c.tokens * c.top_k);
  std::vector<float> weights(ids.size());
  ASSERT_TRUE(
      moe_router(logits.data(), c.tokens, c.experts, c.top_k, c.norm_topk_prob, ids.data(), weights.data()));
  for (int64_t t = 0; t < c.tokens; ++t) {
    const float* l = logits.data() + t * c.experts;
    // Reference order: stable sort by logit descending; ties stay in index order.
    std::vector<int32_t> order(c.experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
    double m = *std::max_element(l, l + c.experts), z = 0, picked = 0;
    for (int64_t e = 0; e < c.experts; ++e) z += std::exp(l[e] - m);
    for (int64_t j = 0; j < c.top_k; ++j) picked += std::exp(l[order[j]] - m) / z;
    for (int64_t j = 0; j < c.top_k; ++j) {
      EXPECT_EQ(ids[t * c.top_k + j], order[j]) << "token " << t << " slot " << j;
      double want = std::exp(l[order[j]] - m) / z;
      if (c.norm_topk_prob) want /= picked;
      EXPECT_NEAR(weights[t * c.top_k + j], want, 1e-6 * want + 1e-9);
    }
  }
}

// Qwen3-30B-A3B routes 8 of 128; small and tie-heavy cases pin the tie rule.
INSTANTIATE_TEST_SUITE_P(CpuMoeRouter, CpuMoeRouter,
                         ::testing::Values(RouterCase{1, 8, 2, true, 0}, RouterCase{5, 8, 2, false, 0},
                                           RouterCase{17, 128, 8, true, 0}, RouterCase{64, 128, 8, false, 0},
                                           RouterCase{9, 16, 4, true, 3}, RouterCase{9, 16, 4, false, 2},
                                           RouterCase{4, 60, 60, true, 5}, RouterCase{3, 1, 1, true, 0}),
                         [](const ::testing::TestParamInfo<RouterCase>& i) {
                           const RouterCase& c = i.param;
                           return "T" + std::to_string(c.tokens) + "_E" + std::to_string(c.experts) + "_k" +
                                  std::to_string(c.top_k) + (c.norm_topk_prob ? "_norm" : "") + "_ties" +
                                  std::to_string(c.tie_groups);
                         });

TEST(CpuMoeRouter, RefusesTopKOutsideTheExpertCountByName) {
  const float logits[4] = {1, 2, 3, 4};
  int32_t ids[8];
  float w[8];
  EXPECT_NE(moe_router(logits, 1, 4, 5, true, ids, w).error().message.find("num_experts_per_tok"),
            std::string::npos);
  EXPECT_FALSE(moe_router(logits, 1, 4, 0, true, ids, w));
}

}  // namespace
}  // namespace mxq
