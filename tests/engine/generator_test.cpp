// Generation: request checks (bad_inputs H-03, H-04, H-06, H-07), stop token ids, EOS, seeds, logprobs,
// stop strings and streaming on the default model's tokenizer.
#include "engine/generator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "tiny_model.h"

namespace mxq {
namespace {

const std::string kSource = MXQ_SOURCE_DIR;

using test::TinyModel;

struct BadRequest {
  std::string name;
  std::vector<int32_t> prompt;
  GenerateParams params;
  std::string expect;
};
void PrintTo(const BadRequest& c, std::ostream* os) { *os << c.name; }

GenerateParams with(auto&& edit) {
  GenerateParams p;
  edit(p);
  return p;
}

class GeneratorRefuses : public ::testing::TestWithParam<BadRequest> {};

TEST_P(GeneratorRefuses, NamesTheFieldAndLimit) {
  const BadRequest& c = GetParam();
  Generator gen(*TinyModel::get().model, nullptr);
  auto g = gen.generate(c.prompt, c.params);
  ASSERT_FALSE(g);
  EXPECT_NE(g.error().message.find(c.expect), std::string::npos) << g.error().message;
}

const float kNaN = std::numeric_limits<float>::quiet_NaN();

INSTANTIATE_TEST_SUITE_P(
    Cases, GeneratorRefuses,
    ::testing::Values(
        BadRequest{"empty_prompt", {}, {}, "empty"},
        // covers H-07
        BadRequest{
            "id_at_vocab", {1, 256}, {}, "token id 256 at position 1 is outside the vocabulary [0, 256)"},
        BadRequest{"negative_id", {-1}, {}, "token id -1"},
        BadRequest{
            "stop_id_out_of_range", {1}, with([](auto& p) { p.stop_token_ids = {9999}; }), "stop_token_ids"},
        // covers H-03
        BadRequest{
            "prompt_beyond_context", std::vector<int32_t>(65, 1), {}, "65 tokens exceed the context of 64"},
        // covers H-04
        BadRequest{"prompt_plus_new_beyond_context", std::vector<int32_t>(60, 1),
                   with([](auto& p) { p.max_new_tokens = 5; }), "exceed the context of 64"},
        BadRequest{"zero_new_tokens", {1}, with([](auto& p) { p.max_new_tokens = 0; }), "max_new_tokens: 0"},
        // covers H-06
        BadRequest{
            "nan_temperature", {1}, with([](auto& p) { p.sampling.temperature = kNaN; }), "temperature"},
        BadRequest{"top_p_zero", {1}, with([](auto& p) { p.sampling.top_p = 0; }), "top_p"},
        BadRequest{"min_p_above_one", {1}, with([](auto& p) { p.sampling.min_p = 1.5f; }), "min_p"},
        BadRequest{"top_k_negative", {1}, with([](auto& p) { p.sampling.top_k = -2; }), "top_k"},
        BadRequest{
            "logprobs_beyond_vocab", {1}, with([](auto& p) { p.sampling.num_logprobs = 257; }), "logprobs"},
        BadRequest{"stop_string_without_tokenizer", {1}, with([](auto& p) { p.stop = {"x"}; }), "tokenizer"}),
    [](const auto& i) { return i.param.name; });

const nlohmann::json& dense_f32_golden() {
  static const nlohmann::json j = [] {
    auto all = nlohmann::json::parse(std::ifstream(kSource + "/tests/golden/model/cases.json"));
    for (const auto& c : all["cases"])
      if (c["name"] == "qwen3-dense-f32") return c;
    return nlohmann::json();
  }();
  return j;
}

TEST(Generator, GreedyThroughTheKvCacheEqualsTransformersGreedy) {
  Generator gen(*TinyModel::get().model, nullptr);
  for (const auto& run : dense_f32_golden()["runs"]) {
    const std::vector<int32_t> prompt = run["prompt"], want = run["greedy"];
    const std::vector<double> margins = run["margins"];
    auto g = gen.generate(prompt, with([&](auto& p) {
                            p.max_new_tokens = static_cast<int64_t>(want.size());
                            p.sampling.temperature = 0;
                            p.ignore_eos = true;
                          }));
    ASSERT_TRUE(g) << g.error().message;
    // note: free-running greedy, so compare up to the first near-tie of the oracle (margin < 1e-3).
    for (size_t i = 0; i < want.size() && margins[i] > 1e-3; ++i)
      EXPECT_EQ(g->token_ids[i], want[i]) << "step " << i;
  }
}

TEST(Generator, StopTokenIdEndsAndIsReportedButEosIgnoredWhenAsked) {
  Generator gen(*TinyModel::get().model, nullptr);
  const std::vector<int32_t> prompt = {1, 17, 42};
  auto base = gen.generate(prompt, with([](auto& p) {
                             p.max_new_tokens = 12;
                             p.sampling.temperature = 0;
                             p.ignore_eos = true;
                           }));
  ASSERT_TRUE(base);
  ASSERT_EQ(base->finish, FinishReason::kLength);
  const int32_t stop = base->token_ids[4];
  const size_t first =
      std::find(base->token_ids.begin(), base->token_ids.end(), stop) - base->token_ids.begin();
  auto g = gen.generate(prompt, with([&](auto& p) {
                          p.max_new_tokens = 12;
                          p.sampling.temperature = 0;
                          p.stop_token_ids = {stop};
                        }));
  ASSERT_TRUE(g);
  EXPECT_EQ(g->finish, FinishReason::kStopToken);
  EXPECT_EQ(g->token_ids, std::vector<int32_t>(base->token_ids.begin(), base->token_ids.begin() + first + 1));
}

TEST(Generator, SameSeedSameTokensAndLogprobsReported) {
  Generator gen(*TinyModel::get().model, nullptr);
  auto params = with([](auto& p) {
    p.max_new_tokens = 10;
    p.sampling.temperature = 1.0f;
    p.sampling.top_k = 20;
    p.sampling.num_logprobs = 3;
    p.seed = 1234;
    p.ignore_eos = true;
  });
  auto a = gen.generate(std::vector<int32_t>{1, 5}, params);
  auto b = gen.generate(std::vector<int32_t>{1, 5}, params);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->token_ids, b->token_ids);
  ASSERT_EQ(a->tokens.size(), 10u);
  for (const SampledToken& t : a->tokens) {
    ASSERT_EQ(t.top_logprobs.size(), 3u);
    EXPECT_LE(t.logprob, 0.0f);
    EXPECT_GE(t.top_logprobs[0].logprob, t.logprob) << "the best alternative is at least the chosen token";
  }
  params.seed = 99;
  auto c = gen.generate(std::vector<int32_t>{1, 5}, params);
  ASSERT_TRUE(c);
  EXPECT_NE(a->token_ids, c->token_ids) << "10 draws at temperature 1 over 20 tokens; a repeat is ~1e-13";
}

// Stop strings need text: the default model (bf16 as stored) and its tokenizer.
TEST(Generator, StopStringCutsTextAndStreamedPiecesConcatenate) {
  const std::string dir = kSource + "/models/default";
  auto loaded = load_model(dir);
  ASSERT_TRUE(loaded) << loaded.error().message;
  auto tok = Tokenizer::load(dir + "/tokenizer.json");
  ASSERT_TRUE(tok) << tok.error().message;
  auto backend = make_cpu_backend(2);
  auto model = Qwen3Model::create(loaded->config, loaded->store, *backend);
  ASSERT_TRUE(model);
  Generator gen(*model, &*tok);
  const auto prompt = tok->encode("Once upon a time");
  auto params = with([](auto& p) {
    p.max_new_tokens = 24;
    p.sampling.temperature = 0;
    p.ignore_eos = true;
  });
  auto full = gen.generate(prompt, params);
  ASSERT_TRUE(full) << full.error().message;
  EXPECT_EQ(full->text, tok->decode(full->token_ids));
  ASSERT_GT(full->text.size(), 12u);
  const std::string stop = full->text.substr(full->text.size() / 2, 3);
  params.stop = {stop};
  std::string streamed;
  auto cut = gen.generate(prompt, params, [&](std::string_view piece) {
    streamed += piece;
    return true;
  });
  ASSERT_TRUE(cut);
  EXPECT_EQ(cut->finish, FinishReason::kStopString);
  EXPECT_EQ(cut->text, full->text.substr(0, full->text.find(stop)));
  EXPECT_EQ(streamed, cut->text) << "streaming never emits part of the stop string";
}

}  // namespace
}  // namespace mxq
