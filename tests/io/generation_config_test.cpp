// generation_config.json read as vLLM applies it: the keys it uses, int vs list eos ids, refusals that name
// the file, key and expected vs actual; non-regular and oversized files refused before any read; and the
// request > file > fallback merge of apply_generation_defaults.
#include "io/generation_config.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>

#include "temp_dir.h"

namespace mxq {
namespace {

// ---- accepted files: what each key becomes -------------------------------------------------------------
struct GoodCase {
  std::string name;
  std::string json;
  GenerationConfig expect;
};
void PrintTo(const GoodCase& c, std::ostream* os) { *os << c.name << ": " << c.json; }

GenerationConfig with(auto&& set) {
  GenerationConfig c;
  set(c);
  return c;
}

std::vector<GoodCase> good_cases() {
  return {
      {"empty_object", "{}", {}},
      {"eos_int", R"({"eos_token_id": 7})", with([](auto& c) { c.eos_token_ids = {7}; })},
      {"eos_list", R"({"eos_token_id": [7, 9, 7]})", with([](auto& c) {
         c.eos_token_ids = {7, 9, 7};
       })},
      {"eos_empty_list", R"({"eos_token_id": []})", {}},
      {"eos_null", R"({"eos_token_id": null})", {}},
      // Qwen3's own file: do_sample, pad and bos ids are not read (vLLM reads none of them either).
      {"qwen3_style",
       R"({"bos_token_id": 1, "pad_token_id": 2, "do_sample": true, "eos_token_id": [3, 4],
           "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"})",
       with([](auto& c) {
         c.eos_token_ids = {3, 4};
         c.temperature = 0.6f;
         c.top_k = 20;
         c.top_p = 0.95f;
       })},
      {"all_used_keys",
       R"({"temperature": 0, "top_p": 1, "min_p": 0.05, "top_k": -1, "repetition_penalty": 1.1,
           "max_new_tokens": 32})",
       with([](auto& c) {
         c.temperature = 0.0f;
         c.top_p = 1.0f;
         c.min_p = 0.05f;
         c.top_k = -1;
         c.repetition_penalty = 1.1f;
         c.max_new_tokens = 32;
       })},
      // note: do_sample false is not greedy in vLLM; the temperature stays as given.
      {"do_sample_false_keeps_temperature", R"({"do_sample": false, "temperature": 0.7})",
       with([](auto& c) { c.temperature = 0.7f; })},
      {"nulls_are_unset", R"({"temperature": null, "top_k": null, "max_new_tokens": null})", {}},
      {"unused_keys_ignored_whatever_their_type",
       R"({"num_beams": "four", "max_length": [1], "typical_p": {}, "length_penalty": null})",
       {}},
      {"edges", R"({"top_p": 1e-9, "min_p": 1, "temperature": 2.5, "top_k": 0, "max_new_tokens": 1})",
       with([](auto& c) {
         c.top_p = 1e-9f;
         c.min_p = 1.0f;
         c.temperature = 2.5f;
         c.top_k = 0;
         c.max_new_tokens = 1;
       })},
  };
}

class GenerationConfigGood : public testing::TestWithParam<GoodCase> {};

TEST_P(GenerationConfigGood, ReadsTheKeysVllmReads) {
  const GoodCase& c = GetParam();
  auto g = parse_generation_config(c.json, "gc.json");
  ASSERT_TRUE(g) << g.error().message;
  EXPECT_EQ(g->eos_token_ids, c.expect.eos_token_ids);
  EXPECT_EQ(g->temperature, c.expect.temperature);
  EXPECT_EQ(g->top_p, c.expect.top_p);
  EXPECT_EQ(g->min_p, c.expect.min_p);
  EXPECT_EQ(g->top_k, c.expect.top_k);
  EXPECT_EQ(g->repetition_penalty, c.expect.repetition_penalty);
  EXPECT_EQ(g->max_new_tokens, c.expect.max_new_tokens);
  EXPECT_EQ(g->empty(), c.expect.empty());
}

