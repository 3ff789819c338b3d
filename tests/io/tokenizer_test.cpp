// Tokenizer vs the HF `tokenizers` library: golden ids and decoded text from
// tests/golden/make_tokenizer_golden.py, for the default model's Qwen2-style tokenizer.json and a small
// GPT-2-style one; plus refusal of unsupported or malformed tokenizer.json files by name.
#include "io/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace mxq {
namespace {

const std::string kGolden = MXQ_SOURCE_DIR "/tests/golden/tokenizer/";

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str(), nullptr, false);
}

std::string tokenizer_path(const std::string& name) {
  return name == "qwen_default" ? MXQ_SOURCE_DIR "/models/default/tokenizer.json"
                                : kGolden + name + ".tokenizer.json";
}

// Loaded once per file; nullptr (and a recorded failure) when the file does not load.
const Tokenizer* tokenizer(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    auto t = Tokenizer::load(tokenizer_path(name));
    if (!t) {
      ADD_FAILURE() << t.error().message;
      return nullptr;
    }
    it = cache.emplace(name, std::move(*t)).first;
  }
  return &it->second;
}

struct GoldenCase {
  std::string tokenizer;  // qwen_default | gpt2_style
  std::string name;       // key in <tokenizer>.encode.json / .decode.json
};
void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.tokenizer << "/" << c.name; }
std::string case_name(const testing::TestParamInfo<GoldenCase>& info) {
  return info.param.tokenizer + "_" + info.param.name;
}

std::vector<GoldenCase> golden_cases(const char* suffix) {
  std::vector<GoldenCase> out;
  for (const char* tok : {"qwen_default", "gpt2_style", "split_literal"}) {
    const auto j = read_json(kGolden + tok + suffix);
    if (!j.is_object()) continue;  // the Golden*.FilesPresent test reports it
    for (const auto& [name, _] : j.items()) out.push_back({tok, name});
  }
  return out;
}

std::vector<int32_t> ids_of(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

std::string stream_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  StreamDecoder sd(tok, skip);
  std::string out;
  for (int32_t id : ids) {
    std::string piece = sd.push(id);
    // Every piece handed to a terminal must be whole UTF-8 on its own.
    EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << "no U+FFFD expected in stream-safe text";
    out += piece;
  }
  return out + sd.finish();
}

TEST(GoldenTokenizer, FilesPresent) {
  for (const char* f : {"texts.json", "qwen_default.encode.json", "qwen_default.decode.json",
                        "gpt2_style.encode.json", "gpt2_style.decode.json", "gpt2_style.tokenizer.json",
                        "split_literal.encode.json", "split_literal.tokenizer.json"}) {
    EXPECT_TRUE(read_json(kGolden + f).is_object()) << f;
  }
}

class GoldenEncode : public testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenEncode, MatchesHfTokenizers) {
  const GoldenCase& c = GetParam();
  static const auto texts = read_json(kGolden + "texts.json");
  const auto golden = read_json(kGolden + c.tokenizer + ".encode.json")[c.name];
  const std::string text = texts[c.name].get<std::string>();
  const Tokenizer* loaded = tokenizer(c.tokenizer);
  ASSERT_NE(loaded, nullptr);
  const Tokenizer& tok = *loaded;

  const auto ids = ids_of(golden["ids"]);
  EXPECT_EQ(tok.encode(text, /*parse_special=*/true), ids);
  // covers H-10: special tokens typed into user text are encoded as text on request
  const auto plain = golden.contains("ids_special_as_text") ? ids_of(golden["ids_special_as_text"]) : ids;
  EXPECT_EQ(tok.encode(text, /*parse_special=*/false), plain);

  const std::string decoded = golden.contains("decoded") ? golden["decoded"].get<std::string>() : text;
  const std::string decoded_skip =
      golden.contains("decoded_skip_special") ? golden["decoded_skip_special"].get<std::string>() : decoded;
  EXPECT_EQ(tok.decode(ids), decoded);
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), decoded_skip);
  if (decoded.find("\xEF\xBF\xBD") == std::string::npos) {
    EXPECT_EQ(stream_decode(tok, ids, false), decoded);
  }
}

INSTANTIATE_TEST_SUITE_P(Texts, GoldenEncode, testing::ValuesIn(golden_cases(".encode.json")), case_name);

class GoldenDecode : public testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenDecode, InvalidUtf8BoundariesMatchHf) {
  const GoldenCase& c = GetParam();
  const auto golden = read_json(kGolden + c.tokenizer + ".decode.json")[c.name];
  const Tokenizer* loaded = tokenizer(c.tokenizer);
  ASSERT_NE(loaded, nullptr);
  const Tokenizer& tok = *loaded;
  const auto ids = ids_of(golden["ids"]);
  const std::string decoded = golden["decoded"].get<std::string>();
  EXPECT_EQ(tok.decode(ids), decoded);
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), golden["decoded_skip_special"].get<std::string>());

  // Streaming pieces concatenate to HF's whole-sequence decode, U+FFFD included.
  StreamDecoder sd(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += sd.push(id);
  EXPECT_EQ(streamed + sd.finish(), decoded);

  // covers H-07: decode_checked refuses what decode skips, naming the id and the vocab size
  bool in_range = true;
  for (int32_t id : ids) in_range &= tok.token_bytes(id) != nullptr;
  const auto checked = tok.decode_checked(ids);
  EXPECT_EQ(checked.has_value(), in_range);
  if (!in_range) {
    EXPECT_NE(checked.error().message.find(fmt::format("vocab size {}", tok.vocab_size())), std::string::npos)
        << checked.error().message;
  }
}

