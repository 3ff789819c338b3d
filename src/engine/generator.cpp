#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "engine/kv_cache.h"

namespace mxq {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Length of the longest suffix of `text` that is a proper prefix of some stop string: text that might still
// turn into a stop string and so cannot be streamed yet.
size_t held_back(std::string_view text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& s : stops)
    for (size_t len = std::min(s.size() - 1, text.size()); len > hold; --len)
      if (text.substr(text.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
  return hold;
}

}  // namespace

std::string_view finish_reason_name(FinishReason r) { return r == FinishReason::kLength ? "length" : "stop"; }

Status Generator::check_request(std::span<const int32_t> prompt, const GenerateParams& p) const {
  const ModelConfig& c = model_->config();
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
  if (!p.stop.empty() && !tokenizer_) return fail("stop: stop strings need a tokenizer, the model has none");
  return {};
}

Result<Generation> Generator::generate(std::span<const int32_t> prompt, const GenerateParams& p,
                                       const TextCallback& on_text) {
  if (auto st = check_request(prompt, p); !st) return tl::unexpected(st.error());
  const ModelConfig& c = model_->config();
  const int64_t n = static_cast<int64_t>(prompt.size());
  auto kv = KvCache::create(model_->backend(), c, n + p.max_new_tokens);
  if (!kv) return tl::unexpected(kv.error());

  // note: the KV cache is sized for this request exactly, so no position can overflow it mid-generation.
  std::vector<int32_t> stop_ids = p.stop_token_ids;
  if (!p.ignore_eos)
    for (int64_t e : c.eos_token_ids) stop_ids.push_back(static_cast<int32_t>(e));
  // One generator per request: the same seed and parameters give the same tokens whatever ran before.
  std::mt19937_64 rng(p.seed);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  Generation g;
  std::optional<StreamDecoder> stream;
  if (tokenizer_) stream.emplace(*tokenizer_);
  size_t emitted = 0;  // bytes of g.text handed to on_text

  auto t0 = std::chrono::steady_clock::now();
  if (auto st = model_->forward(prompt, kv->sequence(), logits.data()); !st)
    return tl::unexpected(st.error());
  g.prefill_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < p.max_new_tokens; ++step) {
    auto tok = sample(logits.data(), c.vocab_size, p.sampling, rng);
    if (!tok) return fail_in(fmt::format("sampling step {}", step), tok.error());
    g.token_ids.push_back(tok->id);
    g.tokens.push_back(std::move(*tok));
    const int32_t id = g.token_ids.back();
    // A stop token is kept in token_ids (its logprob was reported) but its text is not added (vLLM's rule).
    if (std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) {
      g.finish = FinishReason::kStopToken;
      break;
    }
    if (stream) {
      g.text += stream->push(id);
      // note: a stop string cannot start before `emitted`: anything after it that could still begin one was
      // held back, so only the held-back tail plus this piece is searched.
      size_t cut = std::string::npos;
      for (const std::string& s : p.stop) cut = std::min(cut, g.text.find(s, emitted));
      if (cut != std::string::npos) {
        g.text.resize(cut);
        g.finish = FinishReason::kStopString;
      }
      const size_t ready =
          g.finish == FinishReason::kStopString ? g.text.size() : g.text.size() - held_back(g.text, p.stop);
      if (on_text && ready > emitted && !on_text(std::string_view(g.text).substr(emitted, ready - emitted)))
        break;
      emitted = std::max(emitted, ready);
      if (g.finish == FinishReason::kStopString) break;
    }
    // note: no forward after the last token: its logits would never be sampled.
    if (step + 1 == p.max_new_tokens) break;
    const int32_t next[1] = {id};
    if (auto st = model_->forward(next, kv->sequence(), logits.data()); !st)
      return tl::unexpected(st.error());
  }
  if (stream && g.finish != FinishReason::kStopString) {
    g.text += stream->finish();
    if (on_text && g.text.size() > emitted) on_text(std::string_view(g.text).substr(emitted));
  }
  g.decode_seconds = seconds_since(t0);
  return g;
}

}  // namespace mxq
