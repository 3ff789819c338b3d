#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "engine/engine.h"

namespace mxq {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    default: return "stop";
  }
}

Status Generator::check_request(std::span<const int32_t> prompt, const GenerateParams& p) const {
  return mxq::check_request(model_->config(), tokenizer_, prompt, p);
}

Status check_request(const ModelConfig& c, const Tokenizer* tokenizer, std::span<const int32_t> prompt,
                     const GenerateParams& p) {
  if (prompt.empty()) return fail("prompt: empty, expected at least one token");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= c.vocab_size)
      return fail("prompt: token id {} at position {} is outside the vocabulary [0, {})", prompt[i], i,
                  c.vocab_size);
  for (int32_t id : p.stop_token_ids)
    if (id < 0 || id >= c.vocab_size)
      return fail("stop_token_ids: {} is outside the vocabulary [0, {})", id, c.vocab_size);
  if (p.max_new_tokens < 1) return fail("max_new_tokens: {}, expected >= 1", p.max_new_tokens);
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n > c.max_position_embeddings)
    return fail("prompt: {} tokens exceed the context of {} (max_position_embeddings)", n,
                c.max_position_embeddings);
  if (p.max_new_tokens > c.max_position_embeddings - n)
    return fail("max_new_tokens: {} + {} prompt tokens exceed the context of {} (max_position_embeddings)",
                p.max_new_tokens, n, c.max_position_embeddings);
  if (auto st = check_sampling_params(p.sampling, c.vocab_size); !st) return st;
  for (const std::string& s : p.stop)
    if (s.empty()) return fail("stop: an empty stop string");
  if (!p.stop.empty() && !tokenizer) return fail("stop: stop strings need a tokenizer, the model has none");
  return {};
}

Result<Generation> generate_one(Engine& engine, std::span<const int32_t> prompt, const GenerateParams& p,
                                const TextCallback& on_text) {
  if (auto st = engine.add(0, prompt, p); !st) return tl::unexpected(st.error());
  Generation g;
  auto t0 = std::chrono::steady_clock::now();
  for (bool first = true; !engine.idle(); first = false) {
    auto outputs = engine.step();
    if (!outputs) return tl::unexpected(outputs.error());
    if (first) {
      g.prefill_seconds = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
    }
    for (RequestOutput& out : *outputs) {
      for (SampledToken& t : out.tokens) {
        g.token_ids.push_back(t.id);
        g.tokens.push_back(std::move(t));
      }
      g.text += out.text;
      if (out.finished) g.finish = out.finish;
      if (on_text && !out.text.empty() && !on_text(out.text) && !out.finished) {
        (void)engine.abort(0);
        g.finish = FinishReason::kLength;
      }
    }
  }
  g.decode_seconds = seconds_since(t0);
  return g;
}

Result<Generation> Generator::generate(std::span<const int32_t> prompt, const GenerateParams& p,
                                       const TextCallback& on_text) {
  if (auto st = check_request(prompt, p); !st) return tl::unexpected(st.error());
  const auto n = static_cast<int64_t>(prompt.size());
  // note: one request through the batched engine, its prompt in one chunk and its cache sized for the
  // request exactly (as a batch of one would run on the server).
  EngineConfig cfg;
  cfg.scheduler = {.max_num_seqs = 1, .max_num_batched_tokens = n, .max_model_len = n + p.max_new_tokens};
  auto engine = Engine::create(model_->config(), tokenizer_, cfg, make_cpu_runner(*model_));
  if (!engine) return tl::unexpected(engine.error());
  return generate_one(*engine, prompt, p, on_text);
}

}  // namespace mxq
