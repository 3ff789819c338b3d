// Prefix caching without a model: the block pool's reference counts, chained hashes, LRU of cached blocks,
// eviction and reset; the scheduler's cache hits (never the whole prompt), deferral of n copies of a prompt
// being prefilled, copy-on-write of the partial block from a running sequence, preemption with shared
// blocks, counters, and the prefill tokens n = 8 costs against n = 1.
// The engine's numerics with caching on (bit for bit those with it off) are in prefix_cache_engine_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <ostream>
#include <string>

#include "engine/block_pool.h"
#include "engine/scheduler.h"
#include "scheduler_test_util.h"

namespace mxq {
namespace {

using test::prompt_of;
using test::run_step;

// Prompt tokens (positions < prompt_len) that `plan` computes.
int64_t prefill_tokens(const Scheduler& s, const StepPlan& plan) {
  int64_t n = 0;
  for (const auto& c : plan.chunks)
    n += std::max<int64_t>(0, std::min(c.start + c.count, s.find(c.id)->prompt_len) - c.start);
  return n;
}

// Steps `s` until idle, retiring finished sequences; returns the prompt tokens computed.
int64_t drain(Scheduler& s) {
  int64_t prefill = 0;
  for (int step = 0; step < 10000 && !s.idle(); ++step) {
    StepPlan p = s.schedule();
    prefill += prefill_tokens(s, p);
    for (uint64_t id : run_step(s, p)) EXPECT_TRUE(s.finish(id));
  }
  EXPECT_TRUE(s.idle());
  return prefill;
}

TEST(BlockPoolCache, HashesAreChainedOverWholePrefixes) {
  const std::vector<int32_t> a{1, 2, 3, 4}, b{1, 2, 3, 5};
  EXPECT_EQ(BlockPool::hash_block(7, a), BlockPool::hash_block(7, a));
  EXPECT_NE(BlockPool::hash_block(7, a), BlockPool::hash_block(7, b));
  EXPECT_NE(BlockPool::hash_block(7, a), BlockPool::hash_block(8, a));  // same tokens, other prefix
}

TEST(BlockPoolCache, SharedBlocksAreFreedByTheLastHolder) {
  BlockPool pool(4, 2);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.allocate(2, a));
  ASSERT_TRUE(pool.register_hash(a[0], 11));
  EXPECT_FALSE(pool.register_hash(a[0], 12));  // one hash per block
  EXPECT_FALSE(pool.register_hash(a[1], 11));  // one block per hash: the first stays the cached copy
  ASSERT_EQ(pool.lookup(11), a[0]);
  pool.share(a[0]);
  EXPECT_EQ(pool.ref_count(a[0]), 2);
  pool.release(a);  // a[0] still held by the sharer, a[1] (unhashed) plain free
  EXPECT_EQ(pool.free_blocks(), 3);
  EXPECT_EQ(pool.cached_blocks(), 0);
  pool.release(std::vector<int32_t>{a[0]});
  EXPECT_EQ(pool.free_blocks(), 4);  // cached blocks count as free
  EXPECT_EQ(pool.cached_blocks(), 1);
  EXPECT_EQ(pool.lookup(11), a[0]);
  pool.share(a[0]);  // revived from the LRU list
  EXPECT_EQ(pool.free_blocks(), 3);
  EXPECT_EQ(pool.cached_blocks(), 0);
  EXPECT_EQ(pool.ref_count(a[0]), 1);
}

TEST(BlockPoolCache, EvictsOldestCachedBlockOnlyWhenNoPlainBlockIsLeft) {
  BlockPool pool(4, 2);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.allocate(2, a));
  ASSERT_TRUE(pool.allocate(1, b));
  for (int32_t i = 0; i < 2; ++i) ASSERT_TRUE(pool.register_hash(a[i], 100 + i));
  ASSERT_TRUE(pool.register_hash(b[0], 200));
  pool.release(a);  // tail first: a[1] is older than a[0] in the LRU list
  pool.release(b);  // newest
  EXPECT_EQ(pool.cached_blocks(), 3);
  std::vector<int32_t> c;
  ASSERT_TRUE(pool.allocate(1, c));  // block 3, never used: no eviction
  EXPECT_EQ(c[0], 3);
  EXPECT_EQ(pool.evictions(), 0);
  ASSERT_TRUE(pool.allocate(2, c));  // evicts a[1], then a[0]
  EXPECT_EQ(c[1], a[1]);
  EXPECT_EQ(c[2], a[0]);
  EXPECT_EQ(pool.evictions(), 2);
  EXPECT_EQ(pool.lookup(100), -1);
  EXPECT_EQ(pool.lookup(101), -1);
  EXPECT_EQ(pool.lookup(200), b[0]);
  EXPECT_FALSE(pool.has_hash(c[1]));  // an evicted block comes back without its hash
  EXPECT_FALSE(pool.allocate(2, c));  // 1 left
  pool.release(c);
  EXPECT_EQ(pool.free_blocks(), 4);
}

