// OpenAI /v1/completions and /v1/chat/completions bodies, validated into what the engine runs: prompts as
// token ids, one GenerateParams, and the response options. Field names, defaults and ranges are vLLM's
// (vllm/entrypoints/openai/protocol.py); what mxq cannot honour is refused by name (bad_inputs H-03..H-11,
// H-17). Nothing here touches the engine: a request that parses is one the engine thread will accept,
// capacity aside.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/generator.h"
#include "io/tokenizer.h"
#include "server/json_body.h"

namespace mxq::server {

// Limits of one request (flags of `mxq serve`).
struct RequestLimits {
  int64_t max_n = 256;                   // samples per prompt (n)
  int64_t max_logprobs = 20;             // vLLM's --max-logprobs default
  size_t max_prompt_bytes = 1 << 20;     // text of one prompt / all messages, before tokenizing (H-11)
  size_t max_prompts = 1024;             // prompts of one completions request
  size_t max_stop = 64;                  // stop strings / stop token ids
  size_t max_stop_bytes = 1024;          // bytes of one stop string
  size_t max_messages = 4096;
};

// Sampling defaults of the checkpoint's generation_config.json (--generation-config auto) for fields a
// request leaves out.
struct SamplingDefaults {
  std::optional<float> temperature, top_p, min_p;
  std::optional<int64_t> top_k;
  std::optional<int64_t> max_tokens;  // max_new_tokens: chat's default, clamped to the context (vLLM)
};

struct ParseContext {
  const Tokenizer* tokenizer = nullptr;  // null: token-id prompts only
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;
  std::string model_name;
  SamplingDefaults defaults;
  RequestLimits limits;
};

struct PromptInput {
  std::vector<int32_t> ids;
  std::string text;  // the prompt as text (decoded when given as ids): echo
};

struct ParsedRequest {
  bool chat = false;
  std::vector<PromptInput> prompts;  // chat: exactly one
  GenerateParams params;             // max_new_tokens filled per prompt at submit (see max_tokens)
  std::optional<int64_t> max_tokens;  // nullopt: fill the context (chat), as vLLM
  bool max_tokens_is_default = false;  // from generation_config.json: clamped to the context, not refused
  uint64_t seed = 0;                  // sample i of a prompt draws with seed + i
  int64_t n = 1;
  bool stream = false, include_usage = false, continuous_usage = false;
  int64_t logprobs = -1;  // -1 off; else top alternatives per token (completions: logprobs; chat: top_logprobs)
  bool echo = false, include_stop_str_in_output = false;
  bool return_token_ids = false, return_tokens_as_token_ids = false;
  std::string request_id;  // vLLM's request_id extension (for /abort_request); "" = generated
};

ApiResult<ParsedRequest> parse_completion_request(const nlohmann::json& body, const ParseContext& ctx);
ApiResult<ParsedRequest> parse_chat_request(const nlohmann::json& body, const ParseContext& ctx);

// max_new_tokens of one prompt: the request's max_tokens, or what is left of the context; refuses a prompt
// that leaves no room (H-03, H-04) with vLLM's message.
ApiResult<int64_t> resolve_max_tokens(const ParsedRequest& r, const PromptInput& p, int64_t max_model_len);

}  // namespace mxq::server
