#include "engine/engine.h"

#include <algorithm>

namespace mxq {
namespace {

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

Result<Engine> Engine::create(const ModelConfig& model, const Tokenizer* tokenizer, EngineConfig config,
                              std::unique_ptr<ModelRunner> runner) {
  SchedulerConfig& sc = config.scheduler;
  const int64_t context = model.max_position_embeddings;
  if (sc.max_model_len == 0) sc.max_model_len = context;
  if (sc.max_model_len < 1 || sc.max_model_len > context)
    return fail("max_model_len: {}, expected 1..{} (max_position_embeddings)", sc.max_model_len, context);
  if (sc.max_num_seqs < 1) return fail("max_num_seqs: {}, expected >= 1", sc.max_num_seqs);
  if (sc.max_num_batched_tokens < 1)
    return fail("max_num_batched_tokens: {}, expected >= 1", sc.max_num_batched_tokens);
  if (config.block_size < 1) return fail("block_size: {}, expected >= 1", config.block_size);
  if (config.num_blocks == 0)
    config.num_blocks = sc.max_num_seqs * ((sc.max_model_len + config.block_size - 1) / config.block_size);
  if (config.num_blocks < 1 || config.num_blocks > INT32_MAX)
    return fail("num_blocks: {}, expected 1..{}", config.num_blocks, INT32_MAX);
  Engine e;
  e.model_ = model;
  e.tokenizer_ = tokenizer;
  e.pool_ = std::make_unique<BlockPool>(static_cast<int32_t>(config.num_blocks), config.block_size);
  e.scheduler_ = std::make_unique<Scheduler>(sc, *e.pool_, config.enable_prefix_caching);
  e.runner_ = std::move(runner);
  return e;
}

Status Engine::add(uint64_t id, std::span<const int32_t> prompt, const GenerateParams& params) {
  if (auto st = check_request(model_, tokenizer_, prompt, params); !st)
    return fail_in(fmt::format("request {}", id), st.error());
  if (auto st = scheduler_->add(id, prompt, params.max_new_tokens); !st) return st;
  Request r{params, params.stop_token_ids, std::mt19937_64(params.seed), {}, {}, 0, 0};
  if (!params.ignore_eos)
    for (int64_t e : model_.eos_token_ids) r.stop_ids.push_back(static_cast<int32_t>(e));
  if (tokenizer_) r.stream.emplace(*tokenizer_, params.skip_special_tokens);
  requests_.emplace(id, std::move(r));
  return {};
}

bool Engine::accept(Request& r, const SampledToken& tok, RequestOutput& out) {
  out.tokens.push_back(tok);
  ++r.generated;
  // A stop token is kept in the tokens (its logprob was reported) but its text is not added (vLLM's rule).
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), tok.id) != r.stop_ids.end()) {
    out.finished = true;
    out.finish = FinishReason::kStopToken;
  } else if (r.stream) {
    r.text += r.stream->push(tok.id);
    // note: a stop string cannot start before `emitted`: anything after it that could still begin one was
    // held back, so only the held-back tail plus this piece is searched.
    size_t cut = std::string::npos;
    for (const std::string& s : r.params.stop) cut = std::min(cut, r.text.find(s, r.emitted));
    if (cut != std::string::npos) {
      r.text.resize(cut);
      out.finished = true;
      out.finish = FinishReason::kStopString;
    }
  }
  if (!out.finished && r.generated >= r.params.max_new_tokens) {
    out.finished = true;
    out.finish = FinishReason::kLength;
  }
  // note: a partial UTF-8 character left at the end is flushed as U+FFFD (not after a stop string: cut).
  if (r.stream && out.finished && out.finish != FinishReason::kStopString) r.text += r.stream->finish();
  const size_t ready = out.finished ? r.text.size() : r.text.size() - held_back(r.text, r.params.stop);
  if (ready > r.emitted) {
    out.text += r.text.substr(r.emitted, ready - r.emitted);
    r.emitted = ready;
  }
  return out.finished;
}

void Engine::retire(uint64_t id) {
  runner_->drop(id);
  (void)scheduler_->finish(id);
  requests_.erase(id);
}

Result<std::vector<RequestOutput>> Engine::step() {
  StepPlan plan = scheduler_->schedule();
  for (uint64_t id : plan.preempted) runner_->drop(id);
  std::vector<RequestOutput> outputs;
  if (plan.empty()) return outputs;
  std::vector<SampleSpec> specs;
  for (const ScheduledChunk& c : plan.chunks)
    if (c.samples) {
      Request& r = requests_.at(c.id);
      specs.push_back({&r.params.sampling, &r.rng, r.params.seed, r.generated});
    }
  auto sampled = runner_->run(plan, *scheduler_, specs);
  if (!sampled) {
    for (const ScheduledChunk& c : plan.chunks) retire(c.id);
    return tl::unexpected(sampled.error());
  }
  std::vector<int32_t> ids;
  for (const SampledToken& t : *sampled) ids.push_back(t.id);
  scheduler_->complete(plan, ids);
  size_t next = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    if (!c.samples) continue;
    RequestOutput out;
    out.id = c.id;
    out.cached_tokens = scheduler_->find(c.id)->cached_tokens;
    if (accept(requests_.at(c.id), (*sampled)[next++], out)) retire(c.id);
    outputs.push_back(std::move(out));
  }
  return outputs;
}

Status Engine::abort(uint64_t id) {
  if (!requests_.count(id)) return fail("request {}: no such request", id);
  retire(id);
  return {};
}

}  // namespace mxq
