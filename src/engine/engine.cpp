#include "engine/engine.h"

#include <algorithm>

#include "engine/cpu_block_store.h"
#include "engine/kv_cache.h"

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

class PerSequenceRunner final : public ModelRunner {
 public:
  explicit PerSequenceRunner(Qwen3Model& model)
      : model_(&model), logits_(static_cast<size_t>(model.config().vocab_size)) {}

  Result<std::vector<SampledToken>> run(const StepPlan& plan, const Scheduler& scheduler,
                                        std::span<const SampleSpec> specs) override {
    std::vector<SampledToken> out;
    size_t next = 0;
    const BlockPool& pool = scheduler.pool();
    if (scheduler.prefix_caching() && !blocks_)
      blocks_.emplace(model_->backend(), model_->config(), pool.num_blocks(), pool.block_size());
    // Copy-on-write of partial blocks first: the chunks below read them into their contiguous caches.
    if (!plan.copies.empty() && !blocks_)
      return fail("step with {} KV block copies, but prefix caching is off", plan.copies.size());
    for (const BlockCopy& cp : plan.copies)
      if (auto st = blocks_->copy(cp.src, cp.dst, cp.slots); !st) return tl::unexpected(st.error());
    for (const ScheduledChunk& c : plan.chunks) {
      const SequenceState& s = *scheduler.find(c.id);
      auto it = caches_.find(c.id);
      if (it == caches_.end()) {
        // note: sized for the whole request at once, so the buffers never move while it runs.
        auto kv = KvCache::create(model_->backend(), model_->config(), s.prompt_len + s.max_new_tokens);
        if (!kv) return fail_in(fmt::format("request {}", c.id), kv.error());
        it = caches_.emplace(c.id, std::move(*kv)).first;
      }
      SequenceKv& kv = it->second.sequence();
      // The positions before the chunk that this cache lacks were computed into shared blocks (a prefix
      // cache hit, possibly by another sequence).
      if (blocks_ && kv.length < c.start)
        if (auto st = blocks_->read(s.blocks, c.start, kv); !st)
          return fail_in(fmt::format("request {}", c.id), st.error());
      if (kv.length != c.start)
        return fail("request {}: the cache holds {} positions, the plan starts at {}", c.id, kv.length,
                    c.start);
      std::span<const int32_t> ids(s.tokens.data() + c.start, static_cast<size_t>(c.count));
      if (auto st = model_->forward(ids, kv, logits_.data()); !st)
        return fail_in(fmt::format("request {}", c.id), st.error());
      if (blocks_) blocks_->write(kv, s.blocks, c.start, c.start + c.count);
      if (!c.samples) continue;
      const SampleSpec& spec = specs[next++];
      auto tok = sample(logits_.data(), model_->config().vocab_size, *spec.params, *spec.rng);
      if (!tok) return fail_in(fmt::format("request {}: sampling step {}", c.id, spec.index), tok.error());
      out.push_back(std::move(*tok));
    }
    return out;
  }

  void drop(uint64_t id) override { caches_.erase(id); }

 private:
  Qwen3Model* model_;
  std::vector<float> logits_;
  std::map<uint64_t, KvCache> caches_;
  std::optional<CpuBlockStore> blocks_;  // prefix caching on: K/V of every pool block written so far
};

}  // namespace

std::unique_ptr<ModelRunner> make_per_sequence_runner(Qwen3Model& model) {
  return std::make_unique<PerSequenceRunner>(model);
}

Result<Engine> Engine::create(Qwen3Model& model, const Tokenizer* tokenizer, EngineConfig config,
                              std::unique_ptr<ModelRunner> runner) {
  SchedulerConfig& sc = config.scheduler;
  const int64_t context = model.config().max_position_embeddings;
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
  e.model_ = &model;
  e.tokenizer_ = tokenizer;
  e.pool_ = std::make_unique<BlockPool>(static_cast<int32_t>(config.num_blocks), config.block_size);
  e.scheduler_ = std::make_unique<Scheduler>(sc, *e.pool_, config.enable_prefix_caching);
  e.runner_ = std::move(runner);
  return e;
}

Status Engine::add(uint64_t id, std::span<const int32_t> prompt, const GenerateParams& params) {
  if (auto st = Generator(*model_, tokenizer_).check_request(prompt, params); !st)
    return fail_in(fmt::format("request {}", id), st.error());
  if (auto st = scheduler_->add(id, prompt, params.max_new_tokens); !st) return st;
  Request r{params, params.stop_token_ids, std::mt19937_64(params.seed), {}, {}, 0, 0};
  if (!params.ignore_eos)
    for (int64_t e : model_->config().eos_token_ids) r.stop_ids.push_back(static_cast<int32_t>(e));
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
