// Continuous batching over a paged KV cache, as vLLM's V1 scheduler does it: every step first gives each
// running sequence its next tokens (one for decode, a chunk for a prompt still being prefilled), then admits
// waiting sequences while the step's token budget, --max-num-seqs and free KV blocks allow. When a running
// sequence needs a block and none is free, the most recently admitted running sequence is preempted: its blocks
// are freed and it goes back to the front of the queue to be recomputed (prompt + tokens so far) later.
// The scheduler holds token ids and block ids only; the engine runs the plan on a backend and reports back.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <vector>

#include "base/error.h"
#include "engine/block_pool.h"

namespace mxq {

struct SchedulerConfig {
  int32_t max_num_seqs = 256;             // sequences in one step (vLLM --max-num-seqs)
  int64_t max_num_batched_tokens = 8192;  // tokens in one step (vLLM --max-num-batched-tokens)
  int64_t max_model_len = 4096;           // prompt + generated tokens of one sequence (--max-model-len)
  bool chunked_prefill = true;            // split a prompt over steps when it does not fit the budget
};

struct SequenceState {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // the prompt, then every generated token
  int64_t prompt_len = 0;
  int64_t max_new_tokens = 0;
  int64_t computed = 0;         // leading tokens whose K/V sit in the cache
  std::vector<int32_t> blocks;  // block table: token slot p lives in blocks[p / block_size]
  int64_t preemptions = 0;
  bool finished = false;        // reached max_new_tokens: blocks freed, kept until finish() retires it
  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
};

// One sequence's share of a step: positions [start, start + count) of its tokens go through the model.
struct ScheduledChunk {
  uint64_t id = 0;
  int64_t start = 0;
  int64_t count = 0;
  bool samples = false;  // the chunk ends at the last token: the step samples the sequence's next token
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;  // running sequences first (admission order), then newly admitted ones
  std::vector<uint64_t> preempted;     // sent back to the queue this step, their blocks freed
  int64_t tokens = 0;                  // sum of chunk counts
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  // `pool` must outlive the scheduler; config.max_num_seqs, max_num_batched_tokens and max_model_len >= 1.
  Scheduler(SchedulerConfig config, BlockPool& pool);

  // Queues a request. Refuses by name: an id in use, an empty prompt, max_new_tokens < 1, prompt +
  // max_new_tokens beyond max_model_len, or a sequence that could not fit the whole pool; without chunked
  // prefill also a prompt longer than max_num_batched_tokens.
  Status add(uint64_t id, std::span<const int32_t> prompt, int64_t max_new_tokens);

  StepPlan schedule();

  // After the plan's forward: `sampled` holds one token per sampling chunk, in plan order. Advances every
  // chunk's sequence, appends the tokens, and stops sequences that reached max_new_tokens (blocks freed,
  // state kept for the caller to read until finish()); returns their ids. The plan must be the last one
  // schedule() returned.
  std::vector<uint64_t> complete(const StepPlan& plan, std::span<const int32_t> sampled);

  // Retires a request: one that complete() stopped, or one ended early (stop token or string, client
  // abort), whose blocks are freed. Its state is gone afterwards. Refuses an unknown id.
  Status finish(uint64_t id);

  const SequenceState* find(uint64_t id) const;
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  bool idle() const { return waiting_.empty() && running_.empty(); }
  const SchedulerConfig& config() const { return config_; }

 private:
  void preempt(uint64_t id);
  void release(SequenceState& s);

  SchedulerConfig config_;
  BlockPool* pool_;
  std::map<uint64_t, SequenceState> seqs_;
  std::deque<uint64_t> waiting_;
  std::vector<uint64_t> running_;  // admission order
};

}  // namespace mxq
