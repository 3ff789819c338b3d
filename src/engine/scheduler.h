// Continuous batching over a paged KV cache, as vLLM's V1 scheduler does it: every step first gives each
// running sequence its next tokens (one for decode, a chunk for a prompt still being prefilled), then admits
// waiting sequences while the step's token budget, --max-num-seqs and free KV blocks allow. When a running
// sequence needs a block and none is free, the most recently admitted running sequence is preempted: its
// blocks are released and it goes back to the front of the queue to be recomputed (prompt + tokens so far,
// from its cache hit) later. The scheduler holds token ids and block ids only; the engine runs the plan on a
// backend and reports back.
// Prefix caching (vLLM's automatic prefix caching; on unless the constructor says otherwise): a sequence is
// admitted with the longest run of its full blocks already in the pool's cache (never its last token, whose
// logits it needs), shared by reference; every block that becomes full of computed K/V is registered under
// the chained hash of its tokens, prompt or generated. A waiting sequence whose next missing block a running
// sequence is prefilling right now (n samples of one prompt) is deferred until that block is registered, so
// the prompt is prefilled once; see schedule().
// The last, partial block of a prompt is never cached, but a running sequence of the same epoch may have
// computed it already (n samples again): the admitted sequence then gets a fresh block, the plan copies the
// computed slots into it (copy-on-write, StepPlan::copies) and only the last token is computed, so n copies
// of a prompt of L tokens cost L + n - 1 prefill tokens.
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
  bool finished = false;  // reached max_new_tokens: blocks freed, kept until finish() retires it

  // Prefix cache (prefix caching on): chained hash of each full block of `tokens`, kept up to date; how many
  // leading blocks of `blocks` were offered to the cache already; the pool's epoch at admission (a sequence
  // admitted before a reset registers nothing more).
  std::vector<uint64_t> block_hashes;
  int32_t hashed_blocks = 0;
  uint64_t cache_epoch = 0;
  // Prompt tokens not computed at its first admission (OpenAI usage): cached blocks plus copied slots.
  int64_t cached_tokens = 0;
  bool admitted = false;  // admitted at least once
  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
};

// One sequence's share of a step: positions [start, start + count) of its tokens go through the model.
struct ScheduledChunk {
  uint64_t id = 0;
  int64_t start = 0;
  int64_t count = 0;
  bool samples = false;  // the chunk ends at the last token: the step samples the sequence's next token
};

// Copy-on-write of a prompt's partial block at admission: slots [0, slots) of pool block `src`, K and V of
// every layer, into pool block `dst`. The runner executes a plan's copies in order, before its forward.
// note: the copy commutes with the step's K/V writes: `dst` is a fresh block of the admitted sequence (no
// other holder), `src` belongs to a sequence that was running before the step's admissions and computed
// the copied slots in earlier steps; that sequence writes only positions >= its computed >= the copied ones,
// and no other sequence writes into a block it does not own alone. So no copy reads another copy's `dst`.
struct BlockCopy {
  int32_t src = 0, dst = 0;
  int32_t slots = 0;  // 1 .. block_size - 1
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;  // running sequences first (admission order), then newly admitted ones
  std::vector<BlockCopy> copies;       // run before the forward (see BlockCopy)
  std::vector<uint64_t> preempted;     // sent back to the queue this step, their blocks freed
  std::vector<uint64_t> deferred;      // waiting, held back for blocks a running sequence is prefilling
  int64_t tokens = 0;                  // sum of chunk counts
  bool empty() const { return chunks.empty(); }
};

// Engine-wide counters, as vLLM's metrics name them.
// note: a sequence is counted once per admission (readmissions after preemption too), with all its tokens,
// as vLLM counts request.num_tokens; deferrals and admissions that wait for blocks count nothing.
// note: hits include the slots a copy-on-write brings (vLLM has no such copy and counts full blocks only):
// their K/V is not computed again, and the hit rate is meant to say how much prefill the cache saved.
struct SchedulerCounters {
  int64_t prefix_queries = 0;  // tokens of admitted sequences looked up in the prefix cache
  int64_t prefix_hits = 0;     // of those, tokens found in the cache or copied from a running sequence
  int64_t preemptions = 0;
};

