// Request parsing of `mxq serve`: every bad body is a 400 (404, 415) naming its field, never an exception
// (bad_inputs H-03..H-11, H-17), and good bodies become the engine parameters vLLM would use.
#include "server/request.h"

#include <gtest/gtest.h>

#include <string>

#include "server/json_body.h"

namespace mxq::server {
namespace {

const Tokenizer& tokenizer() {
  static const Tokenizer t = *Tokenizer::load(std::string(MXQ_SOURCE_DIR) + "/models/default/tokenizer.json");
  return t;
}

ParseContext context() {
  ParseContext c;
  c.tokenizer = &tokenizer();
  c.vocab_size = tokenizer().vocab_size();
  c.max_model_len = 2048;
  c.model_name = "default";
  return c;
}

struct BadCase {
  const char* name;
  bool chat;
  const char* body;
  int status;
  const char* param;    // expected error param ("" = none)
  const char* message;  // a substring of the message
};

class BadRequest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadRequest, IsRefusedByName) {
  const BadCase& c = GetParam();
  auto j = parse_json_object(c.body);
  std::optional<ApiError> err;
  if (!j) {
    err = j.error();
  } else {
    auto r = c.chat ? parse_chat_request(*j, context()) : parse_completion_request(*j, context());
    if (!r) {
      err = r.error();
    } else {
      auto mt = resolve_max_tokens(*r, r->prompts[0], 2048);
      if (!mt) err = mt.error();
    }
  }
  ASSERT_TRUE(err.has_value()) << c.body;
  EXPECT_EQ(err->status, c.status);
  EXPECT_EQ(err->param, c.param);
  EXPECT_NE(err->message.find(c.message), std::string::npos) << err->message;
  EXPECT_EQ(err->message.find('\n'), std::string::npos) << "one line";
}

const BadCase kBad[] = {
    // H-08: not an object, duplicate keys, bad UTF-8, empty prompt / messages
    {"array_body", false, "[1,2]", 400, "", "expected a JSON object"},
    {"not_json", false, "{\"prompt\": ", 400, "", "not valid JSON"},
    {"duplicate_key", false, R"({"prompt": "a", "max_tokens": 1, "max_tokens": 100000})", 400, "max_tokens",
     "duplicate key"},
    {"nested_duplicate", true, R"({"messages": [{"role": "user", "role": "system", "content": "x"}]})", 400, "role",
     "duplicate key"},
    {"bad_utf8", false, "{\"prompt\": \"\xff\xfe\"}", 400, "", "not valid JSON"},
    {"empty_prompt", false, R"({"prompt": ""})", 400, "prompt", "empty prompt"},
    {"empty_prompt_list", false, R"({"prompt": []})", 400, "prompt", "expected a string"},
    {"missing_prompt", false, R"({"max_tokens": 3})", 400, "prompt", "missing"},
    {"empty_messages", true, R"({"messages": []})", 400, "messages", "non-empty"},
    {"unknown_role", true, R"({"messages": [{"role": "wizard", "content": "x"}]})", 400, "messages", "role"},
    {"mixed_prompt_list", false, R"({"prompt": ["a", [1, 2]]})", 400, "prompt", "first one's kind"},
    // H-03 / H-04: context and max_tokens
    {"max_tokens_zero", false, R"({"prompt": "a", "max_tokens": 0})", 400, "max_tokens", "[1, 2147483647]"},
    {"max_tokens_negative", false, R"({"prompt": "a", "max_tokens": -1})", 400, "max_tokens", "expected an integer"},
    {"max_tokens_huge", false, R"({"prompt": "a", "max_tokens": 2147483648})", 400, "max_tokens", "2147483647"},
    {"past_context", false, R"({"prompt": "a", "max_tokens": 2048})", 400, "prompt", "maximum context length is 2048"},
    {"max_tokens_float", false, R"({"prompt": "a", "max_tokens": 1.5})", 400, "max_tokens", "expected an integer"},
    // H-05: n and logprobs bounded before anything is allocated
    {"n_huge", false, R"({"prompt": "a", "n": 1000000000})", 400, "n", "[1, 256]"},
    {"n_zero", false, R"({"prompt": "a", "n": 0})", 400, "n", "[1, 256]"},
    {"logprobs_huge", false, R"({"prompt": "a", "logprobs": 1000000})", 400, "logprobs", "[0, 20]"},
    {"top_logprobs_huge", true, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true,
       "top_logprobs": 21})", 400, "top_logprobs", "[0, 20]"},
    {"top_logprobs_without_logprobs", true, R"({"messages": [{"role": "user", "content": "x"}],
       "top_logprobs": 2})", 400, "top_logprobs", "needs logprobs"},
    // H-06: sampling ranges
    {"temperature_negative", false, R"({"prompt": "a", "temperature": -0.5})", 400, "temperature", "[0, "},
    {"top_p_zero", false, R"({"prompt": "a", "top_p": 0})", 400, "top_p", "(0, 1]"},
    {"top_p_big", false, R"({"prompt": "a", "top_p": 1.5})", 400, "top_p", "[0, 1]"},
    {"top_k_negative", false, R"({"prompt": "a", "top_k": -2})", 400, "top_k", "[-1, "},
    {"min_p_big", false, R"({"prompt": "a", "min_p": 2})", 400, "min_p", "[0, 1]"},
    {"temperature_string", false, R"({"prompt": "a", "temperature": "hot"})", 400, "temperature", "a string"},
    // H-07: token ids
    {"prompt_id_past_vocab", false, R"({"prompt": [1, 999999]})", 400, "prompt", "[0, 4096)"},
    {"prompt_id_negative", false, R"({"prompt": [[1, -1]]})", 400, "prompt[0]", "[0, 4096)"},
    {"stop_id_past_vocab", false, R"({"prompt": "a", "stop_token_ids": [4096]})", 400, "stop_token_ids",
     "[0, 4096)"},
    {"logit_bias", false, R"({"prompt": "a", "logit_bias": {"99999": 5}})", 400, "logit_bias", "not supported"},
    // H-09 / H-17: grammars, tools and media are refused by name
    {"response_format_schema", true, R"({"messages": [{"role": "user", "content": "x"}],
       "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})", 400, "response_format",
     "not supported"},
    {"guided_regex", false, R"({"prompt": "a", "guided_regex": "(a"})", 400, "guided_regex", "not supported"},
    {"tools", true, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", 400,
     "tools", "not supported"},
    {"image_url", true, R"({"messages": [{"role": "user", "content": [{"type": "image_url",
       "image_url": {"url": "file:///etc/passwd"}}]}]})", 400, "messages[0].content", "text only"},
    // H-10: special tokens typed into chat messages
    {"special_in_message", true, R"({"messages": [{"role": "user", "content": "hi<|im_end|>"}]})", 400, "messages",
     "special token"},
    // H-11: a byte cap before tokenizing
    // (covered with a generated body in PromptOverByteCap below)
    // fields mxq does not implement
    {"unknown_field", false, R"({"prompt": "a", "frobnicate": 1})", 400, "frobnicate", "unsupported field"},
    {"penalty", false, R"({"prompt": "a", "presence_penalty": 0.5})", 400, "presence_penalty", "not supported"},
    {"echo_logprobs", false, R"({"prompt": "a", "echo": true, "logprobs": 1})", 400, "echo", "echo with logprobs"},
    {"stream_options_without_stream", false, R"({"prompt": "a", "stream_options": {"include_usage": true}})", 400,
     "stream_options", "only allowed when stream"},
    {"wrong_model", false, R"({"prompt": "a", "model": "gpt-4"})", 404, "model", "does not exist"},
    {"empty_stop", false, R"({"prompt": "a", "stop": [""]})", 400, "stop", "empty stop string"},
};

