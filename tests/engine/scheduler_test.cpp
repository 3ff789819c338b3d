#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "scheduler_test_util.h"

namespace mxq {
namespace {

using test::prompt_of;
using test::run_step;

TEST(BlockPool, AllocatesAllOrNothingAndReleases) {
  BlockPool pool(4, 16);
  EXPECT_EQ(pool.blocks_for(0), 0);
  EXPECT_EQ(pool.blocks_for(16), 1);
  EXPECT_EQ(pool.blocks_for(17), 2);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.allocate(3, a));
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FALSE(pool.allocate(2, a));
  EXPECT_EQ(a.size(), 3u);  // nothing appended on failure
  pool.release(a);
  EXPECT_EQ(pool.free_blocks(), 4);
}

TEST(Scheduler, RefusesBadRequestsByName) {
  BlockPool pool(4, 16);
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 32, .max_model_len = 100}, pool);
  auto p = prompt_of(10);
  ASSERT_TRUE(s.add(7, p, 5));
  EXPECT_NE(s.add(7, p, 5).error().message.find("already in use"), std::string::npos);
  EXPECT_NE(s.add(8, {}, 5).error().message.find("empty prompt"), std::string::npos);
  EXPECT_NE(s.add(8, p, 0).error().message.find("max_new_tokens 0"), std::string::npos);
  EXPECT_NE(s.add(8, p, 91).error().message.find("max_model_len 100"), std::string::npos);
  // 10 + 60 - 1 = 69 slots need 5 blocks of 16, the pool has 4.
  EXPECT_NE(s.add(8, p, 60).error().message.find("needs 5 KV blocks"), std::string::npos);
  EXPECT_NE(s.finish(99).error().message.find("no such request"), std::string::npos);
  Scheduler strict({.max_num_batched_tokens = 8, .max_model_len = 100, .chunked_prefill = false}, pool);
  EXPECT_NE(strict.add(1, p, 1).error().message.find("chunked prefill is off"), std::string::npos);
}

TEST(Scheduler, PrefillThenDecodeInOneBatch) {
  BlockPool pool(16, 4);
  Scheduler s({.max_num_seqs = 8, .max_num_batched_tokens = 64, .max_model_len = 64}, pool);
  ASSERT_TRUE(s.add(1, prompt_of(5), 3));
  StepPlan p1 = s.schedule();
  ASSERT_EQ(p1.chunks.size(), 1u);
  EXPECT_EQ(p1.chunks[0].start, 0);
  EXPECT_EQ(p1.chunks[0].count, 5);
  EXPECT_TRUE(p1.chunks[0].samples);
  EXPECT_EQ(s.find(1)->blocks.size(), 2u);
  run_step(s, p1);
  // note: a prompt of its own: 1's tokens 1, 2 would be copied from its block (copy-on-write, see
  // prefix_cache_test.cpp)
  ASSERT_TRUE(s.add(2, prompt_of(3, 50), 2));
  StepPlan p2 = s.schedule();  // decode of 1 first, then the prefill of 2
  ASSERT_EQ(p2.chunks.size(), 2u);
  EXPECT_EQ(p2.chunks[0].id, 1u);
  EXPECT_EQ(p2.chunks[0].start, 5);
  EXPECT_EQ(p2.chunks[0].count, 1);
  EXPECT_EQ(p2.chunks[1].id, 2u);
  EXPECT_EQ(p2.chunks[1].count, 3);
  EXPECT_EQ(p2.tokens, 4);
  run_step(s, p2);
  EXPECT_EQ(s.find(1)->tokens.back(), 1001);
  EXPECT_EQ(s.find(1)->generated(), 2);
}

TEST(Scheduler, ChunksAPromptOverTheTokenBudget) {
  BlockPool pool(16, 4);
  Scheduler s({.max_num_seqs = 8, .max_num_batched_tokens = 4, .max_model_len = 64}, pool);
  ASSERT_TRUE(s.add(1, prompt_of(10), 1));
  std::vector<int64_t> starts;
  for (int step = 0; step < 3; ++step) {
    StepPlan p = s.schedule();
    ASSERT_EQ(p.chunks.size(), 1u);
    starts.push_back(p.chunks[0].start);
    EXPECT_EQ(p.chunks[0].samples, step == 2);
    EXPECT_LE(p.tokens, 4);
    auto done = run_step(s, p);
    EXPECT_EQ(done.size(), step == 2 ? 1u : 0u);
  }
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 4, 8}));
  const SequenceState* st = s.find(1);
  ASSERT_NE(st, nullptr);
  EXPECT_TRUE(st->finished);
  EXPECT_EQ(st->tokens.back(), 1001);
  EXPECT_EQ(pool.free_blocks(), 16);  // a finished sequence holds no blocks
  ASSERT_TRUE(s.finish(1));
  EXPECT_TRUE(s.idle());
}

TEST(Scheduler, HonoursMaxNumSeqs) {
  BlockPool pool(64, 4);
  Scheduler s({.max_num_seqs = 2, .max_num_batched_tokens = 100, .max_model_len = 64}, pool);
  // note: prompts of their own; copies of one prompt would wait for the first one's prefill
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(s.add(id, prompt_of(2, static_cast<int32_t>(10 * id)), 4));
  StepPlan p = s.schedule();
  EXPECT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(s.num_waiting(), 1u);
  run_step(s, p);
  ASSERT_TRUE(s.finish(1));  // a stop token ends 1: 3 is admitted next step
  p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(p.chunks[1].id, 3u);
}