class Scheduler {
 public:
  // `pool` must outlive the scheduler; config.max_num_seqs, max_num_batched_tokens and max_model_len >= 1.
  Scheduler(SchedulerConfig config, BlockPool& pool, bool enable_prefix_caching = true);

  // Queues a request. Refuses by name: an id in use, an empty prompt, max_new_tokens < 1, prompt +
  // max_new_tokens beyond max_model_len, or a sequence that could not fit the whole pool; without chunked
  // prefill also a prompt longer than max_num_batched_tokens.
  Status add(uint64_t id, std::span<const int32_t> prompt, int64_t max_new_tokens);

  // Running sequences first, then admissions. An admitted sequence of L tokens shares its longest run of
  // cached full blocks before its last token; when that is all of them, and a sequence R of the same epoch
  // that was running before this step's admissions holds its tokens [0, L - 1) with R.computed >= L - 1,
  // it also copies R's slots of the partial block (plan.copies) and starts at L - 1.
  // A waiting sequence is deferred (left in place, later ones may go ahead) when a running sequence of the
  // same epoch is computing what it would compute a second time: the block after its cache hit (to be
  // registered, not computed yet), or, all full blocks hit, its tokens [hit, L - 1) (a running sequence
  // holding its tokens [0, L - 1) has not computed them yet, and none has). note: skipping instead of
  // stopping the queue keeps the budget busy while one long prompt prefills under n copies waiting for it;
  // a deferral lasts only while that sequence runs, and it keeps its place at the front afterwards.
  StepPlan schedule();

  // After the plan's forward: `sampled` holds one token per sampling chunk, in plan order. Advances every
  // chunk's sequence, appends the tokens, and stops sequences that reached max_new_tokens (blocks freed,
  // state kept for the caller to read until finish()); returns their ids. The plan must be the last one
  // schedule() returned.
  std::vector<uint64_t> complete(const StepPlan& plan, std::span<const int32_t> sampled);

  // Retires a request: one that complete() stopped, or one ended early (stop token or string, client
  // abort), whose blocks are freed. Its state is gone afterwards. Refuses an unknown id.
  Status finish(uint64_t id);

  // Drops every cached hash (a weight update: no K/V computed before may be reused); sequences in flight keep
  // their blocks and run on, but register nothing more.
  void reset_prefix_cache() { pool_->reset_prefix_cache(); }

  const SequenceState* find(uint64_t id) const;
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  bool idle() const { return waiting_.empty() && running_.empty(); }
  const SchedulerConfig& config() const { return config_; }
  bool prefix_caching() const { return prefix_caching_; }
  const BlockPool& pool() const { return *pool_; }
  const SchedulerCounters& counters() const { return counters_; }

 private:
  // A waiting sequence's cache hit: the blocks found, the partial block to copy, and whether it is to wait
  // for a running prefill.
  struct Match {
    std::vector<int32_t> blocks;
    int32_t evictable = 0;   // hit blocks now unreferenced: taking them uses up free blocks
    int32_t copy_src = -1;   // a running sequence's block holding the partial block's slots, or -1
    int64_t copy_slots = 0;  // slots to copy from it (the prompt's tokens past the hit, but the last)
    bool defer = false;
  };
  // `sources`: how many leading running sequences may be copied from (those running before admissions).
  Match match_prefix(SequenceState& s, size_t sources);
  // Whether running sequence `r` holds the tokens of `s` on [0, end), `hit_blocks` full blocks of them
  // compared by chained hash, the rest token by token.
  bool same_tokens(const SequenceState& r, const SequenceState& s, size_t hit_blocks, int64_t end) const;
  void update_hashes(SequenceState& s) const;
  void register_full_blocks(SequenceState& s);
  void preempt(uint64_t id);
  void release(SequenceState& s);

  SchedulerConfig config_;
  BlockPool* pool_;
  bool prefix_caching_;
  SchedulerCounters counters_;
  std::map<uint64_t, SequenceState> seqs_;
  std::deque<uint64_t> waiting_;
  std::vector<uint64_t> running_;  // admission order
};

}  // namespace mxq
