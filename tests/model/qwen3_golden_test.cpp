// The CPU forward against transformers (tests/golden/make_model_golden.py): every scheme, dense and MoE,
// per-expert and stacked experts, tied and untied lm_head, attention bias, mlp_only_layers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "cpu/softmax.h"
#include "engine/sequence.h"
#include "golden_cases.h"
#include "model/cpu_backend.h"
#include "model/load_model.h"
#include "model/qwen3.h"

namespace mxq {
namespace {

// note: both sides compute in f32 on identical weights (the oracle dequantizes the same bytes), so the
// weight format does not enter the error: what is left is f32 summation order, measured at <= 1e-6 of the
// logit scale for every case (worst_relative_logit_error in the XML output). 1e-5 is a 10x margin.
constexpr double kLogitTolerance = 1e-5;

double max_abs_diff(const std::vector<float>& got, const nlohmann::json& want, double* scale) {
  double d = 0, s = 1;
  for (size_t i = 0; i < got.size(); ++i) {
    d = std::max(d, std::abs(static_cast<double>(got[i]) - want[i].get<double>()));
    s = std::max(s, std::abs(want[i].get<double>()));
  }
  *scale = s;
  return d;
}

class Qwen3Golden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(Qwen3Golden, GreedyIdsAndLogitsMatchTransformers) {
  const GoldenCase& c = GetParam();
  const nlohmann::json& gc = golden()["cases"][c.index];
  LoadOptions opt;
  if (!c.quantization.empty()) {
    auto f = parse_format(c.quantization);
    ASSERT_TRUE(f) << f.error().message;
    opt.quantization = *f;
  }
  auto model = load_model(kGolden + c.checkpoint, opt);
  ASSERT_TRUE(model) << model.error().message;
  auto backend = make_cpu_backend(2);
  auto qwen = Qwen3Model::create(model->config, model->store, *backend);
  ASSERT_TRUE(qwen) << qwen.error().message;
  const double tol = kLogitTolerance;
  const int64_t vocab = model->config.vocab_size;

  double worst = 0;  // max |logit error| / logit scale over all runs, reported in the XML output
  for (const auto& run : gc["runs"]) {
    const std::vector<int32_t> prompt = run["prompt"];
    const std::vector<int32_t> greedy = run["greedy"];
    const std::vector<double> margins = run["margins"];
    auto seq = Sequence::create(*qwen, static_cast<int64_t>(prompt.size() + greedy.size()));
    ASSERT_TRUE(seq) << seq.error().message;
    std::vector<float> logits(static_cast<size_t>(vocab));
    ASSERT_TRUE(seq->append(prompt, logits.data()));
    double scale = 1;
    const double prompt_err = max_abs_diff(logits, run["prompt_logits"], &scale);
    worst = std::max(worst, prompt_err / scale);
    EXPECT_LE(prompt_err, tol * scale) << "prompt logits, prompt of " << prompt.size() << " tokens";
    // Teacher-forced greedy: each step feeds the oracle's token, so one near-tie cannot derail the rest;
    // a step's argmax is compared whenever its top-2 margin is above the numeric noise.
    int compared = 0;
    for (size_t i = 0; i < greedy.size(); ++i) {
      if (margins[i] > 10 * tol * scale) {
        EXPECT_EQ(argmax(logits.data(), vocab), greedy[i]) << "greedy step " << i;
        ++compared;
      }
      const int32_t next[1] = {greedy[i]};
      ASSERT_TRUE(seq->append(next, logits.data()));
    }
    EXPECT_GE(compared, static_cast<int>(greedy.size()) - 2) << "too many near-ties to be a test";
    const double final_err = max_abs_diff(logits, run["final_logits"], &scale);
    worst = std::max(worst, final_err / scale);
    EXPECT_LE(final_err, tol * scale) << "logits after " << greedy.size() << " cached steps";
  }
  RecordProperty("worst_relative_logit_error", fmt::format("{:.3g}", worst));
}

INSTANTIATE_TEST_SUITE_P(Cases, Qwen3Golden, ::testing::ValuesIn(golden_cases()), golden_case_name);

}  // namespace
}  // namespace mxq