INSTANTIATE_TEST_SUITE_P(Ids, GoldenDecode, testing::ValuesIn(golden_cases(".decode.json")), case_name);

TEST(Tokenizer, QwenSpecialTokens) {
  const Tokenizer* loaded = tokenizer("qwen_default");
  ASSERT_NE(loaded, nullptr);
  const Tokenizer& tok = *loaded;
  // note: ids as Qwen lays them out: the five added tokens follow the 4091 BPE ids.
  EXPECT_EQ(tok.vocab_size(), 4096);
  EXPECT_EQ(tok.token_id("<|endoftext|>"), 4091);
  EXPECT_EQ(tok.token_id("<|im_end|>"), 4093);
  EXPECT_EQ(tok.token_id("</think>"), 4095);
  EXPECT_EQ(tok.token_id("<|not_a_token|>"), std::nullopt);
  EXPECT_TRUE(tok.is_special(4093));
  EXPECT_FALSE(tok.is_special(4094));  // <think> is not special in Qwen3
  EXPECT_FALSE(tok.is_special(-1));
  EXPECT_FALSE(tok.is_special(4096));
}

TEST(Tokenizer, EncodeCheckedRefusesBadText) {
  const Tokenizer* loaded = tokenizer("qwen_default");
  ASSERT_NE(loaded, nullptr);
  const Tokenizer& tok = *loaded;
  // covers H-08: bad UTF-8 is refused with its offset
  const auto bad = tok.encode_checked("ok\xC3(", true, 100);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("offset 2"), std::string::npos) << bad.error().message;
  // covers H-11: a byte cap applies before any tokenization
  const auto big = tok.encode_checked(std::string(101, 'a'), true, 100);
  ASSERT_FALSE(big.has_value());
  EXPECT_NE(big.error().message.find("101 bytes"), std::string::npos) << big.error().message;
  EXPECT_TRUE(tok.encode_checked("fine", true, 100).has_value());
  // The unchecked path encodes invalid bytes as U+FFFD (the text Python's 'replace' decoding gives
  // `tokenizers`).
  EXPECT_EQ(tok.encode("a\xFF\xC3 b"), tok.encode("a\xEF\xBF\xBD\xEF\xBF\xBD b"));
}

// note: a floor far below the measured rate (see the report); it catches an accidental quadratic path,
// not a regression of a few percent on a shared machine.
TEST(Tokenizer, EncodeThroughput) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "timing is meaningless under sanitizers";
#endif
  const auto texts = read_json(kGolden + "texts.json");
  std::string corpus;
  for (int rep = 0; corpus.size() < (4u << 20); ++rep) {
    for (const auto& [name, t] : texts.items()) corpus += t.get<std::string>() + std::to_string(rep);
  }
  auto tok = Tokenizer::load(tokenizer_path("qwen_default"));  // a fresh, cold cache
  ASSERT_TRUE(tok.has_value());
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok->encode(corpus);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double mbps = static_cast<double>(corpus.size()) / s / 1e6;
  std::printf("encode: %.1f MB in %.3f s = %.1f MB/s, %.2f bytes/token\n", corpus.size() / 1e6, s, mbps,
              static_cast<double>(corpus.size()) / static_cast<double>(ids.size()));
  EXPECT_GT(mbps, 1.0);
}

// Malformed or unsupported tokenizer.json files: each is refused at load with a message naming the part.
struct BadFileCase {
  std::string name;
  std::function<void(nlohmann::json&)> mutate;
  std::string expect;  // substring of the error
};
void PrintTo(const BadFileCase& c, std::ostream* os) { *os << c.name; }

class BadTokenizerFile : public testing::TestWithParam<BadFileCase> {};

TEST_P(BadTokenizerFile, RefusedByName) {
  auto j = read_json(kGolden + "gpt2_style.tokenizer.json");
  ASSERT_TRUE(Tokenizer::from_json_text(j.dump(), "good.json").has_value());
  GetParam().mutate(j);
  const auto t = Tokenizer::from_json_text(j.dump(), "bad.json");
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.error().message.find("bad.json: "), std::string::npos) << t.error().message;
  EXPECT_NE(t.error().message.find(GetParam().expect), std::string::npos) << t.error().message;
  EXPECT_EQ(t.error().message.find('\n'), std::string::npos) << "one line";
}