TEST(BlockPoolCache, ResetForgetsEveryHash) {
  BlockPool pool(3, 2);
  std::vector<int32_t> held, cached;
  ASSERT_TRUE(pool.allocate(1, held));
  ASSERT_TRUE(pool.allocate(1, cached));
  ASSERT_TRUE(pool.register_hash(held[0], 1));
  ASSERT_TRUE(pool.register_hash(cached[0], 2));
  pool.release(cached);
  const uint64_t epoch = pool.epoch();
  pool.reset_prefix_cache();
  EXPECT_EQ(pool.epoch(), epoch + 1);
  EXPECT_EQ(pool.lookup(1), -1);
  EXPECT_EQ(pool.lookup(2), -1);
  EXPECT_EQ(pool.cached_blocks(), 0);
  EXPECT_EQ(pool.free_blocks(), 2);
  EXPECT_EQ(pool.ref_count(held[0]), 1);  // still the sequence's
  pool.release(held);
  EXPECT_EQ(pool.cached_blocks(), 0);  // came back unhashed
  EXPECT_EQ(pool.free_blocks(), 3);
}

// A second request with the same prompt hits every full block but the one holding its last token.
struct HitCase {
  int64_t prompt_len;
  int64_t want_hit;
};
class SchedulerPrefixHit : public ::testing::TestWithParam<HitCase> {};

TEST_P(SchedulerPrefixHit, NeverCoversTheLastToken) {
  const HitCase& hc = GetParam();
  BlockPool pool(64, 16);
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 512, .max_model_len = 256}, pool);
  const auto prompt = prompt_of(hc.prompt_len);
  ASSERT_TRUE(s.add(1, prompt, 2));
  drain(s);
  EXPECT_EQ(pool.free_blocks(), pool.num_blocks());
  EXPECT_EQ(pool.cached_blocks(), static_cast<int32_t>((hc.prompt_len + 1) / 16));  // prompt + 1st token
  ASSERT_TRUE(s.add(2, prompt, 2));
  StepPlan p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].start, hc.want_hit);
  EXPECT_EQ(p.chunks[0].count, hc.prompt_len - hc.want_hit);
  EXPECT_TRUE(p.chunks[0].samples);
  EXPECT_EQ(s.find(2)->cached_tokens, hc.want_hit);
  EXPECT_EQ(s.counters().prefix_queries, 2 * hc.prompt_len);
  EXPECT_EQ(s.counters().prefix_hits, hc.want_hit);
  run_step(s, p);
  drain(s);
  EXPECT_EQ(pool.free_blocks(), pool.num_blocks());
}

INSTANTIATE_TEST_SUITE_P(Scheduler, SchedulerPrefixHit,
                         ::testing::Values(HitCase{1, 0}, HitCase{15, 0}, HitCase{16, 0}, HitCase{17, 16},
                                           HitCase{32, 16}, HitCase{33, 32}, HitCase{47, 32}),
                         [](const auto& info) { return "len" + std::to_string(info.param.prompt_len); });

TEST(SchedulerPrefixCache, OffNeitherHashesNorShares) {
  BlockPool pool(16, 4);
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_model_len = 64}, pool, false);
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(s.add(id, prompt_of(13), 3));
  StepPlan p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 3u);  // no deferral: each computes its whole prompt
  for (const auto& c : p.chunks) EXPECT_EQ(c.count, 13);
  run_step(s, p);
  drain(s);
  EXPECT_EQ(pool.cached_blocks(), 0);
  EXPECT_EQ(s.counters().prefix_queries, 0);
}

