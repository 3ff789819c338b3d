// The batched engine on the CPU backend: a request gives the same tokens and logprobs alone, in a batch, split
// into prompt chunks, or preempted and recomputed; aborts and finishes free every KV block.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <bit>
#include <random>

#include "tiny_model.h"

namespace mxq {
namespace {

using test::TinyModel;

struct Req {
  std::vector<int32_t> prompt;
  GenerateParams params;
};

std::vector<Req> random_requests(uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  std::vector<Req> reqs;
  for (int i = 0; i < count; ++i) {
    Req r;
    const int n = 1 + static_cast<int>(rng() % 20);
    for (int j = 0; j < n; ++j) r.prompt.push_back(3 + static_cast<int32_t>(rng() % 250));
    r.params.max_new_tokens = 1 + static_cast<int64_t>(rng() % 12);
    r.params.ignore_eos = rng() % 2;
    r.params.seed = rng();
    r.params.sampling.temperature = (rng() % 3 == 0) ? 0.0f : 0.8f;
    r.params.sampling.top_k = static_cast<int64_t>(rng() % 3) * 20;
    r.params.sampling.num_logprobs = 2;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

// Runs `reqs` through one engine, adding request i at step i % 3 == 0 intervals; returns every request's
// tokens in order of id.
std::vector<std::vector<SampledToken>> run_engine(const std::vector<Req>& reqs, EngineConfig cfg,
                                                  EngineCounters* counters = nullptr) {
  Qwen3Model& model = *TinyModel::get().model;
  auto engine = Engine::create(model.config(), nullptr, cfg, make_cpu_runner(model));
  EXPECT_TRUE(engine) << engine.error().message;
  std::vector<std::vector<SampledToken>> got(reqs.size());
  std::vector<bool> done(reqs.size());
  size_t added = 0;
  for (int step = 0; step < 10000 && (added < reqs.size() || !engine->idle()); ++step) {
    if (added < reqs.size() && step % 2 == 0) {
      EXPECT_TRUE(engine->add(added, reqs[added].prompt, reqs[added].params));
      ++added;
    }
    auto outs = engine->step();
    EXPECT_TRUE(outs) << outs.error().message;
    for (auto& o : *outs) {
      EXPECT_FALSE(done[o.id]);
      for (auto& t : o.tokens) got[o.id].push_back(t);
      if (o.finished) done[o.id] = true;
    }
  }
  EXPECT_TRUE(engine->idle());
  if (counters) *counters = engine->counters();
  EXPECT_EQ(engine->pool().free_blocks(), engine->pool().num_blocks());
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_TRUE(done[i]) << "request " << i;
  return got;
}

void expect_same(const std::vector<SampledToken>& a, const std::vector<SampledToken>& b, size_t i) {
  ASSERT_EQ(a.size(), b.size()) << "request " << i;
  for (size_t t = 0; t < a.size(); ++t) {
    EXPECT_EQ(a[t].id, b[t].id) << "request " << i << " token " << t;
    EXPECT_NEAR(a[t].logprob, b[t].logprob, 1e-4) << "request " << i << " token " << t;
  }
}

TEST(Engine, BatchedEqualsSingle) {
  const auto reqs = random_requests(1, 12);
  Generator gen(*TinyModel::get().model, nullptr);
  std::vector<std::vector<SampledToken>> single;
  for (const Req& r : reqs) single.push_back(gen.generate(r.prompt, r.params)->tokens);
  EngineConfig batched;
  batched.scheduler = {.max_num_seqs = 8, .max_num_batched_tokens = 64, .max_model_len = 64};
  const auto got = run_engine(reqs, batched);
  for (size_t i = 0; i < reqs.size(); ++i) expect_same(got[i], single[i], i);
}

TEST(Engine, ChunkedPrefillAndPreemptionGiveTheSameTokens) {
  const auto reqs = random_requests(2, 10);
  EngineConfig roomy;
  roomy.scheduler = {.max_num_seqs = 16, .max_num_batched_tokens = 256, .max_model_len = 64};
  const auto want = run_engine(reqs, roomy);
  // 5-token budget splits prompts; 6 blocks of 4 slots force preemptions (each request needs <= 8 blocks).
  EngineConfig tight;
  tight.scheduler = {.max_num_seqs = 4, .max_num_batched_tokens = 5, .max_model_len = 64};
  tight.block_size = 4;
  tight.num_blocks = 8;
  const auto got = run_engine(reqs, tight);
  for (size_t i = 0; i < reqs.size(); ++i) expect_same(got[i], want[i], i);
}

void expect_same_bits(const std::vector<SampledToken>& got, const std::vector<SampledToken>& want, size_t i) {
  ASSERT_EQ(got.size(), want.size()) << "request " << i;
  for (size_t t = 0; t < got.size(); ++t) {
    EXPECT_EQ(got[t].id, want[t].id) << "request " << i << " token " << t;
    EXPECT_EQ(std::bit_cast<uint32_t>(got[t].logprob), std::bit_cast<uint32_t>(want[t].logprob))
        << "request " << i << " token " << t;
    ASSERT_EQ(got[t].top_logprobs.size(), want[t].top_logprobs.size());
    for (size_t k = 0; k < got[t].top_logprobs.size(); ++k) {
      EXPECT_EQ(got[t].top_logprobs[k].id, want[t].top_logprobs[k].id);
      EXPECT_EQ(std::bit_cast<uint32_t>(got[t].top_logprobs[k].logprob),
                std::bit_cast<uint32_t>(want[t].top_logprobs[k].logprob));
    }
  }
}

// A request in a batch against the same request alone (Generator: one request, one engine, its prompt in one
// chunk), bit for bit: ids, logprobs and top logprobs, with prefix-cache hits and copied partial blocks (a
// shared 9-token prefix over blocks of 4), split prompts and preemptions, each asserted by the counters.
// (Until the one runner landed this compared the paged runner with a per-sequence one over contiguous
// caches, on the same requests.)
TEST(Engine, BatchedEqualsAloneBitwise) {
  auto reqs = random_requests(3, 12);
  for (size_t i = 0; i < reqs.size(); i += 2)
    reqs[i].prompt.insert(reqs[i].prompt.begin(), {11, 12, 13, 14, 15, 16, 17, 18, 19});
  Generator gen(*TinyModel::get().model, nullptr);
  std::vector<std::vector<SampledToken>> alone;
  for (const Req& r : reqs) alone.push_back(gen.generate(r.prompt, r.params)->tokens);
  EngineConfig tight;
  tight.scheduler = {.max_num_seqs = 4, .max_num_batched_tokens = 7, .max_model_len = 64};
  tight.block_size = 4;
  tight.num_blocks = 12;
  EngineConfig roomy;
  roomy.scheduler = {.max_num_seqs = 16, .max_num_batched_tokens = 256, .max_model_len = 64};
  roomy.block_size = 4;
  for (const EngineConfig* c : {&tight, &roomy}) {
    EngineCounters n;
    const auto got = run_engine(reqs, *c, &n);
    EXPECT_GT(n.prefix_hits, 0);
    if (c == &tight) {
      EXPECT_GT(n.preemptions, 0);
    }
    for (size_t i = 0; i < reqs.size(); ++i) expect_same_bits(got[i], alone[i], i);
  }
}

// Engines on one model each run over their own KV pool: steps of two engines interleaved give each request
// the bits it gets alone.
TEST(Engine, EnginesOnOneModelKeepTheirOwnPools) {
  Qwen3Model& model = *TinyModel::get().model;
  GenerateParams p;
  p.max_new_tokens = 6;
  p.ignore_eos = true;
  p.sampling.num_logprobs = 1;
  const std::vector<int32_t> pa{5, 6, 7}, pb{8, 9, 10, 11, 12};
  Generator gen(model, nullptr);
  const auto want_a = gen.generate(pa, p)->tokens, want_b = gen.generate(pb, p)->tokens;
  auto a = Engine::create(model.config(), nullptr, {}, make_cpu_runner(model));
  auto b = Engine::create(model.config(), nullptr, {}, make_cpu_runner(model));
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->add(1, pa, p));
  ASSERT_TRUE(b->add(1, pb, p));
  std::vector<SampledToken> got_a, got_b;
  while (!a->idle() || !b->idle())
    for (auto* e : {&*a, &*b}) {
      auto outs = e->step();
      ASSERT_TRUE(outs) << outs.error().message;
      std::vector<SampledToken>& got = e == &*a ? got_a : got_b;
      for (auto& o : *outs) got.insert(got.end(), o.tokens.begin(), o.tokens.end());
    }
  expect_same_bits(got_a, want_a, 0);
  expect_same_bits(got_b, want_b, 1);
}

TEST(Engine, AbortFreesBlocksAndRefusesUnknownIds) {
  Qwen3Model& model = *TinyModel::get().model;
  auto engine = Engine::create(model.config(), nullptr, {}, make_cpu_runner(model));
  ASSERT_TRUE(engine);
  GenerateParams p;
  p.max_new_tokens = 30;
  ASSERT_TRUE(engine->add(1, std::vector<int32_t>{5, 6, 7}, p));
  ASSERT_TRUE(engine->add(2, std::vector<int32_t>{8, 9}, p));
  EXPECT_NE(engine->add(2, std::vector<int32_t>{8}, p).error().message.find("already in use"),
            std::string::npos);
  ASSERT_TRUE(engine->step());
  EXPECT_LT(engine->pool().free_blocks(), engine->pool().num_blocks());
  ASSERT_TRUE(engine->abort(1));
  ASSERT_TRUE(engine->abort(2));
  EXPECT_TRUE(engine->idle());
  EXPECT_EQ(engine->pool().free_blocks(), engine->pool().num_blocks());
  EXPECT_NE(engine->abort(2).error().message.find("no such request"), std::string::npos);
  // Request checks are Generator's: an id outside the vocabulary is refused by position.
  EXPECT_NE(engine->add(3, std::vector<int32_t>{1, 999}, p).error().message.find("position 1"),
            std::string::npos);
}

TEST(Engine, RefusesBadConfigByName) {
  Qwen3Model& model = *TinyModel::get().model;
  EngineConfig c;
  c.scheduler.max_model_len = 65;
  auto e = Engine::create(model.config(), nullptr, c, make_cpu_runner(model));
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("max_model_len: 65, expected 1..64"), std::string::npos);
  c = {};
  c.scheduler.max_num_seqs = 0;
  e = Engine::create(model.config(), nullptr, c, make_cpu_runner(model));
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("max_num_seqs"), std::string::npos);
}

}  // namespace
}  // namespace mxq
