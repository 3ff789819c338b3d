#include "server/request.h"

#include <algorithm>
#include <random>

#include "io/chat_template.h"
#include "io/safetensors.h"  // printable()

namespace mxq::server {
namespace {

#define TRY_GET(var, expr)                                 \
  auto var##_r = (expr);                                   \
  if (!var##_r) return tl::unexpected(var##_r.error());    \
  auto var = *var##_r

using Unexpected = tl::unexpected<ApiError>;

// Fields vLLM accepts that mxq takes as given because they change nothing here (documented in docs/serve.md).
void allow_inert(Fields& f) {
  f.allow({"user", "metadata", "store", "service_tier", "priority", "cache_salt", "parallel_tool_calls"});
}

// Fields that must keep their "off" value: mxq's sampler has no penalties, biases or grammars.
std::optional<ApiError> refuse_unsupported(Fields& f, const nlohmann::json& body) {
  auto is_off = [](const std::string& key, const nlohmann::json& v) {
    if (v.is_null()) return true;
    if (key == "presence_penalty" || key == "frequency_penalty") return v.is_number() && v.get<double>() == 0;
    if (key == "repetition_penalty" || key == "length_penalty") return v.is_number() && v.get<double>() == 1;
    if (key == "min_tokens" || key == "truncate_prompt_tokens") return v.is_number_integer() && v.get<int64_t>() == 0;
    if (key == "use_beam_search" || key == "continue_final_message" || key == "prompt_logprobs" ||
        key == "spaces_between_special_tokens")
      return v.is_boolean() && v.get<bool>() == (key == "spaces_between_special_tokens");
    if (key == "logit_bias" || key == "tools" || key == "functions" || key == "bad_words" ||
        key == "allowed_token_ids")
      return (v.is_object() || v.is_array()) && v.empty();
    if (key == "tool_choice") return v.is_string() && v.get<std::string>() == "none";
    if (key == "response_format") return v.is_object() && v.value("type", "") == "text" && v.size() == 1;
    return false;
  };
  static const char* const kKeys[] = {
      "presence_penalty", "frequency_penalty", "repetition_penalty", "length_penalty", "min_tokens",
      "truncate_prompt_tokens", "use_beam_search", "continue_final_message", "prompt_logprobs",
      "spaces_between_special_tokens", "logit_bias", "tools", "functions", "bad_words", "allowed_token_ids",
      "tool_choice", "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
      "guided_decoding_backend", "structured_outputs", "suffix", "function_call", "mm_processor_kwargs",
      "documents", "chat_template", "audio", "modalities", "prediction", "reasoning_effort"};
  for (const char* key : kKeys) {
    auto it = body.find(key);
    if (it == body.end()) continue;
    f.raw(key);
    if (!is_off(key, *it))
      return bad_request(key, fmt::format("{}: not supported by mxq (its sampler has no penalties, biases, "
                                          "grammars, tools or multimodal inputs); leave it out",
                                          key));
  }
  return std::nullopt;
}

ApiResult<std::vector<int32_t>> token_ids(const nlohmann::json& arr, const std::string& where, int64_t vocab) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    const nlohmann::json& v = arr[i];
    const bool is_int = v.is_number_integer() || v.is_number_unsigned();
    const int64_t id = is_int && !(v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX) ? v.get<int64_t>() : -1;
    if (!is_int || id < 0 || id >= vocab)
      return Unexpected(bad_request(where, fmt::format("{}[{}]: {}, expected a token id in [0, {})", where, i,
                                                       printable(v.dump()), vocab)));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

ApiResult<PromptInput> text_prompt(const std::string& text, const std::string& where, const ParseContext& ctx) {
  if (!ctx.tokenizer)
    return Unexpected(bad_request(where, fmt::format("{}: the model has no tokenizer.json; send token ids", where)));
  if (text.empty()) return Unexpected(bad_request(where, fmt::format("{}: empty prompt", where)));
  // note: special tokens typed in a completion prompt encode as their ids, as HF tokenizers does.
  auto ids = ctx.tokenizer->encode_checked(text, true, ctx.limits.max_prompt_bytes);
  if (!ids) return Unexpected(bad_request(where, fmt::format("{}: {}", where, ids.error().message)));
  return PromptInput{std::move(*ids), text};
}

ApiResult<PromptInput> id_prompt(const nlohmann::json& arr, const std::string& where, const ParseContext& ctx) {
  if (arr.empty()) return Unexpected(bad_request(where, fmt::format("{}: empty prompt", where)));
  TRY_GET(ids, token_ids(arr, where, ctx.vocab_size));
  PromptInput p{std::move(ids), {}};
  if (ctx.tokenizer) p.text = ctx.tokenizer->decode(p.ids);
  return p;
}

ApiResult<std::vector<PromptInput>> parse_prompts(const nlohmann::json* v, const ParseContext& ctx) {
  if (!v) return Unexpected(bad_request("prompt", "prompt: missing"));
  std::vector<PromptInput> out;
  if (v->is_string()) {
    TRY_GET(p, text_prompt(v->get<std::string>(), "prompt", ctx));
    out.push_back(std::move(p));
    return out;
  }
  if (!v->is_array() || v->empty())
    return Unexpected(bad_request("prompt", "prompt: expected a string, a list of strings, a list of token ids "
                                            "or a list of token-id lists"));
  const nlohmann::json& first = (*v)[0];
  if (first.is_number()) {
    TRY_GET(p, id_prompt(*v, "prompt", ctx));
    out.push_back(std::move(p));
    return out;
  }
  if (v->size() > ctx.limits.max_prompts)
    return Unexpected(bad_request("prompt", fmt::format("prompt: {} prompts, the limit is {}", v->size(),
                                                        ctx.limits.max_prompts)));
  size_t bytes = 0;
  for (size_t i = 0; i < v->size(); ++i) {
    const nlohmann::json& e = (*v)[i];
    const std::string where = fmt::format("prompt[{}]", i);
    if (e.is_string() && first.is_string()) {
      bytes += e.get_ref<const std::string&>().size();
      if (bytes > ctx.limits.max_prompt_bytes)
        return Unexpected(bad_request("prompt", fmt::format("prompt: more than {} bytes of text",
                                                            ctx.limits.max_prompt_bytes)));
      TRY_GET(p, text_prompt(e.get<std::string>(), where, ctx));
      out.push_back(std::move(p));
    } else if (e.is_array() && first.is_array()) {
      TRY_GET(p, id_prompt(e, where, ctx));
      out.push_back(std::move(p));
    } else {
      return Unexpected(bad_request("prompt", fmt::format("{}: every element must be of the first one's kind "
                                                          "(strings or token-id lists)", where)));
    }
  }
  return out;
}

// The fields /v1/completions and /v1/chat/completions share.
std::optional<ApiError> parse_sampling(Fields& f, ParsedRequest& r, const ParseContext& ctx) {
  GenerateParams& p = r.params;
  auto get = [&]() -> std::optional<ApiError> {
    auto n = f.integer("n", 1, ctx.limits.max_n);
    if (!n) return n.error();
    r.n = n->value_or(1);
    if (auto best_of = f.integer("best_of", 1, ctx.limits.max_n); !best_of) {
      return best_of.error();
    } else if (*best_of && **best_of != r.n) {
      return bad_request("best_of", "best_of: only best_of == n is supported (vLLM V1 refuses it too)");
    }
    auto t = f.number("temperature", 0, 1e6);
    if (!t) return t.error();
    p.sampling.temperature = static_cast<float>(t->value_or(ctx.defaults.temperature.value_or(1.0f)));
    auto tp = f.number("top_p", 0, 1);
    if (!tp) return tp.error();
    if (*tp && **tp <= 0) return bad_request("top_p", fmt::format("top_p: {}, expected (0, 1]", **tp));
    p.sampling.top_p = static_cast<float>(tp->value_or(ctx.defaults.top_p.value_or(1.0f)));
    auto tk = f.integer("top_k", -1, INT32_MAX);
    if (!tk) return tk.error();
    p.sampling.top_k = tk->value_or(ctx.defaults.top_k.value_or(0));
    auto mp = f.number("min_p", 0, 1);
    if (!mp) return mp.error();
    p.sampling.min_p = static_cast<float>(mp->value_or(ctx.defaults.min_p.value_or(0.0f)));
    auto seed = f.bits64("seed");
    if (!seed) return seed.error();
    r.seed = seed->has_value() ? **seed : std::random_device{}() * (uint64_t{1} << 32) ^ std::random_device{}();
    auto ignore_eos = f.boolean("ignore_eos");
    if (!ignore_eos) return ignore_eos.error();
    p.ignore_eos = ignore_eos->value_or(false);
    auto skip = f.boolean("skip_special_tokens");
    if (!skip) return skip.error();
    p.skip_special_tokens = skip->value_or(true);
    for (const char* key : {"include_stop_str_in_output", "return_token_ids", "return_tokens_as_token_ids",
                            "stream", "add_special_tokens"}) {
      auto b = f.boolean(key);
      if (!b) return b.error();
      const bool v = b->value_or(false);
      if (std::string_view(key) == "include_stop_str_in_output") r.include_stop_str_in_output = v;
      if (std::string_view(key) == "return_token_ids") r.return_token_ids = v;
      if (std::string_view(key) == "return_tokens_as_token_ids") r.return_tokens_as_token_ids = v;
      if (std::string_view(key) == "stream") r.stream = v;
    }
    // stop: a string or a list of strings
    if (const nlohmann::json* stop = f.raw("stop")) {
      std::vector<std::string> stops;
      if (stop->is_string()) {
        stops.push_back(stop->get<std::string>());
      } else if (stop->is_array() && stop->size() <= ctx.limits.max_stop) {
        for (const auto& s : *stop) {
          if (!s.is_string()) return bad_request("stop", "stop: expected a string or a list of strings");
          stops.push_back(s.get<std::string>());
        }
      } else {
        return bad_request("stop", fmt::format("stop: expected a string or a list of at most {} strings",
                                               ctx.limits.max_stop));
      }
      for (const std::string& s : stops) {
        if (s.empty()) return bad_request("stop", "stop: an empty stop string");
        if (s.size() > ctx.limits.max_stop_bytes)
          return bad_request("stop", fmt::format("stop: a stop string of {} bytes, the limit is {}", s.size(),
                                                 ctx.limits.max_stop_bytes));
      }
      if (!stops.empty() && !ctx.tokenizer)
        return bad_request("stop", "stop: stop strings need the model's tokenizer.json");
      p.stop = std::move(stops);
    }
    if (const nlohmann::json* ids = f.raw("stop_token_ids")) {
      if (!ids->is_array() || ids->size() > ctx.limits.max_stop)
        return bad_request("stop_token_ids", fmt::format("stop_token_ids: expected a list of at most {} token ids",
                                                         ctx.limits.max_stop));
      auto parsed = token_ids(*ids, "stop_token_ids", ctx.vocab_size);
      if (!parsed) return parsed.error();
      p.stop_token_ids = std::move(*parsed);
    }
    if (const nlohmann::json* so = f.raw("stream_options")) {
      if (!so->is_object()) return bad_request("stream_options", "stream_options: expected an object");
      if (!r.stream)
        return bad_request("stream_options", "stream_options: only allowed when stream is true (as vLLM)");
      Fields sf(*so, "stream_options.");
      auto iu = sf.boolean("include_usage");
      if (!iu) return iu.error();
      auto cu = sf.boolean("continuous_usage_stats");
      if (!cu) return cu.error();
      r.include_usage = iu->value_or(false);
      r.continuous_usage = cu->value_or(false);
      if (auto e = sf.unknown()) return e;
    }
    auto rid = f.string("request_id", 256);
    if (!rid) return rid.error();
    r.request_id = rid->value_or("");
    return std::nullopt;
  };
  return get();
}

std::optional<ApiError> check_model(Fields& f, const ParseContext& ctx) {
  auto model = f.string("model", 4096);
  if (!model) return model.error();
  if (*model && **model != ctx.model_name)
    return ApiError{404, fmt::format("The model `{}` does not exist.", printable(**model)), "model", "NotFoundError"};
  return std::nullopt;
}

std::optional<ApiError> finish(Fields& f, const nlohmann::json& body, ParsedRequest& r) {
  allow_inert(f);
  if (auto e = refuse_unsupported(f, body)) return e;
  if (auto e = f.unknown()) return e;
  r.params.sampling.num_logprobs = std::max<int64_t>(r.logprobs, 0);
  if (r.echo && r.logprobs >= 0)
    return bad_request("echo", "echo with logprobs (prompt logprobs) is not supported yet; drop one of them");
  return std::nullopt;
}

ApiResult<std::string> message_content(const nlohmann::json& v, const std::string& where) {
  if (v.is_null()) return std::string();
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) return Unexpected(bad_request(where, fmt::format("{}: expected a string or a list of parts", where)));
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const nlohmann::json& part = v[i];
    const std::string pw = fmt::format("{}[{}]", where, i);
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      return Unexpected(bad_request(where, fmt::format("{}: expected an object with a type", pw)));
    const std::string type = part["type"].get<std::string>();
    // note: image, audio and file parts are refused by name before any URL is looked at (H-17).
    if (type != "text")
      return Unexpected(bad_request(where, fmt::format("{}: part type '{}' is not supported (text only)", pw,
                                                       printable(type))));
    if (!part.contains("text") || !part["text"].is_string())
      return Unexpected(bad_request(where, fmt::format("{}.text: expected a string", pw)));
    out += part["text"].get<std::string>();
  }
  return out;
}

}  // namespace

