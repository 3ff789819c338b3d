#include "engine/scheduler.h"

#include <algorithm>
#include <cassert>

namespace mxq {

Scheduler::Scheduler(SchedulerConfig config, BlockPool& pool, bool enable_prefix_caching)
    : config_(config), pool_(&pool), prefix_caching_(enable_prefix_caching) {
  assert(config_.max_num_seqs >= 1 && config_.max_num_batched_tokens >= 1 && config_.max_model_len >= 1);
}

Status Scheduler::add(uint64_t id, std::span<const int32_t> prompt, int64_t max_new_tokens) {
  if (seqs_.count(id)) return fail("request {}: the id is already in use", id);
  if (prompt.empty()) return fail("request {}: empty prompt, expected at least one token", id);
  if (max_new_tokens < 1) return fail("request {}: max_new_tokens {}, expected >= 1", id, max_new_tokens);
  const auto n = static_cast<int64_t>(prompt.size());
  if (n + max_new_tokens > config_.max_model_len)
    return fail("request {}: {} prompt tokens + max_new_tokens {} exceed max_model_len {}", id, n,
                max_new_tokens, config_.max_model_len);
  // note: the last generated token is never fed back, so a sequence holds at most n + max_new - 1 slots.
  const int32_t need = pool_->blocks_for(n + max_new_tokens - 1);
  if (need > pool_->num_blocks())
    return fail("request {}: needs {} KV blocks of {} tokens, the whole cache has {}", id, need,
                pool_->block_size(), pool_->num_blocks());
  if (!config_.chunked_prefill && n > config_.max_num_batched_tokens)
    return fail("request {}: {} prompt tokens exceed max_num_batched_tokens {} (chunked prefill is off)", id,
                n, config_.max_num_batched_tokens);
  SequenceState s;
  s.id = id;
  s.tokens.assign(prompt.begin(), prompt.end());
  s.prompt_len = n;
  s.max_new_tokens = max_new_tokens;
  seqs_.emplace(id, std::move(s));
  waiting_.push_back(id);
  return {};
}

void Scheduler::release(SequenceState& s) {
  pool_->release(s.blocks);
  s.blocks.clear();
  s.computed = 0;
  s.hashed_blocks = 0;
}

void Scheduler::preempt(uint64_t id) {
  SequenceState& s = seqs_.at(id);
  release(s);
  ++s.preemptions;
  ++counters_.preemptions;
  running_.erase(std::find(running_.begin(), running_.end(), id));
  waiting_.push_front(id);
}

void Scheduler::update_hashes(SequenceState& s) const {
  const int64_t bs = pool_->block_size();
  for (auto k = static_cast<int64_t>(s.block_hashes.size());
       (k + 1) * bs <= static_cast<int64_t>(s.tokens.size()); ++k) {
    const uint64_t parent = k == 0 ? BlockPool::kRootHash : s.block_hashes[static_cast<size_t>(k - 1)];
    s.block_hashes.push_back(BlockPool::hash_block(
        parent,
        std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(k * bs), static_cast<size_t>(bs))));
  }
}

void Scheduler::register_full_blocks(SequenceState& s) {
  if (!prefix_caching_ || s.cache_epoch != pool_->epoch()) return;
  update_hashes(s);
  const auto full = static_cast<int32_t>(s.computed / pool_->block_size());
  for (; s.hashed_blocks < full; ++s.hashed_blocks)
    pool_->register_hash(s.blocks[static_cast<size_t>(s.hashed_blocks)],
                         s.block_hashes[static_cast<size_t>(s.hashed_blocks)]);
}

bool Scheduler::same_tokens(const SequenceState& r, const SequenceState& s, size_t hit_blocks,
                            int64_t end) const {
  const int64_t hit = static_cast<int64_t>(hit_blocks) * pool_->block_size();
  if (static_cast<int64_t>(r.tokens.size()) < end ||
      !std::equal(s.tokens.begin() + hit, s.tokens.begin() + end, r.tokens.begin() + hit))
    return false;
  if (hit_blocks == 0) return true;
  // note: r's hashes may lag its last sampled token by one step (complete() hashes before appending it);
  // without the hash the tokens themselves are compared.
  if (r.block_hashes.size() >= hit_blocks)
    return r.block_hashes[hit_blocks - 1] == s.block_hashes[hit_blocks - 1];
  return std::equal(s.tokens.begin(), s.tokens.begin() + hit, r.tokens.begin());
}