using J = nlohmann::json;
INSTANTIATE_TEST_SUITE_P(
    Cases, BadTokenizerFile,
    testing::Values(
        BadFileCase{"normalizer_lowercase",
                    [](J& j) {
                      j["normalizer"] = {{"type", "Lowercase"}};
                    },
                    "normalizer 'Lowercase' is not supported"},
        BadFileCase{"normalizer_type_not_string",
                    [](J& j) {
                      j["normalizer"] = {{"type", 5}};
                    },
                    "JSON"},
        BadFileCase{"pre_tokenizer_metaspace",
                    [](J& j) {
                      j["pre_tokenizer"] = {{"type", "Metaspace"}};
                    },
                    "pre_tokenizer 'Metaspace' is not supported"},
        BadFileCase{"split_removed",
                    [](J& j) {
                      j["pre_tokenizer"] = {{"type", "Sequence"},
                                            {"pretokenizers",
                                             {{{"type", "Split"},
                                               {"pattern", {{"Regex", "\\s+"}}},
                                               {"behavior", "Removed"},
                                               {"invert", false}},
                                              j["pre_tokenizer"]}}};
                    },
                    "Split behavior 'Removed'"},
        BadFileCase{
            "split_bad_regex",
            [](J& j) {
              j["pre_tokenizer"] = {
                  {"type", "Sequence"},
                  {"pretokenizers",
                   {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
                    j["pre_tokenizer"]}}};
            },
            "does not compile"},
        BadFileCase{"no_byte_level",
                    [](J& j) {
                      j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", J::array()}};
                    },
                    "no ByteLevel step"},
        BadFileCase{"model_wordpiece", [](J& j) { j["model"]["type"] = "WordPiece"; },
                    "model type must be BPE"},
        BadFileCase{"byte_fallback", [](J& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback"},
        BadFileCase{"dropout", [](J& j) { j["model"]["dropout"] = 0.1; }, "dropout"},
        BadFileCase{"subword_prefix", [](J& j) { j["model"]["continuing_subword_prefix"] = "##"; },
                    "continuing_subword_prefix"},
        BadFileCase{"added_lstrip", [](J& j) { j["added_tokens"][0]["lstrip"] = true; }, "lstrip=true"},
        BadFileCase{"added_single_word", [](J& j) { j["added_tokens"][0]["single_word"] = true; },
                    "single_word=true"},
        BadFileCase{"added_duplicate", [](J& j) { j["added_tokens"].push_back(j["added_tokens"][0]); },
                    "listed twice"},
        BadFileCase{"merge_unknown_token", [](J& j) { j["model"]["merges"][3] = "Ġ zzzzqq"; }, "merge 3"},
        BadFileCase{"merge_three_parts", [](J& j) { j["model"]["merges"][0] = "a b c"; }, "merge 0"},
        // covers G-06: ids are range-checked before they size any table
        BadFileCase{"vocab_id_huge", [](J& j) { j["model"]["vocab"]["Ġ"] = int64_t{1} << 40; }, "has id"},
        BadFileCase{"vocab_id_negative", [](J& j) { j["model"]["vocab"]["Ġ"] = -3; }, "has id -3"},
        BadFileCase{"vocab_id_duplicate", [](J& j) { j["model"]["vocab"]["zzzzqq"] = 0; },
                    "vocab id 0 is used"},
        BadFileCase{"added_id_huge", [](J& j) { j["added_tokens"][0]["id"] = int64_t{1} << 31; }, "has id"},
        // issue 22: one id of 2^24 - 1 built 16M-entry tables (1.1 GB) before any refusal
        BadFileCase{"vocab_id_sparse", [](J& j) { j["model"]["vocab"]["Ġ"] = (int64_t{1} << 24) - 1; },
                    "ids must be dense"},
        BadFileCase{"added_id_sparse", [](J& j) { j["added_tokens"][0]["id"] = (int64_t{1} << 24) - 1; },
                    "ids must be dense"},
        BadFileCase{"post_processor_template",
                    [](J& j) {
                      j["post_processor"] = {{"type", "TemplateProcessing"}};
                    },
                    "post_processor 'TemplateProcessing'"},
        BadFileCase{"decoder_missing", [](J& j) { j["decoder"] = nullptr; }, "decoder null is not supported"},
        BadFileCase{"truncation_set",
                    [](J& j) {
                      j["truncation"] = {{"max_length", 8}};
                    },
                    "truncation"},
        BadFileCase{"not_json", [](J& j) { j = "not an object"; }, "not a JSON object"}),
    [](const testing::TestParamInfo<BadFileCase>& info) { return info.param.name; });

TEST(BadTokenizerFile, MissingFileNamesPath) {
  const auto t = Tokenizer::load("/nonexistent/tokenizer.json");
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.error().message.find("/nonexistent/tokenizer.json"), std::string::npos);
}

TEST(BadTokenizerFile, TruncatedJson) {
  // covers L-05: a truncated document is refused, not parsed in part
  const auto t = Tokenizer::from_json_text(R"({"model": {"type": "BPE", "vocab": {"a": )", "cut.json");
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.error().message.find("cut.json"), std::string::npos);
}

}  // namespace
}  // namespace mxq
