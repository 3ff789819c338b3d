// The CPU ops against transformers' own Qwen3 modules (tests/golden/make_cpu_ops_golden.py): pins the HF
// conventions (rotate_half pairing, GQA head mapping, causal offset, router softmax and topk ties).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>

#include "cpu/attention.h"
#include "cpu/moe_router.h"
#include "cpu/rms_norm.h"
#include "cpu/rope.h"
#include "test_util.h"

namespace mxq {
namespace {

const nlohmann::json& golden() {
  static const nlohmann::json data = [] {
    std::ifstream in(MXQ_SOURCE_DIR "/tests/golden/cpu/cpu_ops.json");
    return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }();
  return data;
}

std::vector<float> floats(const nlohmann::json& j) { return j.get<std::vector<float>>(); }
std::vector<double> doubles(const nlohmann::json& j) { return j.get<std::vector<double>>(); }

struct GoldenCase {
  std::string op;
  size_t index;
};
void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.op << "[" << c.index << "]"; }

std::vector<GoldenCase> cases_of(const std::string& op) {
  std::vector<GoldenCase> out;
  if (golden().is_discarded() || !golden().contains(op)) return {{op, 9999}};  // fails loudly below
  for (size_t i = 0; i < golden()[op].size(); ++i) out.push_back({op, i});
  return out;
}
std::string golden_name(const ::testing::TestParamInfo<GoldenCase>& i) {
  return i.param.op + std::to_string(i.param.index);
}

const nlohmann::json& case_json(const GoldenCase& c) {
  static const nlohmann::json none;
  if (golden().is_discarded() || !golden().contains(c.op) || c.index >= golden()[c.op].size()) return none;
  return golden()[c.op][c.index];
}

class CpuGoldenRmsNorm : public ::testing::TestWithParam<GoldenCase> {};
TEST_P(CpuGoldenRmsNorm, MatchesQwen3RMSNorm) {
  const nlohmann::json& j = case_json(GetParam());
  ASSERT_FALSE(j.is_null()) << "tests/golden/cpu/cpu_ops.json missing or unreadable";
  std::vector<float> x = floats(j["x"]), w = floats(j["weight"]);
  const auto dim = static_cast<int64_t>(w.size());
  std::vector<float> out(x.size());
  rms_norm(x.data(), static_cast<int64_t>(x.size()) / dim, dim, w.data(), j["eps"].get<float>(), out.data());
  EXPECT_LE(test::max_abs_diff(out, doubles(j["out"])), 2e-6);
}
INSTANTIATE_TEST_SUITE_P(CpuGoldenRmsNorm, CpuGoldenRmsNorm, ::testing::ValuesIn(cases_of("rms_norm")),
                         golden_name);

class CpuGoldenRope : public ::testing::TestWithParam<GoldenCase> {};
TEST_P(CpuGoldenRope, MatchesQwen3RotaryEmbedding) {
  const nlohmann::json& j = case_json(GetParam());
  ASSERT_FALSE(j.is_null()) << "tests/golden/cpu/cpu_ops.json missing or unreadable";
  std::vector<float> x = floats(j["x"]);
  const std::vector<int64_t> pos = j["positions"].get<std::vector<int64_t>>();
  ASSERT_TRUE(rope(x.data(), j["tokens"].get<int64_t>(), j["heads"].get<int64_t>(),
                   j["head_dim"].get<int64_t>(), pos.data(), j["theta"].get<float>()));
  // note: torch's f32 sin/cos and pow differ from correctly rounded ones by an ulp; at position 4095 an
  // ulp of inv_freq moves the angle by ~2.5e-4 * 2^-23 rad, far below this bound.
  EXPECT_LE(test::max_abs_diff(x, doubles(j["out"])), 1e-5);
}
INSTANTIATE_TEST_SUITE_P(CpuGoldenRope, CpuGoldenRope, ::testing::ValuesIn(cases_of("rope")), golden_name);

class CpuGoldenAttention : public ::testing::TestWithParam<GoldenCase> {};
TEST_P(CpuGoldenAttention, MatchesEagerAttentionForward) {
  const nlohmann::json& j = case_json(GetParam());
  ASSERT_FALSE(j.is_null()) << "tests/golden/cpu/cpu_ops.json missing or unreadable";
  std::vector<float> q = floats(j["q"]), k = floats(j["k"]), v = floats(j["v"]), out(q.size());
  ASSERT_TRUE(attention(q.data(), j["tokens"].get<int64_t>(), j["q_heads"].get<int64_t>(), k.data(), v.data(),
                        j["seq_len"].get<int64_t>(), j["kv_heads"].get<int64_t>(),
                        j["head_dim"].get<int64_t>(), out.data()));
  EXPECT_LE(test::max_abs_diff(out, doubles(j["out"])), 1e-5);
}
INSTANTIATE_TEST_SUITE_P(CpuGoldenAttention, CpuGoldenAttention, ::testing::ValuesIn(cases_of("attention")),
                         golden_name);

class CpuGoldenMoeRouter : public ::testing::TestWithParam<GoldenCase> {};
TEST_P(CpuGoldenMoeRouter, MatchesQwen3MoeTopKRouter) {
  const nlohmann::json& j = case_json(GetParam());
  ASSERT_FALSE(j.is_null()) << "tests/golden/cpu/cpu_ops.json missing or unreadable";
  const std::vector<float> logits = floats(j["logits"]);
  const auto tokens = j["tokens"].get<int64_t>(), experts = j["experts"].get<int64_t>(),
             k = j["top_k"].get<int64_t>();
  const std::vector<int32_t> want_ids = j["ids"].get<std::vector<int32_t>>();
  const std::vector<double> want_weights = doubles(j["weights"]);
  std::vector<int32_t> ids(want_ids.size());
  std::vector<float> weights(want_ids.size());
  ASSERT_TRUE(moe_router(logits.data(), tokens, experts, k, j["norm_topk_prob"].get<bool>(), ids.data(),
                         weights.data(), TopkTies::kTorchCpu));
  EXPECT_EQ(ids, want_ids);
  EXPECT_LE(test::max_abs_diff(weights, want_weights), 1e-6);

  // The default rule differs only in the order of exactly tied experts: same weights, same set per tie.
  std::vector<int32_t> lower_ids(ids.size());
  std::vector<float> lower_weights(ids.size());
  ASSERT_TRUE(moe_router(logits.data(), tokens, experts, k, j["norm_topk_prob"].get<bool>(), lower_ids.data(),
                         lower_weights.data()));
  EXPECT_EQ(lower_weights, weights);
}
INSTANTIATE_TEST_SUITE_P(CpuGoldenMoeRouter, CpuGoldenMoeRouter, ::testing::ValuesIn(cases_of("moe_router")),
                         golden_name);

// The golden data holds exact ties where torch's CPU order is not lower-index first (e.g. an all-zero
// hidden state routed to experts 6, 5 of 8): the kTorchCpu match above is not the default rule by chance.
TEST(CpuGoldenMoeRouter, GoldenTiesSeparateTheTwoTieRules) {
  ASSERT_FALSE(golden().is_discarded());
  int differing_rows = 0;
  for (const nlohmann::json& j : golden()["moe_router"]) {
    const std::vector<float> logits = floats(j["logits"]);
    const auto tokens = j["tokens"].get<int64_t>(), k = j["top_k"].get<int64_t>();
    std::vector<int32_t> ids(static_cast<size_t>(tokens * k));
    std::vector<float> weights(ids.size());
    ASSERT_TRUE(moe_router(logits.data(), tokens, j["experts"].get<int64_t>(), k,
                           j["norm_topk_prob"].get<bool>(), ids.data(), weights.data(),
                           TopkTies::kLowerIndex));
    const std::vector<int32_t> torch_ids = j["ids"].get<std::vector<int32_t>>();
    for (int64_t t = 0; t < tokens; ++t)
      differing_rows +=
          !std::equal(ids.begin() + t * k, ids.begin() + (t + 1) * k, torch_ids.begin() + t * k);
  }
  EXPECT_GT(differing_rows, 0);
}

}  // namespace
}  // namespace mxq
