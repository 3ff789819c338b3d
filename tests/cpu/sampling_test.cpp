#include "cpu/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <ostream>
#include <set>

#include "test_util.h"

namespace mxq {
namespace {

// Logits whose softmax is exactly the given probabilities (up to f32 rounding of log).
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

std::set<int32_t> observed_ids(const std::vector<float>& logits, const SamplingParams& p, int draws,
                               uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::set<int32_t> seen;
  for (int i = 0; i < draws; ++i) {
    Result<SampledToken> t = sample(logits.data(), static_cast<int64_t>(logits.size()), p, rng);
    EXPECT_TRUE(t) << t.error().message;
    seen.insert(t->id);
  }
  return seen;
}

// ---- cutoffs on a hand-built distribution ---------------------------------------------------------------
struct CutoffCase {
  const char* name;
  SamplingParams params;
  std::set<int32_t> kept;
};
void PrintTo(const CutoffCase& c, std::ostream* os) {
  *os << c.name << " T=" << c.params.temperature << " top_k=" << c.params.top_k << " top_p=" << c.params.top_p
      << " min_p=" << c.params.min_p;
}

class CpuSamplingCutoff : public ::testing::TestWithParam<CutoffCase> {};

// probs {.5, .25, .125, .0625, .0625}: ascending cumulative sums .0625 (id 4), .125 (id 3), .25, .5, 1.
// A token is cut when its ascending cumulative sum is <= 1 - top_p (vLLM), ids 3/4 tie and id 4 goes first.
TEST_P(CpuSamplingCutoff, KeepsExactlyTheExpectedTokens) {
  const CutoffCase& c = GetParam();
  const std::vector<float> logits = logits_of({0.5, 0.25, 0.125, 0.0625, 0.0625});
  EXPECT_EQ(observed_ids(logits, c.params, 3000, 11), c.kept);
}

INSTANTIATE_TEST_SUITE_P(
    CpuSamplingCutoff, CpuSamplingCutoff,
    ::testing::Values(CutoffCase{"all", {1.0f, 0, 1.0f, 0.0f, 0}, {0, 1, 2, 3, 4}},
                      CutoffCase{"top_p_0_9", {1.0f, 0, 0.9f, 0.0f, 0}, {0, 1, 2, 3}},
                      CutoffCase{"top_p_0_8", {1.0f, 0, 0.8f, 0.0f, 0}, {0, 1, 2}},
                      CutoffCase{"top_p_0_6", {1.0f, 0, 0.6f, 0.0f, 0}, {0, 1}},
                      CutoffCase{"top_p_0_3", {1.0f, 0, 0.3f, 0.0f, 0}, {0}},
                      CutoffCase{"top_p_0_01", {1.0f, 0, 0.01f, 0.0f, 0}, {0}},
                      CutoffCase{"top_k_3", {1.0f, 3, 1.0f, 0.0f, 0}, {0, 1, 2}},
                      // the 4th largest logit ties with the 5th: both kept, as vLLM's threshold does
                      CutoffCase{"top_k_4_tie", {1.0f, 4, 1.0f, 0.0f, 0}, {0, 1, 2, 3, 4}},
                      CutoffCase{"top_k_off_minus1", {1.0f, -1, 1.0f, 0.0f, 0}, {0, 1, 2, 3, 4}},
                      CutoffCase{"min_p_0_3", {1.0f, 0, 1.0f, 0.3f, 0}, {0, 1}},
                      CutoffCase{"min_p_0_2", {1.0f, 0, 1.0f, 0.2f, 0}, {0, 1, 2}},
                      CutoffCase{"min_p_then_top_k", {1.0f, 1, 1.0f, 0.2f, 0}, {0}},
                      CutoffCase{"greedy", {0.0f, 0, 1.0f, 0.0f, 0}, {0}}),
    [](const ::testing::TestParamInfo<CutoffCase>& i) { return std::string(i.param.name); });

// ---- greedy -----------------------------------------------------------------------------------------------
struct TemperatureCase {
  float temperature;
  uint64_t seed;
};
void PrintTo(const TemperatureCase& c, std::ostream* os) {
  *os << "T=" << c.temperature << " seed=" << c.seed;
}

class CpuSamplingGreedy : public ::testing::TestWithParam<TemperatureCase> {};

TEST_P(CpuSamplingGreedy, TopK1EqualsGreedyAndGreedyDrawsNothing) {
  const TemperatureCase& c = GetParam();
  std::mt19937_64 data(c.seed);
  std::vector<float> logits = test::random_floats(data, 1000, 3.0f);
  std::mt19937_64 rng(c.seed), untouched(c.seed);
  Result<SampledToken> greedy = sample(logits.data(), 1000, {0.0f, 0, 1.0f, 0.0f, 0}, rng);
  ASSERT_TRUE(greedy);
  EXPECT_EQ(rng, untouched);
  Result<SampledToken> k1 = sample(logits.data(), 1000, {c.temperature, 1, 1.0f, 0.0f, 0}, rng);
  ASSERT_TRUE(k1);
  EXPECT_EQ(k1->id, greedy->id);
  EXPECT_EQ(greedy->id, std::max_element(logits.begin(), logits.end()) - logits.begin());
}

INSTANTIATE_TEST_SUITE_P(CpuSamplingGreedy, CpuSamplingGreedy,
                         ::testing::Values(TemperatureCase{0.1f, 1}, TemperatureCase{1.0f, 2},
                                           TemperatureCase{2.5f, 3}, TemperatureCase{100.0f, 4}),
                         [](const ::testing::TestParamInfo<TemperatureCase>& i) {
                           return "case" + std::to_string(i.index) + "_seed" + std::to_string(i.param.seed);
                         });

// ---- frequencies ------------------------------------------------------------------------------------------
struct FrequencyCase {
  float temperature;
  int64_t top_k;
  int64_t vocab;
};
void PrintTo(const FrequencyCase& c, std::ostream* os) {
  *os << "T=" << c.temperature << " top_k=" << c.top_k << " vocab=" << c.vocab;
}

class CpuSamplingFrequency : public ::testing::TestWithParam<FrequencyCase> {};

// Counts over 40k seeded draws agree with softmax(logits / T) restricted to the top-k, within 5 sigma.
TEST_P(CpuSamplingFrequency, MatchesTheTemperedDistribution) {
  const FrequencyCase& c = GetParam();
  std::mt19937_64 data(c.vocab);
  std::vector<float> logits = test::random_floats(data, c.vocab, 1.5f);
  std::vector<int32_t> order(c.vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const int64_t kept = c.top_k > 0 ? c.top_k : c.vocab;
  std::vector<double> want(c.vocab, 0.0);
  double z = 0;
  for (int64_t j = 0; j < kept; ++j) z += want[order[j]] = std::exp(logits[order[j]] / c.temperature);
  for (double& w : want) w /= z;
  const int draws = 40000;
  std::vector<int> counts(c.vocab, 0);
  std::mt19937_64 rng(99);
  for (int i = 0; i < draws; ++i) {
    Result<SampledToken> t = sample(logits.data(), c.vocab, {c.temperature, c.top_k, 1.0f, 0.0f, 0}, rng);
    ASSERT_TRUE(t);
    ++counts[t->id];
  }
  for (int64_t i = 0; i < c.vocab; ++i) {
    const double mean = draws * want[i], sigma = std::sqrt(draws * want[i] * (1 - want[i]));
    EXPECT_NEAR(counts[i], mean, 5 * sigma + 1) << "token " << i << " p=" << want[i];
  }
}

INSTANTIATE_TEST_SUITE_P(CpuSamplingFrequency, CpuSamplingFrequency,
                         ::testing::Values(FrequencyCase{1.0f, 0, 8}, FrequencyCase{0.7f, 0, 50},
                                           FrequencyCase{1.3f, 5, 50}, FrequencyCase{2.0f, 0, 200}),
                         [](const ::testing::TestParamInfo<FrequencyCase>& i) {
                           return "case" + std::to_string(i.index) + "_vocab" + std::to_string(i.param.vocab);
                         });

TEST(CpuSampling, SameSeedSameTokensOtherSeedOtherTokens) {
  std::mt19937_64 data(5);
  std::vector<float> logits = test::random_floats(data, 500, 1.0f);
  const SamplingParams p{0.9f, 50, 0.95f, 0.01f, 0};
  auto run = [&](uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> ids;
    for (int i = 0; i < 64; ++i) ids.push_back(sample(logits.data(), 500, p, rng)->id);
    return ids;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

// Logprobs come from the unmodified logits (vLLM's raw logprobs), whatever temperature and filters did.
TEST(CpuSampling, LogprobsAreRawLogSoftmaxWithTopAlternatives) {
  std::vector<float> logits = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f, 2.0f};
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  std::mt19937_64 rng(3);
  Result<SampledToken> t = sample(logits.data(), 6, {0.5f, 2, 1.0f, 0.0f, 4}, rng);
  ASSERT_TRUE(t);
  EXPECT_TRUE(t->id == 1 || t->id == 2);
  EXPECT_NEAR(t->logprob, logits[t->id] - std::log(z), 1e-6);
  ASSERT_EQ(t->top_logprobs.size(), 4u);
  const int32_t want_ids[] = {1, 2, 5, 0};  // descending, the 3.0 tie by lower id
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(t->top_logprobs[j].id, want_ids[j]);
    EXPECT_NEAR(t->top_logprobs[j].logprob, logits[want_ids[j]] - std::log(z), 1e-6);
  }
}

// covers H-06 (NaN / out-of-range temperature, top_p, top_k, min_p, logprobs: refused, no out-of-bounds)
struct BadParamsCase {
  const char* name;
  SamplingParams params;
  const char* field;
};
void PrintTo(const BadParamsCase& c, std::ostream* os) { *os << c.name; }
class CpuSamplingRefuses : public ::testing::TestWithParam<BadParamsCase> {};

TEST_P(CpuSamplingRefuses, ByFieldName) {
  const BadParamsCase& c = GetParam();
  const std::vector<float> logits = {0.1f, 0.2f, 0.3f};
  std::mt19937_64 rng(1);
  Result<SampledToken> t = sample(logits.data(), 3, c.params, rng);
  ASSERT_FALSE(t);
  EXPECT_NE(t.error().message.find(c.field), std::string::npos) << t.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    CpuSamplingRefuses, CpuSamplingRefuses,
    ::testing::Values(BadParamsCase{"temperature_nan", {NAN, 0, 1.0f, 0.0f, 0}, "temperature"},
                      BadParamsCase{"temperature_neg", {-1.0f, 0, 1.0f, 0.0f, 0}, "temperature"},
                      BadParamsCase{"temperature_inf", {INFINITY, 0, 1.0f, 0.0f, 0}, "temperature"},
                      BadParamsCase{"top_k_minus2", {1.0f, -2, 1.0f, 0.0f, 0}, "top_k"},
                      BadParamsCase{"top_p_zero", {1.0f, 0, 0.0f, 0.0f, 0}, "top_p"},
                      BadParamsCase{"top_p_nan", {1.0f, 0, NAN, 0.0f, 0}, "top_p"},
                      BadParamsCase{"top_p_big", {1.0f, 0, 1.5f, 0.0f, 0}, "top_p"},
                      BadParamsCase{"min_p_neg", {1.0f, 0, 1.0f, -0.1f, 0}, "min_p"},
                      BadParamsCase{"logprobs_big", {1.0f, 0, 1.0f, 0.0f, 4}, "logprobs"},
                      BadParamsCase{"logprobs_neg", {1.0f, 0, 1.0f, 0.0f, -1}, "logprobs"}),
    [](const ::testing::TestParamInfo<BadParamsCase>& i) { return std::string(i.param.name); });

TEST(CpuSampling, RefusesNanAndAllMaskedLogits) {
  std::mt19937_64 rng(1);
  const std::vector<float> nan_logits = {0.1f, NAN}, masked = {-INFINITY, -INFINITY};
  EXPECT_NE(sample(nan_logits.data(), 2, {}, rng).error().message.find("token 1"), std::string::npos);
  EXPECT_FALSE(sample(masked.data(), 2, {}, rng));
}

}  // namespace
}  // namespace mxq
