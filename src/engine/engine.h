// The batched engine: requests come in at any time, every step() runs one scheduler plan (running decodes and
// prompt chunks together, continuous batching) through a ModelRunner and hands back what each request
// produced: its new tokens with logprobs, the text that became final, and whether (and why) it finished.
// Per-request logic — stop token ids, EOS, stop strings held back while they may still match, streaming text
// by whole UTF-8 characters, one seeded generator per request — is the same for every runner, so a request
// produces the same tokens alone or in a batch.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/generator.h"
#include "engine/scheduler.h"
#include "model/step.h"

namespace mxq {

// Runs scheduler plans on a backend, over a paged KV pool read through the plan's block tables (the
// scheduler's BlockPool names the blocks, the runner holds their K/V). A chunk may start past 0 in a sequence
// it has never seen: its first positions sit in cached blocks, or in a block the plan's copies fill
// (copy-on-write of a partial block, see BlockCopy).
class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // Runs the plan's block copies, in order, then every chunk of `plan`, and returns one token per sampling
  // chunk, in plan order (`specs` likewise).
  virtual Result<std::vector<SampledToken>> run(const StepPlan& plan, const Scheduler& scheduler,
                                                std::span<const SampleSpec> specs) = 0;
  // Forgets a sequence's cache (finished, aborted or preempted: a preempted one is recomputed from its
  // cache hit).
  virtual void drop(uint64_t id) = 0;
};

// Each plan as one batched, paged step (Qwen3Model::step) over a KV pool in the CUDA engine's layout, read
// through the plan's block tables (prefix-cache hits included, nothing copied but the plan's block copies);
// samples on the host. Each request gets the bits it gets alone. The runner owns its pool, so several
// engines may share one model (not at once: steps of one model's engines must not overlap in time).
std::unique_ptr<ModelRunner> make_cpu_runner(Qwen3Model& model);

struct EngineConfig {
  SchedulerConfig scheduler{.max_model_len = 0};  // max_model_len 0: the model's max_position_embeddings
  int32_t block_size = 16;
  int64_t num_blocks = 0;  // 0 = enough for max_num_seqs sequences of max_model_len tokens
  // vLLM --enable-prefix-caching (its default, and ours): full KV blocks are shared by content hash across
  // requests and between the n samples of one prompt. Off: every request computes its whole prompt.
  bool enable_prefix_caching = true;
};

// Prefix cache queries / hits (tokens; hits include slots copied from a running sequence's partial block)
// and preemptions since the engine started.
using EngineCounters = SchedulerCounters;

// What one request produced in one step.
struct RequestOutput {
  uint64_t id = 0;
  std::vector<SampledToken> tokens;  // new tokens, a stop token included
  std::string text;                  // text that became final this step
  bool finished = false;
  FinishReason finish = FinishReason::kLength;
  // Prompt tokens whose K/V came from the prefix cache at admission (OpenAI usage.prompt_tokens_details.
  // cached_tokens), copied partial-block slots included (not a multiple of the block size then); the same
  // on every output of the request.
  int64_t cached_tokens = 0;
};

class Engine {
 public:
  // `model` is the checkpoint's config (request checks, EOS); `tokenizer` (may be null) and the runner's
  // model must outlive the engine.
  static Result<Engine> create(const ModelConfig& model, const Tokenizer* tokenizer, EngineConfig config,
                               std::unique_ptr<ModelRunner> runner);

  // Queues a request; refuses what Generator::check_request refuses, and what the scheduler refuses (ids in
  // use, sequences over max_model_len or the KV pool).
  Status add(uint64_t id, std::span<const int32_t> prompt, const GenerateParams& params);
  // One forward over the next plan; empty when nothing is queued. A failure of the forward itself fails
  // every request of that step (they are dropped) and is returned.
  Result<std::vector<RequestOutput>> step();
  // Drops a queued or running request and frees its KV blocks. Refuses an unknown id.
  Status abort(uint64_t id);

  // Drops every cached prefix block (call it after a weight update: no K/V of the old weights may be reused).
  // Requests in flight keep their blocks and continue.
  void reset_prefix_cache() { scheduler_->reset_prefix_cache(); }
  EngineCounters counters() const { return scheduler_->counters(); }

  bool idle() const { return scheduler_->idle(); }
  const Scheduler& scheduler() const { return *scheduler_; }
  const BlockPool& pool() const { return *pool_; }

 private:
  struct Request {
    GenerateParams params;
    std::vector<int32_t> stop_ids;
    std::mt19937_64 rng;
    std::optional<StreamDecoder> stream;
    std::string text;    // text so far (stop string cut away)
    size_t emitted = 0;  // bytes of text already handed out
    int64_t generated = 0;
  };
  Engine() = default;
  // Takes one sampled token; returns true when the request ends with it.
  bool accept(Request& r, const SampledToken& tok, RequestOutput& out);
  void retire(uint64_t id);

  ModelConfig model_;
  const Tokenizer* tokenizer_ = nullptr;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::map<uint64_t, Request> requests_;
};

// Runs one request (id 0) through an idle engine to its end, streaming text to `on_text` (returning false
// aborts it, finish = length): the loop behind Generator::generate and `mxq generate --device cuda`.
Result<Generation> generate_one(Engine& engine, std::span<const int32_t> prompt, const GenerateParams& params,
                                const TextCallback& on_text = {});

}  // namespace mxq