INSTANTIATE_TEST_SUITE_P(Server, BadRequest, ::testing::ValuesIn(kBad),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ServerRequest, PromptOverByteCap) {
  // covers H-11: 2 MiB of text is refused by its size before the tokenizer sees it
  nlohmann::json body{{"prompt", std::string(size_t{2} << 20, 'a')}};
  auto r = parse_completion_request(body, context());
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("bytes"), std::string::npos) << r.error().message;
}

TEST(ServerRequest, DefaultsAreVllms) {
  auto j = parse_json_object(R"({"prompt": "def f():", "seed": 7})");
  ASSERT_TRUE(j);
  auto r = parse_completion_request(*j, context());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->max_tokens, 16);  // completions default
  EXPECT_EQ(r->params.sampling.temperature, 1.0f);
  EXPECT_EQ(r->params.sampling.top_p, 1.0f);
  EXPECT_TRUE(r->params.skip_special_tokens);
  EXPECT_EQ(r->seed, 7u);
  EXPECT_EQ(r->prompts[0].ids, tokenizer().encode("def f():"));
}

TEST(ServerRequest, GenerationConfigDefaultsApplyToMissingFieldsOnly) {
  ParseContext c = context();
  c.defaults.temperature = 0.6f;
  c.defaults.top_k = 20;
  auto r = parse_completion_request(nlohmann::json{{"prompt", "a"}, {"top_k", 5}}, c);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->params.sampling.temperature, 0.6f);
  EXPECT_EQ(r->params.sampling.top_k, 5);
}

TEST(ServerRequest, GenerationConfigMaxNewTokensIsChatsDefaultClampedToTheContext) {
  ParseContext c = context();
  c.defaults.max_tokens = 100000;
  const nlohmann::json body = nlohmann::json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})");
  auto r = parse_chat_request(body, c);
  ASSERT_TRUE(r);
  auto mt = resolve_max_tokens(*r, r->prompts[0], 2048);
  ASSERT_TRUE(mt) << mt.error().message;
  EXPECT_EQ(*mt, 2048 - static_cast<int64_t>(r->prompts[0].ids.size()));
  // a request's own max_tokens past the context is still refused
  auto own = parse_chat_request(
      nlohmann::json::parse(R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000})"), c);
  ASSERT_TRUE(own);
  EXPECT_FALSE(resolve_max_tokens(*own, own->prompts[0], 2048));
}

TEST(ServerRequest, PromptForms) {
  const ParseContext c = context();
  auto a = parse_completion_request(nlohmann::json{{"prompt", {"a", "b"}}}, c);
  auto b = parse_completion_request(nlohmann::json{{"prompt", {1, 2, 3}}}, c);
  auto d = parse_completion_request(nlohmann::json{{"prompt", {{1, 2}, {3}}}}, c);
  ASSERT_TRUE(a && b && d);
  EXPECT_EQ(a->prompts.size(), 2u);
  ASSERT_EQ(b->prompts.size(), 1u);
  EXPECT_EQ(b->prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(d->prompts.size(), 2u);
  // note: special tokens typed in a completion prompt encode as their ids (HF tokenizers' default)
  auto s = parse_completion_request(nlohmann::json{{"prompt", "x<|endoftext|>"}}, c);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->prompts[0].ids.back(), *tokenizer().token_id("<|endoftext|>"));
}

TEST(ServerRequest, ChatRendersQwen3Template) {
  auto r = parse_chat_request(
      nlohmann::json::parse(R"({"messages": [{"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "chat_template_kwargs": {"enable_thinking": false}, "max_completion_tokens": 5})"),
      context());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->prompts[0].text,
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n");
  EXPECT_EQ(r->max_tokens, 5);
}

}  // namespace
}  // namespace mxq::server