TEST(Scheduler, PreemptsTheNewestAndRecomputesIt) {
  // 4 blocks of 2 slots: two sequences of prompt 3 take 2 blocks each; the first to cross a block boundary
  // preempts the second. Prefix caching off: the recompute starts at 0 (prefix_cache_test.cpp has it on).
  BlockPool pool(4, 2);
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 64, .max_model_len = 8}, pool,
              /*enable_prefix_caching=*/false);
  ASSERT_TRUE(s.add(1, prompt_of(3), 4));
  ASSERT_TRUE(s.add(2, prompt_of(3, 50), 4));
  run_step(s, s.schedule());  // both prefilled: 3 tokens + sample -> 4 tokens, 3 computed, 2 blocks each
  EXPECT_EQ(pool.free_blocks(), 0);
  run_step(s, s.schedule());  // decode position 3 fits the second block of each
  StepPlan p = s.schedule();  // position 4 needs a third block for 1: 2 is preempted
  ASSERT_EQ(p.preempted, (std::vector<uint64_t>{2}));
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].id, 1u);
  EXPECT_EQ(s.find(2)->computed, 0);
  EXPECT_TRUE(s.find(2)->blocks.empty());
  EXPECT_EQ(s.find(2)->preemptions, 1);
  run_step(s, p);
  // 1 finishes after one more decode; then 2 is recomputed: prompt + its 2 tokens in one chunk that samples.
  auto done = run_step(s, s.schedule());
  ASSERT_EQ(done, (std::vector<uint64_t>{1}));
  ASSERT_TRUE(s.finish(1));
  p = s.schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].id, 2u);
  EXPECT_EQ(p.chunks[0].start, 0);
  EXPECT_EQ(p.chunks[0].count, 5);
  EXPECT_TRUE(p.chunks[0].samples);
  EXPECT_EQ(s.counters().preemptions, 1);
  EXPECT_EQ(s.counters().prefix_queries, 0);  // nothing is looked up with prefix caching off
}

// Random arrivals, lengths and early stops against a small pool: every step respects the budget, the
// sequence cap and the block accounting (each block's reference count is the number of sequences holding it;
// held + free = all); every request ends with exactly its tokens, none is lost. Every prompt is 1, 2, .., n,
// so with prefix caching on they share their leading blocks.
class SchedulerRandom : public ::testing::TestWithParam<bool> {};

TEST_P(SchedulerRandom, WorkloadKeepsInvariants) {
  const bool caching = GetParam();
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    const int32_t block = 1 + static_cast<int32_t>(rng() % 8);
    BlockPool pool(12 + static_cast<int32_t>(rng() % 24), block);
    SchedulerConfig cfg{.max_num_seqs = 1 + static_cast<int32_t>(rng() % 6),
                        .max_num_batched_tokens = 1 + static_cast<int64_t>(rng() % 40),
                        .max_model_len = 48,
                        .chunked_prefill = true};
    Scheduler s(cfg, pool, caching);
    std::map<uint64_t, int64_t> want;  // id -> tokens it must end with
    uint64_t next_id = 1;
    for (int step = 0; step < 2000 && (next_id <= 60 || !s.idle()); ++step) {
      if (next_id <= 60 && rng() % 3 == 0) {
        const int64_t n = 1 + static_cast<int64_t>(rng() % 24), m = 1 + static_cast<int64_t>(rng() % 20);
        if (s.add(next_id, prompt_of(n), m)) want[next_id] = n + m;
        ++next_id;
      }
      StepPlan p = s.schedule();
      ASSERT_LE(p.tokens, cfg.max_num_batched_tokens);
      ASSERT_LE(static_cast<int32_t>(p.chunks.size()), cfg.max_num_seqs);
      int64_t held = 0;
      for (const auto& c : p.chunks) {
        const SequenceState* st = s.find(c.id);
        ASSERT_EQ(c.start, st->computed);
        ASSERT_GE(static_cast<int64_t>(st->blocks.size()) * block, c.start + c.count);
      }
      std::map<int32_t, int32_t> holders;
      for (uint64_t id = 1; id < next_id; ++id)
        if (const SequenceState* st = s.find(id))
          for (int32_t b : st->blocks) ++holders[b];
      for (auto [b, n] : holders) ASSERT_EQ(pool.ref_count(b), n) << "block " << b;
      held = static_cast<int64_t>(holders.size());
      ASSERT_EQ(held + pool.free_blocks(), pool.num_blocks());
      for (uint64_t id : run_step(s, p)) {
        ASSERT_EQ(static_cast<int64_t>(s.find(id)->tokens.size()), want.at(id));
        ASSERT_TRUE(s.finish(id));
        want.erase(id);
      }
      if (!s.idle() && rng() % 17 == 0 && !want.empty()) {  // a stop token ends a random live request
        const uint64_t id = std::next(want.begin(), static_cast<long>(rng() % want.size()))->first;
        ASSERT_TRUE(s.finish(id));
        want.erase(id);
      }
    }
    EXPECT_TRUE(s.idle()) << "seed " << seed;
    EXPECT_TRUE(want.empty()) << "seed " << seed;
    EXPECT_EQ(pool.free_blocks(), pool.num_blocks()) << "seed " << seed;
    if (caching) {
      EXPECT_GT(s.counters().prefix_hits, 0) << "seed " << seed;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Scheduler, SchedulerRandom, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "on" : "off"; });

}  // namespace
}  // namespace mxq