INSTANTIATE_TEST_SUITE_P(, GenerationConfigGood, testing::ValuesIn(good_cases()),
                         [](const auto& info) { return info.param.name; });

// ---- refused files: the message names the file, the key and expected vs actual -------------------------
struct BadCase {
  std::string name;
  std::string json;
  std::vector<std::string> needles;  // all must appear in the message
};
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name << ": " << c.json; }

std::vector<BadCase> bad_cases() {
  return {
      {"not_json", "{", {"gc.json", "invalid JSON"}},
      {"nan_literal", R"({"temperature": NaN})", {"gc.json", "invalid JSON"}},
      {"not_object", "[1, 2]", {"gc.json", "expected a JSON object", "array"}},
      {"eos_string", R"({"eos_token_id": "7"})", {"gc.json", "eos_token_id", "integer or a list", "\"7\""}},
      {"eos_float", R"({"eos_token_id": 7.0})", {"eos_token_id", "expected an integer", "7.0"}},
      {"eos_negative", R"({"eos_token_id": [1, -1]})", {"eos_token_id", "[0, 2147483647]", "-1"}},
      {"eos_huge", R"({"eos_token_id": 4294967296})", {"eos_token_id", "4294967296"}},
      {"eos_bool_in_list", R"({"eos_token_id": [true]})", {"eos_token_id", "boolean"}},
      {"eos_nested_list", R"({"eos_token_id": [[1]]})", {"eos_token_id", "array"}},
      {"top_p_2", R"({"top_p": 2})", {"gc.json", "top_p", "(0, 1]", "got 2"}},
      {"top_p_0", R"({"top_p": 0})", {"top_p", "(0, 1]", "got 0"}},
      {"min_p_negative", R"({"min_p": -0.1})", {"min_p", "[0, 1]", "-0.1"}},
      {"temperature_negative", R"({"temperature": -1})", {"temperature", "[0, inf)", "-1"}},
      // note: nlohmann refuses a number past double as JSON, before any key is read.
      {"temperature_overflow", R"({"temperature": 1e400})", {"gc.json", "number overflow", "1e400"}},
      {"temperature_past_float", R"({"temperature": 1e39})", {"temperature", "finite", "1e+39"}},
      {"temperature_string", R"({"temperature": "0.7"})", {"temperature", "expected a number", "string"}},
      {"temperature_bool", R"({"temperature": true})", {"temperature", "expected a number", "boolean"}},
      {"repetition_penalty_0", R"({"repetition_penalty": 0})", {"repetition_penalty", "(0, inf)", "got 0"}},
      {"top_k_float", R"({"top_k": 50.0})", {"top_k", "expected an integer", "50.0"}},
      {"top_k_below", R"({"top_k": -2})", {"top_k", "[-1, 2147483647]", "-2"}},
      {"max_new_tokens_0", R"({"max_new_tokens": 0})", {"max_new_tokens", "[1, 2147483647]", "got 0"}},
      {"max_new_tokens_string", R"({"max_new_tokens": "64"})", {"max_new_tokens", "string"}},
  };
}

class GenerationConfigBad : public testing::TestWithParam<BadCase> {};

TEST_P(GenerationConfigBad, IsRefusedByName) {
  const BadCase& c = GetParam();
  auto g = parse_generation_config(c.json, "gc.json");
  ASSERT_FALSE(g) << "accepted " << c.json;
  for (const std::string& n : c.needles) EXPECT_NE(g.error().message.find(n), std::string::npos) << n;
}

