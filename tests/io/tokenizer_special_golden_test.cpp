// Special tokens typed in text, against HF `tokenizers` on models/default/tokenizer.json
// (tests/golden/tokenizer/special_tokens.json from tests/golden/make_tokenizer_golden.py): whole, partial and
// malformed tokens, tokens glued to words or among whitespace, unicode and control characters around them.
// Ids must match exactly with special tokens parsed (Tokenizer.encode, what `mxq generate` does for a text
// prompt) and not (encode_special_tokens); decode must match HF's with skip_special_tokens false and true.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/tokenizer.h"

namespace mxq {
namespace {

const std::string kGoldenFile = MXQ_SOURCE_DIR "/tests/golden/tokenizer/special_tokens.json";

const nlohmann::json& golden() {
  static const nlohmann::json j = [] {
    std::ifstream in(kGoldenFile, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return nlohmann::json::parse(ss.str(), nullptr, false);
  }();
  return j;
}

const Tokenizer* qwen_default() {
  static const std::optional<Tokenizer> tok = [] {
    auto t = Tokenizer::load(MXQ_SOURCE_DIR "/models/default/tokenizer.json");
    return t ? std::optional<Tokenizer>(std::move(*t)) : std::nullopt;
  }();
  return tok ? &*tok : nullptr;
}

std::vector<std::string> case_names() {
  std::vector<std::string> out;
  if (golden().is_object())
    for (const auto& [name, _] : golden().items()) out.push_back(name);
  return out;
}

std::vector<int32_t> ids_of(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

TEST(SpecialTokenGoldenFile, PresentWithCases) {
  ASSERT_TRUE(golden().is_object()) << kGoldenFile;
  EXPECT_GE(golden().size(), 30u);
  ASSERT_NE(qwen_default(), nullptr);
}

class SpecialTokenGolden : public testing::TestWithParam<std::string> {};

TEST_P(SpecialTokenGolden, EncodeAndDecodeMatchHf) {
  const nlohmann::json& c = golden()[GetParam()];
  const Tokenizer* tok = qwen_default();
  ASSERT_NE(tok, nullptr);
  const std::string text = c["text"].get<std::string>();
  const auto ids = ids_of(c["ids"]);

  EXPECT_EQ(tok->encode(text, /*parse_special=*/true), ids);
  auto checked = tok->encode_checked(text, /*parse_special=*/true, size_t{1} << 20);
  ASSERT_TRUE(checked) << checked.error().message;
  EXPECT_EQ(*checked, ids);
  EXPECT_EQ(tok->encode(text, /*parse_special=*/false), ids_of(c["ids_special_as_text"]));

  const std::string decoded = c["decoded"].get<std::string>();
  EXPECT_EQ(tok->decode(ids, /*skip_special=*/false), decoded);
  EXPECT_EQ(tok->decode(ids, /*skip_special=*/true), c["decoded_skip_special"].get<std::string>());
  // note: the round trip gives the text back except where NFC changed it (e + U+0301 -> é), as in HF.

  StreamDecoder sd(*tok);
  std::string streamed;
  for (int32_t id : ids) streamed += sd.push(id);
  EXPECT_EQ(streamed + sd.finish(), decoded);
}

INSTANTIATE_TEST_SUITE_P(, SpecialTokenGolden, testing::ValuesIn(case_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace mxq
