// Qwen3 chat rendering vs transformers' apply_chat_template on Qwen3's own Jinja template (golden data from
// tests/golden/make_tokenizer_golden.py), and the refusals of inputs the fixed template does not cover.
#include "io/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/tokenizer.h"

namespace mxq {
namespace {

nlohmann::json golden() {
  std::ifstream in(MXQ_SOURCE_DIR "/tests/golden/tokenizer/chat_qwen3.json", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str(), nullptr, false);
}

struct ChatCase {
  std::string name;
  std::vector<ChatMessage> messages;
  ChatOptions options;
  std::string rendered;  // transformers' output
};

void PrintTo(const ChatCase& c, std::ostream* os) {
  *os << c.name << " gen=" << c.options.add_generation_prompt << " thinking="
      << (c.options.enable_thinking ? (*c.options.enable_thinking ? "true" : "false") : "unset");
}

std::vector<ChatCase> chat_cases() {
  std::vector<ChatCase> out;
  const auto j = golden();
  if (!j.is_array()) return out;  // ChatGolden.FilePresent reports it
  for (const auto& c : j) {
    ChatCase cc{c["name"].get<std::string>(), {}, {}, c["rendered"].get<std::string>()};
    for (const auto& m : c["messages"]) {
      ChatMessage msg{m["role"].get<std::string>(), m["content"].get<std::string>(), std::nullopt};
      if (m.contains("reasoning_content")) msg.reasoning_content = m["reasoning_content"].get<std::string>();
      cc.messages.push_back(std::move(msg));
    }
    cc.options.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    if (!c["enable_thinking"].is_null()) cc.options.enable_thinking = c["enable_thinking"].get<bool>();
    out.push_back(std::move(cc));
  }
  return out;
}

TEST(ChatGolden, FilePresent) { EXPECT_TRUE(golden().is_array()); }

class ChatGolden : public testing::TestWithParam<ChatCase> {};

TEST_P(ChatGolden, MatchesTransformers) {
  const ChatCase& c = GetParam();
  const auto r = render_qwen3_chat(c.messages, c.options);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(*r, c.rendered);
}

INSTANTIATE_TEST_SUITE_P(Conversations, ChatGolden, testing::ValuesIn(chat_cases()),
                         [](const testing::TestParamInfo<ChatCase>& info) {
                           const auto& o = info.param.options;
                           return info.param.name + (o.add_generation_prompt ? "_gen" : "") +
                                  (o.enable_thinking ? (*o.enable_thinking ? "_think" : "_nothink") : "");
                         });

TEST(ChatTemplate, RendersToSpecialTokenIds) {
  // The markers of the rendered prompt encode to the default tokenizer's special ids, not to text pieces.
  auto tok = Tokenizer::load(MXQ_SOURCE_DIR "/models/default/tokenizer.json");
  ASSERT_TRUE(tok.has_value()) << tok.error().message;
  const std::vector<ChatMessage> msgs{{"user", "hi", std::nullopt}};
  const auto r = render_qwen3_chat(msgs, {.add_generation_prompt = true, .enable_thinking = false});
  ASSERT_TRUE(r.has_value());
  const auto ids = tok->encode(*r);
  EXPECT_EQ(ids.front(), *tok->token_id("<|im_start|>"));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *tok->token_id("<|im_end|>")), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *tok->token_id("</think>")), 1);
}

struct BadChat {
  std::string name;
  std::vector<ChatMessage> messages;
  std::string expect;
};
void PrintTo(const BadChat& c, std::ostream* os) { *os << c.name; }

class ChatRefused : public testing::TestWithParam<BadChat> {};

// covers H-08: empty message lists and unknown roles are errors naming the message
TEST_P(ChatRefused, NamesTheProblem) {
  const auto r = render_qwen3_chat(GetParam().messages, {});
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find(GetParam().expect), std::string::npos) << r.error().message;
}

INSTANTIATE_TEST_SUITE_P(Cases, ChatRefused,
                         testing::Values(BadChat{"empty", {}, "no messages"},
                                         BadChat{"developer_role",
                                                 {{"user", "a", {}}, {"developer", "b", {}}},
                                                 "message 1 has role 'developer'"},
                                         BadChat{"empty_role", {{"", "a", {}}}, "message 0 has role ''"}),
                         [](const testing::TestParamInfo<BadChat>& info) { return info.param.name; });

}  // namespace
}  // namespace mxq