INSTANTIATE_TEST_SUITE_P(, GenerationConfigBad, testing::ValuesIn(bad_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(GenerationConfigPenalty, UnsupportedRepetitionPenaltyIsExposed) {
  auto one = parse_generation_config(R"({"repetition_penalty": 1.0})", "gc.json");
  auto more = parse_generation_config(R"({"repetition_penalty": 1.05})", "gc.json");
  ASSERT_TRUE(one && more);
  EXPECT_FALSE(one->unsupported_repetition_penalty());
  EXPECT_EQ(more->unsupported_repetition_penalty(), 1.05f);
}

// ---- files on disk ---------------------------------------------------------------------------------------
void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(GenerationConfigFile, AbsentIsEmptyNotAnError) {
  ScopedTempDir dir;
  auto g = load_generation_config(dir.path());
  ASSERT_TRUE(g) << g.error().message;
  EXPECT_TRUE(g->empty());
  auto missing_dir = load_generation_config(dir.path() + "/nonexistent");
  ASSERT_TRUE(missing_dir) << missing_dir.error().message;
}

TEST(GenerationConfigFile, ReadsARegularFileAndNamesItInErrors) {
  ScopedTempDir dir;
  write(dir.path() + "/generation_config.json", R"({"eos_token_id": [5, 6], "top_p": 0.9})");
  auto g = load_generation_config(dir.path());
  ASSERT_TRUE(g) << g.error().message;
  EXPECT_EQ(g->eos_token_ids, (std::vector<int64_t>{5, 6}));
  write(dir.path() + "/generation_config.json", R"({"top_p": 2})");
  auto bad = load_generation_config(dir.path());
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find(dir.path() + "/generation_config.json: top_p"), std::string::npos)
      << bad.error().message;
}

// Runs load_generation_config on another thread so a regression that blocks fails instead of hanging.
Result<GenerationConfig> load_within_seconds(const std::string& dir, int seconds) {
  auto f = std::async(std::launch::async, [dir] { return load_generation_config(dir); });
  if (f.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) {
    ADD_FAILURE() << "load_generation_config blocked";
    std::quick_exit(1);  // the thread cannot be joined; do not hang the suite
  }
  return f.get();
}

struct SpecialFileCase {
  std::string name;
  std::function<bool(const std::string& path)> make;  // false: the file could not be made (skip)
  std::string needle;
};
void PrintTo(const SpecialFileCase& c, std::ostream* os) { *os << c.name; }

std::vector<SpecialFileCase> special_file_cases() {
  return {
      {"fifo", [](const std::string& p) { return ::mkfifo(p.c_str(), 0600) == 0; }, "a FIFO"},
      {"link_to_dev_zero",
       [](const std::string& p) {
         std::error_code ec;
         std::filesystem::create_symlink("/dev/zero", p, ec);
         return !ec;
       },
       "a character device"},
      {"directory", [](const std::string& p) { return std::filesystem::create_directory(p); }, "a directory"},
      {"oversized",
       [](const std::string& p) {
         // note: a sparse 2 MiB file; the size check refuses it from fstat alone.
         std::error_code ec;
         write(p, "{}");
         std::filesystem::resize_file(p, (size_t{2} << 20), ec);
         return !ec;
       },
       "expected at most 1048576 bytes, the file has 2097152"},
  };
}

class GenerationConfigSpecialFile : public testing::TestWithParam<SpecialFileCase> {};

TEST_P(GenerationConfigSpecialFile, IsRefusedWithoutReading) {
  const SpecialFileCase& c = GetParam();
  ScopedTempDir dir;
  const std::string path = dir.path() + "/generation_config.json";
  if (!c.make(path)) GTEST_SKIP() << "could not make " << c.name;
  auto g = load_within_seconds(dir.path(), 10);
  ASSERT_FALSE(g);
  EXPECT_NE(g.error().message.find(path), std::string::npos) << g.error().message;
  EXPECT_NE(g.error().message.find(c.needle), std::string::npos) << g.error().message;
}

INSTANTIATE_TEST_SUITE_P(, GenerationConfigSpecialFile, testing::ValuesIn(special_file_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(GenerationConfigFile, ExactlyOneMibIsRead) {
  ScopedTempDir dir;
  std::string text = R"({"top_k": 3})";
  text.resize(size_t{1} << 20, ' ');  // trailing whitespace is valid JSON
  write(dir.path() + "/generation_config.json", text);
  auto g = load_generation_config(dir.path());
  ASSERT_TRUE(g) << g.error().message;
  EXPECT_EQ(g->top_k, 3);
}

// ---- the merge ------------------------------------------------------------------------------------------
struct MergeCase {
  std::string name;
  std::string file;
  SamplingRequest request;
  SamplingFallback fallback;
  ResolvedSampling expect;
};
void PrintTo(const MergeCase& c, std::ostream* os) { *os << c.name << ": " << c.file; }

std::vector<MergeCase> merge_cases() {
  SamplingFallback greedy;
  greedy.temperature = 0.0f;
  greedy.max_new_tokens = 64;
  SamplingRequest explicit_all{0.3f, 0.5f, 0.1f, 5, 1.0f, 9};
  SamplingRequest explicit_defaults;  // the user typed the CLI defaults: they still win over the file
  explicit_defaults.temperature = 0.0f;
  explicit_defaults.top_k = 0;
  return {
      {"nothing_anywhere_is_vllms_defaults", "{}", {}, {}, {1.0f, 1.0f, 0.0f, 0, 1.0f, 16, {}}},
      {"nothing_anywhere_with_greedy_fallback", "{}", {}, greedy, {0.0f, 1.0f, 0.0f, 0, 1.0f, 64, {}}},
      {"file_fills_what_request_left_out",
       R"({"temperature": 0.6, "top_k": 20, "top_p": 0.95, "max_new_tokens": 100})",
       {},
       greedy,
       {0.6f, 0.95f, 0.0f, 20, 1.0f, 100, {"temperature", "top_p", "top_k", "max_new_tokens"}}},
      {"request_wins_over_file",
       R"({"temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.2, "repetition_penalty": 1.2,
           "max_new_tokens": 100})",
       explicit_all,
       greedy,
       {0.3f, 0.5f, 0.1f, 5, 1.0f, 9, {}}},
      {"explicit_default_values_still_win",
       R"({"temperature": 0.6, "top_k": 20})",
       explicit_defaults,
       greedy,
       {0.0f, 1.0f, 0.0f, 0, 1.0f, 64, {}}},
      {"eos_only_file_changes_no_sampling",
       R"({"eos_token_id": 3, "do_sample": false})",
       {},
       greedy,
       {0.0f, 1.0f, 0.0f, 0, 1.0f, 64, {}}},
      {"repetition_penalty_reported",
       R"({"repetition_penalty": 1.3})",
       {},
       greedy,
       {0.0f, 1.0f, 0.0f, 0, 1.3f, 64, {"repetition_penalty"}}},
  };
}

class GenerationDefaults : public testing::TestWithParam<MergeCase> {};

TEST_P(GenerationDefaults, RequestThenFileThenFallback) {
  const MergeCase& c = GetParam();
  auto g = parse_generation_config(c.file, "gc.json");
  ASSERT_TRUE(g) << g.error().message;
  const ResolvedSampling r = apply_generation_defaults(*g, c.request, c.fallback);
  EXPECT_EQ(r.temperature, c.expect.temperature);
  EXPECT_EQ(r.top_p, c.expect.top_p);
  EXPECT_EQ(r.min_p, c.expect.min_p);
  EXPECT_EQ(r.top_k, c.expect.top_k);
  EXPECT_EQ(r.repetition_penalty, c.expect.repetition_penalty);
  EXPECT_EQ(r.max_new_tokens, c.expect.max_new_tokens);
  EXPECT_EQ(r.from_generation_config, c.expect.from_generation_config);
  EXPECT_EQ(r.max_new_tokens_from_generation_config(), c.expect.max_new_tokens_from_generation_config());
}

INSTANTIATE_TEST_SUITE_P(, GenerationDefaults, testing::ValuesIn(merge_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(GenerationStopIds, AddsFileEosNotAlreadyConfigJsons) {
  auto g = parse_generation_config(R"({"eos_token_id": [4091, 7, 9, 7]})", "gc.json");
  ASSERT_TRUE(g);
  const std::vector<int64_t> model_eos{4091};
  EXPECT_EQ(extra_stop_token_ids(*g, model_eos), (std::vector<int32_t>{7, 9}));
  EXPECT_TRUE(extra_stop_token_ids(GenerationConfig{}, model_eos).empty());
}

}  // namespace
}  // namespace mxq