// n copies of one prompt: the first prefills it, the others wait one step, hit its blocks and copy its
// partial block; a later, unrelated request goes ahead of the waiting copies.
TEST(SchedulerPrefixCache, DefersCopiesUntilThePromptIsPrefilled) {
  BlockPool pool(64, 4);
  Scheduler s({.max_num_seqs = 16, .max_num_batched_tokens = 64, .max_model_len = 64}, pool);
  const auto prompt = prompt_of(22);  // 5 full blocks + 2 tokens: copies hit 20 tokens and copy 1
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(s.add(id, prompt, 3));
  ASSERT_TRUE(s.add(9, prompt_of(6, 100), 3));
  StepPlan p1 = s.schedule();
  ASSERT_EQ(p1.chunks.size(), 2u);
  EXPECT_EQ(p1.chunks[0].id, 1u);
  EXPECT_EQ(p1.chunks[0].count, 22);
  EXPECT_EQ(p1.chunks[1].id, 9u);  // went ahead of the deferred copies
  EXPECT_EQ(p1.deferred, (std::vector<uint64_t>{2, 3, 4}));
  run_step(s, p1);
  StepPlan p2 = s.schedule();
  ASSERT_EQ(p2.chunks.size(), 5u);
  EXPECT_TRUE(p2.deferred.empty());
  ASSERT_EQ(p2.copies.size(), 3u);
  for (size_t i = 2; i < 5; ++i) {
    EXPECT_EQ(p2.chunks[i].id, i);
    EXPECT_EQ(p2.chunks[i].start, 21);
    EXPECT_EQ(p2.chunks[i].count, 1);
    EXPECT_EQ(s.find(i)->cached_tokens, 21);
    for (size_t k = 0; k < 5; ++k) EXPECT_EQ(s.find(i)->blocks[k], s.find(1)->blocks[k]);
    EXPECT_EQ(p2.copies[i - 2].src, s.find(1)->blocks[5]);
    EXPECT_EQ(p2.copies[i - 2].dst, s.find(i)->blocks[5]);
    EXPECT_EQ(p2.copies[i - 2].slots, 1);
    EXPECT_EQ(pool.ref_count(s.find(i)->blocks[5]), 1);
  }
  for (size_t k = 0; k < 5; ++k) EXPECT_EQ(pool.ref_count(s.find(1)->blocks[k]), 4);
  run_step(s, p2);
  drain(s);
  EXPECT_EQ(s.counters().prefix_hits, 63);
  EXPECT_EQ(pool.free_blocks(), pool.num_blocks());
}

// With chunked prefill the copies wait while the first one's prompt runs chunk by chunk.
TEST(SchedulerPrefixCache, DefersCopiesAcrossPrefillChunks) {
  BlockPool pool(64, 4);
  Scheduler s({.max_num_seqs = 16, .max_num_batched_tokens = 8, .max_model_len = 64}, pool);
  const auto prompt = prompt_of(30);
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(s.add(id, prompt, 2));
  std::vector<int64_t> starts;
  StepPlan p;
  for (int step = 0; step < 4; ++step) {
    p = s.schedule();
    ASSERT_EQ(p.chunks.size(), 1u) << "step " << step;
    starts.push_back(p.chunks[0].start);
    run_step(s, p);
  }
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 8, 16, 24}));
  // note: only the last chunk (6 tokens) leaves budget to look at the copies; they wait for block 6.
  EXPECT_EQ(p.deferred, (std::vector<uint64_t>{2, 3}));
  p = s.schedule();  // 1 decodes; 2 and 3 hit 28 tokens, copy 1 and compute 1 each
  ASSERT_EQ(p.chunks.size(), 3u);
  EXPECT_EQ(p.chunks[1].start, 29);
  EXPECT_EQ(p.chunks[2].start, 29);
  EXPECT_EQ(p.copies.size(), 2u);
  run_step(s, p);
  drain(s);
  EXPECT_EQ(pool.free_blocks(), pool.num_blocks());
}

