// OpenAI response bodies, built from the engine's outputs: the whole /v1/completions and
// /v1/chat/completions objects, and their streamed chunks (vLLM's fields: stop_reason, token_ids,
// prompt_token_ids, weight_version). One ChoiceState per choice accumulates what the engine has produced.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "io/tokenizer.h"
#include "server/request.h"

namespace mxq::server {

struct ResponseContext {
  const ParsedRequest* request;
  const Tokenizer* tokenizer;  // may be null (token ids only)
  std::string id;              // "cmpl-..." / "chatcmpl-..."
  std::string model;
  int64_t created;             // unix seconds
};

struct ChoiceState {
  size_t prompt = 0;  // index into request->prompts
  std::vector<SampledToken> tokens;
  std::string text;  // the completion text so far (no echo, stop string cut)
  bool finished = false;
  FinishReason finish = FinishReason::kLength;
  nlohmann::json stop_reason = nullptr;  // the stop string or stop token id that ended it (vLLM)
  bool sent_role = false;                // chat streaming: the first chunk carries the role
  size_t sent_tokens = 0;                // streaming: tokens already sent
  bool sent_prompt_ids = false;          // streaming completions: the choice's prompt_token_ids went out
  int64_t cached_tokens = 0;             // prompt tokens the prefix cache served
};

// Adds one engine output to its choice; at the end works out stop_reason and, with
// include_stop_str_in_output, appends the stop string to the text. Returns the text piece to stream.
std::string add_output(const ResponseContext& ctx, ChoiceState& c, const RequestOutput& out);

// The full response (non-streaming).
nlohmann::json completion_response(const ResponseContext& ctx, const std::vector<ChoiceState>& choices,
                                   const std::string& weight_version);
// One streamed chunk for choice `index` carrying `piece` and the tokens not yet sent (marks them sent).
nlohmann::json stream_chunk(const ResponseContext& ctx, size_t index, ChoiceState& c, const std::string& piece,
                            const std::string& weight_version);
// The chat stream's first chunk for a choice (role, empty content), sent before any token.
nlohmann::json chat_role_chunk(const ResponseContext& ctx, size_t index);
// The final usage chunk (stream_options.include_usage): no choices.
nlohmann::json usage_chunk(const ResponseContext& ctx, const std::vector<ChoiceState>& choices);
nlohmann::json usage_json(const ResponseContext& ctx, const std::vector<ChoiceState>& choices);

// The text a token is reported as in logprobs: its bytes with invalid UTF-8 replaced, or "token_id:N".
std::string token_string(const Tokenizer* tok, int32_t id, bool as_ids);

}  // namespace mxq::server