ApiResult<ParsedRequest> parse_completion_request(const nlohmann::json& body, const ParseContext& ctx) {
  ParsedRequest r;
  Fields f(body);
  if (auto e = check_model(f, ctx)) return Unexpected(*e);
  if (auto e = parse_sampling(f, r, ctx)) return Unexpected(*e);
  TRY_GET(prompts, parse_prompts(f.raw("prompt"), ctx));
  r.prompts = std::move(prompts);
  // note: OpenAI's and vLLM's completions default is 16 tokens.
  TRY_GET(mt, f.integer("max_tokens", 1, INT32_MAX));
  r.max_tokens = mt.value_or(16);
  TRY_GET(lp, f.integer("logprobs", 0, ctx.limits.max_logprobs));
  r.logprobs = lp.value_or(-1);
  TRY_GET(echo, f.boolean("echo"));
  r.echo = echo.value_or(false);
  if (auto e = finish(f, body, r)) return Unexpected(*e);
  return r;
}

ApiResult<ParsedRequest> parse_chat_request(const nlohmann::json& body, const ParseContext& ctx) {
  ParsedRequest r;
  r.chat = true;
  Fields f(body);
  if (auto e = check_model(f, ctx)) return Unexpected(*e);
  if (auto e = parse_sampling(f, r, ctx)) return Unexpected(*e);
  if (!ctx.tokenizer)
    return Unexpected(bad_request("messages", "messages: the model has no tokenizer.json, so chat is unavailable"));
  // max_completion_tokens is OpenAI's newer name; vLLM takes either.
  TRY_GET(mt, f.integer("max_tokens", 1, INT32_MAX));
  TRY_GET(mct, f.integer("max_completion_tokens", 1, INT32_MAX));
  r.max_tokens = mct ? mct : mt;
  if (!r.max_tokens && ctx.defaults.max_tokens) {
    r.max_tokens = ctx.defaults.max_tokens;
    r.max_tokens_is_default = true;
  }
  TRY_GET(lp, f.boolean("logprobs"));
  TRY_GET(tlp, f.integer("top_logprobs", 0, ctx.limits.max_logprobs));
  if (tlp && !lp.value_or(false))
    return Unexpected(bad_request("top_logprobs", "top_logprobs: needs logprobs set to true"));
  if (lp.value_or(false)) r.logprobs = tlp.value_or(0);
  TRY_GET(echo, f.boolean("echo"));
  if (echo.value_or(false)) return Unexpected(bad_request("echo", "echo: not supported for chat completions"));
  ChatOptions opts;
  TRY_GET(agp, f.boolean("add_generation_prompt"));
  opts.add_generation_prompt = agp.value_or(true);
  if (const nlohmann::json* kw = f.raw("chat_template_kwargs")) {
    if (!kw->is_object())
      return Unexpected(bad_request("chat_template_kwargs", "chat_template_kwargs: expected an object"));
    Fields kf(*kw, "chat_template_kwargs.");
    TRY_GET(think, kf.boolean("enable_thinking"));
    opts.enable_thinking = think;
    if (auto e = kf.unknown()) return Unexpected(*e);
  }
  const nlohmann::json* msgs = f.raw("messages");
  if (!msgs || !msgs->is_array() || msgs->empty())
    return Unexpected(bad_request("messages", "messages: expected a non-empty list of messages"));
  if (msgs->size() > ctx.limits.max_messages)
    return Unexpected(bad_request("messages", fmt::format("messages: {} messages, the limit is {}", msgs->size(),
                                                          ctx.limits.max_messages)));
  std::vector<ChatMessage> chat;
  size_t bytes = 0;
  for (size_t i = 0; i < msgs->size(); ++i) {
    const nlohmann::json& m = (*msgs)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) return Unexpected(bad_request("messages", fmt::format("{}: expected an object", where)));
    Fields mf(m, where + ".");
    TRY_GET(role, mf.string("role", 64));
    if (!role) return Unexpected(bad_request("messages", fmt::format("{}.role: missing", where)));
    const nlohmann::json* content = mf.raw("content");
    // note: only an assistant turn may leave content out (OpenAI's schema; its tool calls are refused below).
    if (!content && *role != "assistant")
      return Unexpected(bad_request("messages", fmt::format("{}.content: missing", where)));
    TRY_GET(text, message_content(content ? *content : nlohmann::json(nullptr), where + ".content"));
    TRY_GET(reasoning, mf.string("reasoning_content", ctx.limits.max_prompt_bytes));
    mf.allow({"name", "tool_call_id"});
    if (const nlohmann::json* tc = mf.raw("tool_calls"); tc && !(tc->is_array() && tc->empty()))
      return Unexpected(bad_request("messages", fmt::format("{}.tool_calls: tool calls are not supported", where)));
    if (auto e = mf.unknown()) return Unexpected(*e);
    bytes += text.size() + (reasoning ? reasoning->size() : 0);
    if (bytes > ctx.limits.max_prompt_bytes)
      return Unexpected(bad_request("messages", fmt::format("messages: more than {} bytes of text",
                                                            ctx.limits.max_prompt_bytes)));
    // note: special tokens typed into message text would let a user forge turns; they are refused (H-10).
    for (const std::string* s : {&text, reasoning ? &*reasoning : nullptr}) {
      if (!s) continue;
      for (int32_t id : ctx.tokenizer->encode(*s, true))
        if (ctx.tokenizer->is_special(id))
          return Unexpected(bad_request(
              "messages", fmt::format("{}: contains the special token {} as text; special tokens are not "
                                      "allowed in messages",
                                      where, printable(ctx.tokenizer->decode(std::span(&id, 1))))));
    }
    chat.push_back({*role, std::move(text), std::move(reasoning)});
  }
  auto rendered = render_qwen3_chat(chat, opts);
  if (!rendered) return Unexpected(bad_request("messages", rendered.error().message));
  auto ids = ctx.tokenizer->encode_checked(*rendered, true, 2 * ctx.limits.max_prompt_bytes + 4096);
  if (!ids) return Unexpected(bad_request("messages", ids.error().message));
  r.prompts.push_back({std::move(*ids), std::move(*rendered)});
  if (auto e = finish(f, body, r)) return Unexpected(*e);
  return r;
}

ApiResult<int64_t> resolve_max_tokens(const ParsedRequest& r, const PromptInput& p, int64_t max_model_len) {
  const auto n = static_cast<int64_t>(p.ids.size());
  int64_t want = r.max_tokens.value_or(max_model_len - n);
  if (r.max_tokens_is_default) want = std::min(want, max_model_len - n);
  if (n >= max_model_len || n + want > max_model_len)
    return Unexpected(bad_request(
        r.chat ? "messages" : "prompt",
        fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens ({} in "
                    "the {}, {} in the completion). Please reduce the length of the {} or completion.",
                    max_model_len, n + std::max<int64_t>(want, 0), n, r.chat ? "messages" : "prompt",
                    std::max<int64_t>(want, 0), r.chat ? "messages" : "prompt")));
  return want;
}

}  // namespace mxq::server