// Preempting a sequence that shares blocks only drops its references; its readmission hits its own blocks.
TEST(SchedulerPrefixCache, PreemptionReleasesSharedBlocksByReference) {
  // 2-slot blocks, 7 of them: two copies of a 5-token prompt share 2 blocks and hold 1 each (4 in use).
  BlockPool pool(7, 2);
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_model_len = 16}, pool);
  const auto prompt = prompt_of(5);
  ASSERT_TRUE(s.add(1, prompt, 8));
  ASSERT_TRUE(s.add(2, prompt, 8));
  run_step(s, s.schedule());  // 1 prefills, 2 deferred
  run_step(s, s.schedule());  // 2 hits 4 tokens
  const std::vector<int32_t> shared(s.find(1)->blocks.begin(), s.find(1)->blocks.begin() + 2);
  EXPECT_EQ(pool.ref_count(shared[0]), 2);
  EXPECT_EQ(pool.free_blocks(), 3);
  // Both grow a block every two steps; the pool runs out and 2 (newest) is preempted.
  StepPlan p;
  for (int step = 0; step < 8 && p.preempted.empty(); ++step) {
    p = s.schedule();
    if (p.preempted.empty()) run_step(s, p);
  }
  ASSERT_EQ(p.preempted, (std::vector<uint64_t>{2}));
  EXPECT_EQ(s.counters().preemptions, 1);
  EXPECT_EQ(pool.ref_count(shared[0]), 1);  // still 1's
  EXPECT_EQ(pool.ref_count(shared[1]), 1);
  run_step(s, p);
  drain(s);
  // 2 was readmitted with a hit and finished with all its tokens.
  EXPECT_GE(s.counters().prefix_hits, 8);
  EXPECT_EQ(pool.free_blocks(), pool.num_blocks());
}

// Blocks full of generated tokens are cached too: a follow-up turn (prompt + answer + more) hits them.
TEST(SchedulerPrefixCache, CachesGeneratedBlocks) {
  BlockPool pool(32, 4);
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_model_len = 64}, pool);
  ASSERT_TRUE(s.add(1, prompt_of(6), 7));  // tokens: 1..6, then 1001 x 7
  for (int step = 0; step < 20 && !s.find(1)->finished; ++step) run_step(s, s.schedule());
  std::vector<int32_t> turn2 = s.find(1)->tokens;  // 13 tokens, 12 computed: 3 full blocks cached
  ASSERT_TRUE(s.finish(1));
  EXPECT_EQ(pool.cached_blocks(), 3);
  turn2.push_back(77);
  turn2.push_back(78);
  ASSERT_TRUE(s.add(2, turn2, 1));
  StepPlan p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].start, 12);
  EXPECT_EQ(s.find(2)->cached_tokens, 12);
  run_step(s, p);
  drain(s);
}

// After a reset nothing computed before it is hit, and a sequence admitted before it registers nothing.
TEST(SchedulerPrefixCache, ResetStopsReuseOfOldBlocks) {
  BlockPool pool(32, 4);
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_model_len = 64}, pool);
  const auto prompt = prompt_of(9);
  ASSERT_TRUE(s.add(1, prompt, 10));
  run_step(s, s.schedule());  // 1: prompt computed, 2 blocks registered
  s.reset_prefix_cache();
  run_step(s, s.schedule());  // 1 decodes position 9..: its third block fills later, unregistered
  ASSERT_TRUE(s.add(2, prompt, 1));
  StepPlan p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[1].start, 0);  // no hit: the old blocks were forgotten
  EXPECT_TRUE(p.deferred.empty());  // 1 belongs to the old epoch: nothing to wait for
  run_step(s, p);
  for (int step = 0; step < 8; ++step) run_step(s, s.schedule());
  for (size_t k = 0; k < s.find(1)->blocks.size(); ++k) EXPECT_FALSE(pool.has_hash(s.find(1)->blocks[k]));
  drain(s);
  ASSERT_TRUE(s.add(3, prompt, 1));  // 2 computed the prompt after the reset: its blocks hit
  EXPECT_EQ(s.schedule().chunks[0].start, 8);
}

// Copy-on-write of the partial block: a copy admitted while the first sequence runs shares its full blocks,
// gets a fresh block for the partial one with the first sequence's slots copied into it, and computes only
// its last token; the first sequence's end (finish, abort) leaves the copies' blocks theirs.
struct CopyCase {
  const char* name;
  int64_t prompt_len;
  int32_t block_size;
  int64_t budget;
  std::vector<int64_t> producer_chunks;  // the first sequence's chunks before the copies are admitted
  int steps_deferred;                    // steps the copies are deferred in that time
};
void PrintTo(const CopyCase& c, std::ostream* os) {
  *os << c.name << " {prompt " << c.prompt_len << ", block " << c.block_size << ", budget " << c.budget
      << "}";
}
class SchedulerPrefixCopy : public ::testing::TestWithParam<CopyCase> {};

