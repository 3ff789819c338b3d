#include "server/response.h"

#include "io/utf8_text.h"

namespace mxq::server {
namespace {

using nlohmann::json;

size_t code_points(std::string_view s) {
  size_t n = 0;
  for (const char ch : s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
  return n;
}

json bytes_json(const Tokenizer* tok, int32_t id) {
  json out = json::array();
  const std::string* b = tok ? tok->token_bytes(id) : nullptr;
  if (b)
    for (const char ch : *b) out.push_back(static_cast<unsigned char>(ch));
  return out;
}

// Completions logprobs (OpenAI's legacy object) of tokens [from, to): the top_logprobs dict holds the
// request's top-k plus the sampled token, as vLLM reports it.
json completion_logprobs(const ResponseContext& ctx, const ChoiceState& c, size_t from, size_t to,
                         size_t text_offset) {
  const bool as_ids = ctx.request->return_tokens_as_token_ids;
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (size_t i = from; i < to; ++i) {
    const SampledToken& t = c.tokens[i];
    const std::string s = token_string(ctx.tokenizer, t.id, as_ids);
    tokens.push_back(s);
    lps.push_back(t.logprob);
    json top = json::object();
    for (const TokenLogprob& a : t.top_logprobs) top[token_string(ctx.tokenizer, a.id, as_ids)] = a.logprob;
    top[s] = t.logprob;
    tops.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += code_points(s);
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json chat_logprobs(const ResponseContext& ctx, const ChoiceState& c, size_t from, size_t to) {
  const bool as_ids = ctx.request->return_tokens_as_token_ids;
  json content = json::array();
  for (size_t i = from; i < to; ++i) {
    const SampledToken& t = c.tokens[i];
    json top = json::array();
    for (const TokenLogprob& a : t.top_logprobs)
      top.push_back({{"token", token_string(ctx.tokenizer, a.id, as_ids)},
                     {"logprob", a.logprob},
                     {"bytes", bytes_json(ctx.tokenizer, a.id)}});
    content.push_back({{"token", token_string(ctx.tokenizer, t.id, as_ids)},
                       {"logprob", t.logprob},
                       {"bytes", bytes_json(ctx.tokenizer, t.id)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

std::vector<int32_t> ids_of(const ChoiceState& c, size_t from, size_t to) {
  std::vector<int32_t> ids;
  for (size_t i = from; i < to; ++i) ids.push_back(c.tokens[i].id);
  return ids;
}

// Offset (in code points) where a completion's logprob text starts: after the echoed prompt.
size_t echo_offset(const ResponseContext& ctx, const ChoiceState& c) {
  return ctx.request->echo ? code_points(ctx.request->prompts[c.prompt].text) : 0;
}

}  // namespace

std::string token_string(const Tokenizer* tok, int32_t id, bool as_ids) {
  if (as_ids || !tok) return fmt::format("token_id:{}", id);
  const std::string* b = tok->token_bytes(id);
  return b ? utf8::lossy(*b) : std::string();
}

std::string add_output(const ResponseContext& ctx, ChoiceState& c, const RequestOutput& out) {
  c.tokens.insert(c.tokens.end(), out.tokens.begin(), out.tokens.end());
  c.cached_tokens = out.cached_tokens;
  std::string piece = out.text;
  c.text += out.text;
  if (!out.finished) return piece;
  c.finished = true;
  c.finish = out.finish;
  const GenerateParams& p = ctx.request->params;
  if (out.finish == FinishReason::kStopToken && !c.tokens.empty()) {
    const int32_t last = c.tokens.back().id;
    // note: EOS reports stop_reason null; a listed stop_token_ids entry reports its id (vLLM).
    if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), last) != p.stop_token_ids.end())
      c.stop_reason = last;
  } else if (out.finish == FinishReason::kStopString && ctx.tokenizer) {
    // The engine cut the text where the first stop string began; the full decode says which one it was.
    const std::vector<int32_t> ids = ids_of(c, 0, c.tokens.size());
    const std::string full = ctx.tokenizer->decode(ids, p.skip_special_tokens);
    for (const std::string& s : p.stop)
      if (full.compare(c.text.size(), s.size(), s) == 0) {
        c.stop_reason = s;
        if (ctx.request->include_stop_str_in_output) {
          c.text += s;
          piece += s;
        }
        break;
      }
  }
  return piece;
}

json usage_json(const ResponseContext& ctx, const std::vector<ChoiceState>& choices) {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (const PromptInput& p : ctx.request->prompts) prompt += static_cast<int64_t>(p.ids.size());
  // note: a prompt counts once however many samples it has (vLLM); so do its cached tokens (its first
  // sample's: later samples hit the blocks the first one computed).
  std::vector<bool> counted(ctx.request->prompts.size());
  for (const ChoiceState& c : choices) {
    completion += static_cast<int64_t>(c.tokens.size());
    if (!counted[c.prompt]) cached += c.cached_tokens;
    counted[c.prompt] = true;
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json completion_response(const ResponseContext& ctx, const std::vector<ChoiceState>& choices,
                         const std::string& weight_version) {
  const ParsedRequest& r = *ctx.request;
  json arr = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceState& c = choices[i];
    json choice{{"index", i},
                {"finish_reason", finish_reason_name(c.finish)},
                {"stop_reason", c.stop_reason}};
    json logprobs = nullptr;
    if (r.logprobs >= 0)
      logprobs = r.chat ? chat_logprobs(ctx, c, 0, c.tokens.size())
                        : completion_logprobs(ctx, c, 0, c.tokens.size(), echo_offset(ctx, c));
    choice["logprobs"] = logprobs;
    if (r.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = r.echo ? r.prompts[c.prompt].text + c.text : c.text;
    }
    if (r.return_token_ids) {
      choice["token_ids"] = ids_of(c, 0, c.tokens.size());
      if (!r.chat) choice["prompt_token_ids"] = r.prompts[c.prompt].ids;
    }
    arr.push_back(std::move(choice));
  }
  json out{{"id", ctx.id},
           {"object", r.chat ? "chat.completion" : "text_completion"},
           {"created", ctx.created},
           {"model", ctx.model},
           {"choices", arr},
           {"usage", usage_json(ctx, choices)},
           {"weight_version", weight_version}};
  // note: vLLM's places: a chat response has the prompt's ids at the top, a completions choice its own.
  if (r.return_token_ids && r.chat) out["prompt_token_ids"] = r.prompts[0].ids;
  return out;
}

json chat_role_chunk(const ResponseContext& ctx, size_t index) {
  json choice{{"index", index},
              {"delta", {{"role", "assistant"}, {"content", ""}}},
              {"logprobs", nullptr},
              {"finish_reason", nullptr}};
  json out{{"id", ctx.id},
           {"object", "chat.completion.chunk"},
           {"created", ctx.created},
           {"model", ctx.model},
           {"choices", json::array({choice})}};
  // note: vLLM sends a chat stream's prompt ids once, on its first chunk.
  if (ctx.request->return_token_ids && index == 0) out["prompt_token_ids"] = ctx.request->prompts[0].ids;
  return out;
}

json stream_chunk(const ResponseContext& ctx, size_t index, ChoiceState& c, const std::string& piece,
                  const std::string& weight_version) {
  const ParsedRequest& r = *ctx.request;
  const size_t from = c.sent_tokens, to = c.tokens.size();
  json choice{{"index", index}};
  json logprobs = nullptr;
  if (r.logprobs >= 0) {
    if (r.chat) {
      logprobs = chat_logprobs(ctx, c, from, to);
    } else {
      size_t offset = echo_offset(ctx, c);
      for (size_t i = 0; i < from; ++i)
        offset += code_points(token_string(ctx.tokenizer, c.tokens[i].id, r.return_tokens_as_token_ids));
      logprobs = completion_logprobs(ctx, c, from, to, offset);
    }
  }
  if (r.chat) {
    choice["delta"] = piece.empty() && c.finished ? json::object() : json{{"content", piece}};
  } else {
    choice["text"] = piece;
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = c.finished ? json(finish_reason_name(c.finish)) : json(nullptr);
  choice["stop_reason"] = c.finished ? c.stop_reason : json(nullptr);
  if (r.return_token_ids) {
    choice["token_ids"] = ids_of(c, from, to);
    if (!r.chat && !c.sent_prompt_ids) choice["prompt_token_ids"] = r.prompts[c.prompt].ids;
    c.sent_prompt_ids = true;
  }
  c.sent_tokens = to;
  json out{{"id", ctx.id},
           {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
           {"created", ctx.created},
           {"model", ctx.model},
           {"choices", json::array({choice})},
           {"weight_version", weight_version}};
  return out;
}

json usage_chunk(const ResponseContext& ctx, const std::vector<ChoiceState>& choices) {
  return {{"id", ctx.id},
          {"object", ctx.request->chat ? "chat.completion.chunk" : "text_completion"},
          {"created", ctx.created},
          {"model", ctx.model},
          {"choices", json::array()},
          {"usage", usage_json(ctx, choices)}};
}

}  // namespace mxq::server