Scheduler::Match Scheduler::match_prefix(SequenceState& s, size_t sources) {
  Match m;
  if (!prefix_caching_) return m;
  update_hashes(s);
  // note: the last token is always computed, whatever is cached: its logits pick the next token.
  const int64_t want = static_cast<int64_t>(s.tokens.size()) - 1;
  const auto max_hit = static_cast<size_t>(want / pool_->block_size());
  while (m.blocks.size() < max_hit) {
    const int32_t b = pool_->lookup(s.block_hashes[m.blocks.size()]);
    if (b < 0) break;
    m.blocks.push_back(b);
    if (pool_->ref_count(b) == 0) ++m.evictable;
  }
  const size_t next = m.blocks.size();
  if (next < max_hit) {
    for (uint64_t id : running_) {
      const SequenceState& r = seqs_.at(id);
      if (r.cache_epoch == pool_->epoch() && r.block_hashes.size() > next &&
          r.block_hashes[next] == s.block_hashes[next] && static_cast<size_t>(r.hashed_blocks) <= next) {
        m.defer = true;
        break;
      }
    }
    return m;
  }
  // Every full block is hit; the partial block [hit, want), if any, from a running sequence that computed it.
  const int64_t hit = static_cast<int64_t>(next) * pool_->block_size();
  if (want == hit) return m;
  for (size_t i = 0; i < running_.size(); ++i) {
    const SequenceState& r = seqs_.at(running_[i]);
    if (r.cache_epoch != pool_->epoch() || !same_tokens(r, s, next, want)) continue;
    if (r.computed < want) {
      m.defer = true;  // unless another one has computed it
    } else if (i < sources) {
      m.copy_src = r.blocks[next];
      m.copy_slots = want - hit;
      m.defer = false;
      break;
    }
  }
  return m;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int64_t budget = config_.max_num_batched_tokens;
  auto grow = [&](SequenceState& s, int64_t count) {
    const int32_t need = pool_->blocks_for(s.computed + count) - static_cast<int32_t>(s.blocks.size());
    return need <= 0 || pool_->allocate(need, s.blocks);
  };
  auto add_chunk = [&](SequenceState& s, int64_t count) {
    const int64_t total = static_cast<int64_t>(s.tokens.size());
    plan.chunks.push_back({s.id, s.computed, count, s.computed + count == total});
    plan.tokens += count;
    budget -= count;
  };

  // Running sequences first, in admission order; preemption takes the newest running sequence.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    SequenceState& s = seqs_.at(running_[i]);
    const int64_t count = std::min(static_cast<int64_t>(s.tokens.size()) - s.computed, budget);
    bool scheduled = true;
    while (!grow(s, count)) {
      const uint64_t victim = running_.back();
      plan.preempted.push_back(victim);
      preempt(victim);
      if (victim == s.id) {
        scheduled = false;
        break;
      }
    }
    if (!scheduled) break;  // it was the newest running sequence: nothing after it is left to schedule
    add_chunk(s, count);
    ++i;
  }

  // Then waiting sequences, unless this step had to preempt (vLLM's rule: no admission under memory
  // pressure). Only the sequences running now may be copied from: their copied slots were computed before.
  const size_t sources = running_.size();
  for (auto it = waiting_.begin(); plan.preempted.empty() && it != waiting_.end() && budget > 0 &&
                                   static_cast<int32_t>(running_.size()) < config_.max_num_seqs;) {
    SequenceState& s = seqs_.at(*it);
    Match m = match_prefix(s, sources);
    if (m.defer) {
      plan.deferred.push_back(s.id);
      ++it;
      continue;
    }
    const int64_t total = static_cast<int64_t>(s.tokens.size());
    const auto hit_blocks = static_cast<int32_t>(m.blocks.size());
    const int64_t hit = static_cast<int64_t>(hit_blocks) * pool_->block_size() + m.copy_slots;
    int64_t count = total - hit;
    if (count > budget) {
      if (!config_.chunked_prefill) break;
      count = budget;
    }
    const int32_t fresh = pool_->blocks_for(hit + count) - hit_blocks;
    if (fresh + m.evictable > pool_->free_blocks()) break;  // stays first in the queue until blocks are free
    // note: the hits are taken before the fresh blocks, so allocating cannot evict one of them.
    for (int32_t b : m.blocks) pool_->share(b);
    s.blocks = std::move(m.blocks);
    [[maybe_unused]] const bool ok = pool_->allocate(fresh, s.blocks);
    assert(ok);
    // note: the copy's destination is the first fresh block (the one holding the hit's end and the chunk).
    if (m.copy_src >= 0)
      plan.copies.push_back(
          {m.copy_src, s.blocks[static_cast<size_t>(hit_blocks)], static_cast<int32_t>(m.copy_slots)});
    s.computed = hit;
    s.hashed_blocks = hit_blocks;
    s.cache_epoch = pool_->epoch();
    if (prefix_caching_) {
      counters_.prefix_queries += total;
      counters_.prefix_hits += hit;
    }
    if (!s.admitted) s.cached_tokens = hit;
    s.admitted = true;
    it = waiting_.erase(it);
    running_.push_back(s.id);
    add_chunk(s, count);
  }
  return plan;
}

std::vector<uint64_t> Scheduler::complete(const StepPlan& plan, std::span<const int32_t> sampled) {
  std::vector<uint64_t> done;
  size_t next = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    SequenceState& s = seqs_.at(c.id);
    assert(s.computed == c.start);
    s.computed += c.count;
    register_full_blocks(s);
    if (!c.samples) continue;
    assert(next < sampled.size());
    s.tokens.push_back(sampled[next++]);
    if (s.generated() >= s.max_new_tokens) done.push_back(c.id);
  }
  assert(next == sampled.size());
  for (uint64_t id : done) {
    SequenceState& s = seqs_.at(id);
    release(s);
    s.finished = true;
    running_.erase(std::find(running_.begin(), running_.end(), id));
  }
  return done;
}

Status Scheduler::finish(uint64_t id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return fail("request {}: no such request", id);
  release(it->second);
  if (auto r = std::find(running_.begin(), running_.end(), id); r != running_.end()) running_.erase(r);
  if (auto w = std::find(waiting_.begin(), waiting_.end(), id); w != waiting_.end()) waiting_.erase(w);
  seqs_.erase(it);
  return {};
}

const SequenceState* Scheduler::find(uint64_t id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

}  // namespace mxq