TEST_P(SchedulerPrefixCopy, CopiesThePartialBlockOfARunningSequence) {
  const CopyCase& cc = GetParam();
  const int64_t bs = cc.block_size, want = cc.prompt_len - 1, hit = want / bs * bs;
  BlockPool pool(64, cc.block_size);
  Scheduler s({.max_num_seqs = 8, .max_num_batched_tokens = cc.budget, .max_model_len = 128}, pool);
  const auto prompt = prompt_of(cc.prompt_len);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(s.add(id, prompt, 3));
  std::vector<int64_t> chunks;
  int deferred = 0;
  StepPlan p = s.schedule();
  for (; p.chunks.size() == 1; p = s.schedule()) {
    ASSERT_EQ(p.chunks[0].id, 1u);
    ASSERT_LT(chunks.size(), 16u);
    chunks.push_back(p.chunks[0].count);
    deferred += p.deferred.size() == 3;
    EXPECT_TRUE(p.copies.empty());
    run_step(s, p);
  }
  EXPECT_EQ(chunks, cc.producer_chunks);
  EXPECT_EQ(deferred, cc.steps_deferred);
  // 1 goes on (decoding, or its last prompt token while the copies read the slots before it) ...
  const SequenceState& one = *s.find(1);
  ASSERT_EQ(p.chunks.size(), 4u);
  EXPECT_EQ(p.chunks[0].start, one.computed);
  EXPECT_GE(one.computed, want);
  // ... and 2, 3, 4 copy [hit, want) from its block and compute their last token.
  ASSERT_EQ(p.copies.size(), 3u);
  const auto k = static_cast<size_t>(hit / bs);
  for (uint64_t id = 2; id <= 4; ++id) {
    const ScheduledChunk& c = p.chunks[id - 1];
    const SequenceState& q = *s.find(id);
    EXPECT_EQ(c.id, id);
    EXPECT_EQ(c.start, want);
    EXPECT_EQ(c.count, 1);
    EXPECT_TRUE(c.samples);
    EXPECT_EQ(q.cached_tokens, want);
    ASSERT_EQ(q.blocks.size(), k + 1);
    for (size_t b = 0; b < k; ++b) EXPECT_EQ(q.blocks[b], one.blocks[b]);
    const BlockCopy& cp = p.copies[id - 2];
    EXPECT_EQ(cp.src, one.blocks[k]);
    EXPECT_EQ(cp.dst, q.blocks[k]);
    EXPECT_NE(cp.dst, cp.src);
    EXPECT_EQ(cp.slots, want - hit);
    EXPECT_EQ(pool.ref_count(cp.dst), 1);
  }
  EXPECT_EQ(pool.ref_count(one.blocks[k]), 1);  // the source stays 1's alone
  EXPECT_EQ(s.counters().prefix_hits, 3 * want);
  EXPECT_EQ(s.counters().prefix_queries, 4 * cc.prompt_len);
  run_step(s, p);
  ASSERT_TRUE(s.finish(1));  // the producer ends (an abort): the copies own what they copied
  ASSERT_TRUE(s.finish(3));
  drain(s);
  EXPECT_EQ(pool.free_blocks(), pool.num_blocks());
}

INSTANTIATE_TEST_SUITE_P(
    Scheduler, SchedulerPrefixCopy,
    ::testing::Values(
        // name, prompt, block, budget, producer chunks, steps deferred
        CopyCase{"whole_prompt", 30, 8, 64, {30}, 1},
        CopyCase{"short_prompt", 10, 16, 64, {10}, 1},  // no full block: the partial rule alone defers
        // the full blocks are registered after the first chunk (which leaves no budget to look at the
        // copies), the partial block only after the second: they wait for it with every full block hit
        CopyCase{"waits_for_the_partial_block", 30, 8, 27, {27, 3}, 1},
        // 1 computed exactly [0, want): it writes slot want - hit of the source block in the step whose
        // copies read slots [0, want - hit) of it
        CopyCase{"producer_at_the_last_token", 30, 8, 29, {29}, 0}),
    [](const auto& info) { return std::string(info.param.name); });

// Only the same tokens are copied (the partial block compared token by token), and only from a sequence of
// the current cache epoch.
TEST(SchedulerPrefixCopy, CopiesOnlyTheSameTokensOfTheCurrentEpoch) {
  BlockPool pool(64, 8);
  Scheduler s({.max_num_seqs = 8, .max_num_batched_tokens = 64, .max_model_len = 64}, pool);
  const auto prompt = prompt_of(30);
  ASSERT_TRUE(s.add(1, prompt, 20));
  run_step(s, s.schedule());
  auto other = prompt;
  other[27] = 99;  // in the partial block [24, 29)
  auto last = prompt;
  last[29] = 77;  // the last token only: not copied, computed anyway
  ASSERT_TRUE(s.add(2, other, 2));
  ASSERT_TRUE(s.add(3, last, 2));
  StepPlan p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 3u);
  EXPECT_EQ(p.chunks[1].start, 24);  // full blocks hit, the partial one computed
  EXPECT_EQ(p.chunks[1].count, 6);
  EXPECT_EQ(p.chunks[2].start, 29);
  ASSERT_EQ(p.copies.size(), 1u);
  EXPECT_EQ(p.copies[0].dst, s.find(3)->blocks[3]);
  run_step(s, p);
  s.reset_prefix_cache();
  ASSERT_TRUE(s.add(4, prompt, 2));
  p = s.schedule();  // 1 computed the prompt with the old weights: nothing hit, nothing copied or waited for
  ASSERT_EQ(p.chunks.size(), 4u);
  EXPECT_EQ(p.chunks[3].start, 0);
  EXPECT_TRUE(p.copies.empty());
  EXPECT_TRUE(p.deferred.empty());
  run_step(s, p);
  drain(s);
  EXPECT_EQ(pool.free_blocks(), pool.num_blocks());
}

// The goal of prompt sharing, measured on the plans: the prompt tokens n samples of one prompt compute,
// against one sample. The copies share the full blocks and copy the partial one from the first sample, so
// n = 8 costs L + 7 tokens (their last tokens), <= 1.2x of n = 1 from L = 35 on.
struct NCase {
  int64_t prompt_len;
  int64_t budget;
};
class SchedulerPrefillCost : public ::testing::TestWithParam<NCase> {};

TEST_P(SchedulerPrefillCost, EightSamplesPrefillThePromptOnce) {
  const NCase& nc = GetParam();
  constexpr int32_t kBlock = 16;
  auto cost = [&](int n, bool caching) {
    BlockPool pool(512, kBlock);
    Scheduler s({.max_num_seqs = 64, .max_num_batched_tokens = nc.budget, .max_model_len = 1024}, pool,
                caching);
    const auto prompt = prompt_of(nc.prompt_len);
    for (int i = 0; i < n; ++i) EXPECT_TRUE(s.add(static_cast<uint64_t>(i), prompt, 16));
    const int64_t tokens = drain(s);
    EXPECT_EQ(pool.free_blocks(), pool.num_blocks());
    return tokens;
  };
  const int64_t one = cost(1, true), eight = cost(8, true), eight_off = cost(8, false);
  const int64_t r = nc.prompt_len - (nc.prompt_len - 1) / kBlock * kBlock;
  EXPECT_EQ(one, nc.prompt_len);
  EXPECT_EQ(eight, nc.prompt_len + 7);
  EXPECT_EQ(eight_off, 8 * nc.prompt_len);
  EXPECT_LE(eight * 5, one * 6);  // <= 1.2x
  std::printf(
      "| prompt %5lld | budget %5lld | partial block %2lld | n=1 %5lld | n=8 %5lld (%.3fx, without the copy "
      "%5lld = %.3fx) | caching off %5lld |\n",
      static_cast<long long>(nc.prompt_len), static_cast<long long>(nc.budget), static_cast<long long>(r),
      static_cast<long long>(one), static_cast<long long>(eight),
      static_cast<double>(eight) / static_cast<double>(one), static_cast<long long>(nc.prompt_len + 7 * r),
      static_cast<double>(nc.prompt_len + 7 * r) / static_cast<double>(one),
      static_cast<long long>(eight_off));
}

INSTANTIATE_TEST_SUITE_P(Scheduler, SchedulerPrefillCost,
                         ::testing::Values(NCase{35, 8192}, NCase{100, 8192}, NCase{100, 33},
                                           NCase{113, 8192}, NCase{113, 32}, NCase{127, 8192},
                                           NCase{128, 8192}, NCase{128, 24}, NCase{129, 64}, NCase{500, 8192},
                                           NCase{1000, 256}),
                         [](const auto& info) {
                           return "len" + std::to_string(info.param.prompt_len) + "_budget" +
                                  std::to_string(info.param.budget);
                         });

}  // namespace
}  // namespace mxq
