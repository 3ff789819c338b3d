// Prefix caching in the engine on the CPU backend: tokens and logprobs with caching on are bit for bit those
// with it off (n copies of a prompt, greedy and seeded, their partial blocks copied from the first; prompts
// sharing a prefix; chunked prefill; preemption; a reset in the middle), the per-request cached_tokens and
// the counters; and the fact that
// makes it possible: the K/V and logits of a position do not depend on the chunk it was computed in, for
// chunks of any size (see EngineOneTokenChunk below).
#include <gtest/gtest.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <map>
#include <ostream>
#include <random>
#include <string>

#include "engine/engine.h"
#include "engine/sequence.h"
#include "tiny_model.h"

namespace mxq {
namespace {

using test::TinyModel;

// What a run's plans say: the chunks, and for each sampled token of each request its "one-token map": for
// every position it attends to (its own included), whether that position's K/V was computed in a one-token
// chunk (read through the block table, so a shared block carries its producer's map). By
// EngineChunkInvariance, two sampled tokens with equal maps must have equal bits.
struct PlanLog {
  std::vector<StepPlan> plans;
  std::map<uint64_t, std::vector<std::vector<bool>>> maps;  // request -> per sampled token
};

// The CPU runner, filling a PlanLog.
class RecordingRunner final : public ModelRunner {
 public:
  RecordingRunner(Qwen3Model& model, PlanLog* log) : inner_(make_cpu_runner(model)), log_(log) {}
  Result<std::vector<SampledToken>> run(const StepPlan& plan, const Scheduler& scheduler,
                                        std::span<const SampleSpec> specs) override {
    log_->plans.push_back(plan);
    const int64_t bs = scheduler.pool().block_size();
    single_.resize(static_cast<size_t>(scheduler.pool().num_blocks() * bs));
    // a copied slot carries its source's map, as it carries its K/V
    for (const BlockCopy& cp : plan.copies)
      for (int64_t i = 0; i < cp.slots; ++i)
        single_[static_cast<size_t>(cp.dst * bs + i)] = single_[static_cast<size_t>(cp.src * bs + i)];
    for (const ScheduledChunk& c : plan.chunks) {
      const std::vector<int32_t>& table = scheduler.find(c.id)->blocks;
      auto slot = [&](int64_t p) {
        return static_cast<size_t>(table[static_cast<size_t>(p / bs)] * bs + p % bs);
      };
      for (int64_t p = c.start; p < c.start + c.count; ++p) single_[slot(p)] = c.count == 1;
      if (!c.samples) continue;
      std::vector<bool> map;
      for (int64_t p = 0; p < c.start + c.count; ++p) map.push_back(single_[slot(p)]);
      log_->maps[c.id].push_back(std::move(map));
    }
    return inner_->run(plan, scheduler, specs);
  }
  void drop(uint64_t id) override { inner_->drop(id); }

 private:
  std::unique_ptr<ModelRunner> inner_;
  PlanLog* log_;
  std::vector<bool> single_;  // per pool slot: last written by a one-token chunk
};

std::vector<int32_t> random_prompt(int64_t n) {
  std::mt19937_64 rng(7);
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(3 + static_cast<int32_t>(rng() % 250));
  return p;
}

struct Req {
  std::vector<int32_t> prompt;
  GenerateParams params;
};

struct Case {
  const char* name = "";
  int prompts = 1;     // distinct prompts ...
  int copies = 1;      // ... each sent this many times (n samples), seeds differing
  int64_t common = 0;  // leading tokens every prompt shares
  int64_t suffix = 0;  // then tokens of its own (see stride)
  int32_t block_size = 4;
  int64_t budget = 64;     // max_num_batched_tokens
  int64_t num_blocks = 0;  // 0: roomy
  float temperature = 0;   // 0: greedy
  int64_t max_new = 6;
  int arrive_every = 0;      // a request is added every this many steps (0: all before the first step)
  int reset_at_step = -1;    // reset_prefix_cache() before this step (-1: never)
  bool same_maps = false;    // every token's one-token map is the same on and off (see the test)
  bool preempts = false;     // caching on preempts too
  int64_t stride = 1;        // prompt p has suffix + p * stride tokens of its own
  int64_t context = 64;      // max_model_len (over 64: the tiny model stretched, see long_model())
  int64_t want_prefill = 0;  // > 0: the prompt tokens caching on computes, exactly
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name << " {prompts " << c.prompts << " x " << c.copies << ", common " << c.common << ", suffix "
      << c.suffix << ", block " << c.block_size << ", budget " << c.budget << ", blocks " << c.num_blocks
      << ", temperature " << c.temperature << ", max_new " << c.max_new << ", arrive every " << c.arrive_every
      << ", reset at " << c.reset_at_step << "}";
}

std::vector<Req> requests_of(const Case& c) {
  std::mt19937_64 rng(42);
  std::vector<int32_t> common;
  for (int64_t i = 0; i < c.common; ++i) common.push_back(3 + static_cast<int32_t>(rng() % 250));
  std::vector<Req> reqs;
  for (int p = 0; p < c.prompts; ++p) {
    std::vector<int32_t> prompt = common;
    const int64_t n = c.suffix + p * c.stride;
    for (int64_t i = 0; i < n; ++i) prompt.push_back(3 + static_cast<int32_t>(rng() % 250));
    for (int k = 0; k < c.copies; ++k) {
      Req r;
      r.prompt = prompt;
      r.params.max_new_tokens = c.max_new;
      r.params.ignore_eos = true;
      r.params.seed = 1000 + static_cast<uint64_t>(reqs.size());
      r.params.sampling.temperature = c.temperature;
      r.params.sampling.top_k = c.temperature > 0 ? 40 : 0;
      r.params.sampling.num_logprobs = 3;
      reqs.push_back(std::move(r));
    }
  }
  return reqs;
}

struct EngineRun {
  std::vector<std::vector<SampledToken>> tokens;
  std::vector<int64_t> cached;  // cached_tokens reported per request
  EngineCounters counters;
  int64_t prefill = 0;  // prompt positions the plans computed
  PlanLog log;
};

// The tiny model with its context (64) stretched to 256, for prompts of 100+ tokens in blocks of 16.
// note: RoPE takes any position; the weights are the tiny model's.
Qwen3Model& long_model() {
  static Qwen3Model* m = [] {
    TinyModel& tiny = TinyModel::get();
    ModelConfig mc = tiny.model->config();
    mc.max_position_embeddings = 256;
    auto q = Qwen3Model::create(mc, tiny.loaded.store, *tiny.backend);
    EXPECT_TRUE(q) << q.error().message;
    return new Qwen3Model(std::move(*q));
  }();
  return *m;
}

EngineRun run_case(const Case& c, const std::vector<Req>& reqs, bool caching) {
  Qwen3Model& model = c.context > 64 ? long_model() : *TinyModel::get().model;
  EngineRun out;
  EngineConfig cfg;
  cfg.scheduler = {.max_num_seqs = 16, .max_num_batched_tokens = c.budget, .max_model_len = c.context};
  cfg.block_size = c.block_size;
  cfg.num_blocks = c.num_blocks;
  cfg.enable_prefix_caching = caching;
  auto engine =
      Engine::create(model.config(), nullptr, cfg, std::make_unique<RecordingRunner>(model, &out.log));
  EXPECT_TRUE(engine) << engine.error().message;
  out.tokens.resize(reqs.size());
  out.cached.assign(reqs.size(), -1);
  std::vector<bool> done(reqs.size());
  size_t added = 0;
  for (int step = 0; step < 10000 && (added < reqs.size() || !engine->idle()); ++step) {
    if (step == c.reset_at_step) engine->reset_prefix_cache();
    while (added < reqs.size() && (c.arrive_every == 0 || step % c.arrive_every == 0)) {
      EXPECT_TRUE(engine->add(added, reqs[added].prompt, reqs[added].params));
      ++added;
      if (c.arrive_every != 0) break;
    }
    auto outs = engine->step();
    EXPECT_TRUE(outs) << outs.error().message;
    for (auto& o : *outs) {
      EXPECT_FALSE(done[o.id]);
      if (out.cached[o.id] >= 0) {
        EXPECT_EQ(o.cached_tokens, out.cached[o.id]) << "request " << o.id;
      }
      out.cached[o.id] = o.cached_tokens;
      for (auto& t : o.tokens) out.tokens[o.id].push_back(t);
      if (o.finished) done[o.id] = true;
    }
  }
  EXPECT_TRUE(engine->idle());
  EXPECT_EQ(engine->pool().free_blocks(), engine->pool().num_blocks());
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_TRUE(done[i]) << "request " << i;
  out.counters = engine->counters();
  for (const StepPlan& p : out.log.plans)
    for (const ScheduledChunk& ch : p.chunks) {
      const auto len = static_cast<int64_t>(reqs[ch.id].prompt.size());
      out.prefill += std::max<int64_t>(0, std::min(ch.start + ch.count, len) - ch.start);
    }
  return out;
}

// Compares request i's tokens of two runs bit for bit; returns how many had other one-token maps.
int64_t expect_same(const EngineRun& x, const EngineRun& y, size_t i) {
  const std::vector<SampledToken>&a = x.tokens[i], &b = y.tokens[i];
  const auto &ma = x.log.maps.at(i), &mb = y.log.maps.at(i);
  EXPECT_EQ(a.size(), b.size()) << "request " << i;
  int64_t loose = 0;
  for (size_t t = 0; t < std::min(a.size(), b.size()); ++t) {
    EXPECT_EQ(a[t].id, b[t].id) << "request " << i << " token " << t;
    // note: since linear() sums M = 1 and M > 1 alike, tokens whose one-token maps differ are bitwise too;
    // they are still counted, so the cases show the maps do part.
    if (ma[t] != mb[t]) ++loose;
    EXPECT_EQ(std::bit_cast<uint32_t>(a[t].logprob), std::bit_cast<uint32_t>(b[t].logprob))
        << "request " << i << " token " << t << ": " << a[t].logprob << " vs " << b[t].logprob;
    EXPECT_EQ(a[t].top_logprobs.size(), b[t].top_logprobs.size());
    for (size_t k = 0; k < std::min(a[t].top_logprobs.size(), b[t].top_logprobs.size()); ++k) {
      EXPECT_EQ(a[t].top_logprobs[k].id, b[t].top_logprobs[k].id);
      EXPECT_EQ(std::bit_cast<uint32_t>(a[t].top_logprobs[k].logprob),
                std::bit_cast<uint32_t>(b[t].top_logprobs[k].logprob));
    }
  }
  return loose;
}

class EnginePrefixCache : public ::testing::TestWithParam<Case> {};

TEST_P(EnginePrefixCache, TokensAndLogprobsEqualCachingOffBitForBit) {
  const Case& c = GetParam();
  const auto reqs = requests_of(c);
  const EngineRun off = run_case(c, reqs, false), on = run_case(c, reqs, true);
  int64_t loose = 0;
  for (size_t i = 0; i < reqs.size(); ++i) loose += expect_same(on, off, i);
  // The cases marked same_maps keep every token's one-token map equal on and off: no cache hit or copy
  // leaves a one-token chunk that caching off computes in a wider one, no readmission hits blocks of decoded
  // tokens.
  if (c.same_maps) {
    EXPECT_EQ(loose, 0);
  }
  if (c.preempts) {
    EXPECT_GT(on.counters.preemptions, 0);
  }
  int64_t cached = 0, copied = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(off.cached[i], 0);
    EXPECT_LT(on.cached[i], static_cast<int64_t>(reqs[i].prompt.size()));
    cached += on.cached[i];
  }
  for (const StepPlan& p : on.log.plans)
    for (const BlockCopy& cp : p.copies) {
      EXPECT_GT(cp.slots, 0);
      EXPECT_LT(cp.slots, c.block_size);
      copied += cp.slots;
    }
  for (const StepPlan& p : off.log.plans) EXPECT_TRUE(p.copies.empty());
  if (c.want_prefill > 0) {
    EXPECT_EQ(on.prefill, c.want_prefill);
  }
  EXPECT_EQ(off.counters.prefix_queries, 0);
  EXPECT_GT(on.counters.prefix_hits, 0);
  EXPECT_LE(on.counters.prefix_hits, on.counters.prefix_queries);
  EXPECT_GE(on.counters.prefix_hits, cached);  // readmissions after preemption hit too
  EXPECT_LT(on.prefill, off.prefill);
  std::printf(
      "%s: prefill tokens %lld on / %lld off, hits %lld of %lld queried (%lld slots copied), preemptions "
      "%lld / %lld, %lld tokens with other one-token maps\n",
      c.name, static_cast<long long>(on.prefill), static_cast<long long>(off.prefill),
      static_cast<long long>(on.counters.prefix_hits), static_cast<long long>(on.counters.prefix_queries),
      static_cast<long long>(copied), static_cast<long long>(on.counters.preemptions),
      static_cast<long long>(off.counters.preemptions), static_cast<long long>(loose));
}

// Every case is bitwise (the test asserts it). Those marked same_maps also keep every token's one-token map
// equal on and off by construction: no copy of a running sequence's partial block (prompts of their own,
// or copies that arrive after their producer ended), prompt lengths with (len - 1) % block_size != 0 (a
// hit never leaves a one-token chunk), preempted sequences whose decoded tokens have not filled a block
// yet. The others show where the maps part (still bitwise: see EngineOneTokenChunk): every copy of a
// running sequence computes its last prompt token alone.
INSTANTIATE_TEST_SUITE_P(
    Engine, EnginePrefixCache,
    ::testing::Values(
        // name, prompts, copies, common, suffix, block, budget, blocks, temperature, max_new, arrive_every,
        // reset_at_step[, same_maps, preempts, stride]
        Case{"n_copies_greedy", 1, 8, 0, 30, 4, 64, 0, 0.0f, 10, 0, -1},
        Case{"n_copies_seeded", 1, 8, 0, 30, 4, 64, 0, 0.8f, 10, 0, -1},
        Case{"n_copies_arriving", 2, 4, 0, 26, 8, 64, 0, 0.8f, 8, 1, -1},
        Case{"shared_prefix", 6, 1, 24, 6, 4, 64, 0, 0.8f, 8, 1, -1, true},
        Case{"shared_prefix_copies", 3, 3, 17, 10, 8, 64, 0, 0.0f, 6, 0, -1},
        Case{"chunked_prefill", 1, 4, 0, 30, 4, 10, 0, 0.8f, 6, 0, -1},
        Case{"chunked_prefill_greedy", 1, 4, 0, 30, 4, 16, 0, 0.0f, 6, 0, -1},
        Case{"preemption", 3, 2, 0, 30, 8, 64, 10, 0.8f, 6, 0, -1, true, true, -2},
        Case{"preemption_one_copy", 2, 1, 0, 30, 8, 64, 8, 0.8f, 8, 0, -1, true, true, -4},
        Case{"reset_midway", 2, 4, 12, 14, 4, 64, 0, 0.8f, 6, 2, 9},
        // one-token chunks land elsewhere on and off: prefill chunks cut one token short by the budget ...
        Case{"chunked_prefill_mixed", 2, 4, 10, 20, 4, 7, 0, 0.8f, 6, 0, -1},
        Case{"chunked_prefill_arriving", 3, 2, 16, 14, 8, 5, 0, 0.8f, 5, 2, -1},
        // ... and readmissions hitting blocks of decoded tokens, which caching off recomputes in a prefill
        Case{"preemption_decoded", 2, 3, 0, 20, 4, 64, 12, 0.8f, 12, 0, -1, false, true},
        // Copy-on-write of the partial block, blocks of 16 (the tiny model stretched to 256 positions): 8
        // copies cost len + 7 prompt tokens, whether the partial block holds 3 (100), 0 (113), 15 (128) or 0
        // (129) tokens before the last.
        Case{.name = "cow_len100_greedy",
             .prompts = 1,
             .copies = 8,
             .suffix = 100,
             .block_size = 16,
             .budget = 256,
             .temperature = 0.0f,
             .max_new = 8,
             .context = 256,
             .want_prefill = 107},
        Case{.name = "cow_len100_seeded",
             .prompts = 1,
             .copies = 8,
             .suffix = 100,
             .block_size = 16,
             .budget = 256,
             .temperature = 0.8f,
             .max_new = 8,
             .context = 256,
             .want_prefill = 107},
        Case{.name = "cow_len113_greedy",
             .prompts = 1,
             .copies = 8,
             .suffix = 113,
             .block_size = 16,
             .budget = 256,
             .temperature = 0.0f,
             .max_new = 8,
             .context = 256,
             .want_prefill = 120},
        Case{.name = "cow_len113_seeded",
             .prompts = 1,
             .copies = 8,
             .suffix = 113,
             .block_size = 16,
             .budget = 256,
             .temperature = 0.8f,
             .max_new = 8,
             .context = 256,
             .want_prefill = 120},
        Case{.name = "cow_len128_greedy",
             .prompts = 1,
             .copies = 8,
             .suffix = 128,
             .block_size = 16,
             .budget = 256,
             .temperature = 0.0f,
             .max_new = 8,
             .context = 256,
             .want_prefill = 135},
        Case{.name = "cow_len128_seeded",
             .prompts = 1,
             .copies = 8,
             .suffix = 128,
             .block_size = 16,
             .budget = 256,
             .temperature = 0.8f,
             .max_new = 8,
             .context = 256,
             .want_prefill = 135},
        Case{.name = "cow_len129_greedy",
             .prompts = 1,
             .copies = 8,
             .suffix = 129,
             .block_size = 16,
             .budget = 256,
             .temperature = 0.0f,
             .max_new = 8,
             .context = 256,
             .want_prefill = 136},
        Case{.name = "cow_len129_seeded",
             .prompts = 1,
             .copies = 8,
             .suffix = 129,
             .block_size = 16,
             .budget = 256,
             .temperature = 0.8f,
             .max_new = 8,
             .context = 256,
             .want_prefill = 136},
        // chunked prefill: the producer's chunks end exactly at the last token (33 x 3 of 100), so the
        // copies read its partial block in the step it writes the slot after them ...
        Case{.name = "cow_producer_at_last_token",
             .prompts = 1,
             .copies = 8,
             .suffix = 100,
             .block_size = 16,
             .budget = 33,
             .temperature = 0.8f,
             .max_new = 8,
             .context = 256,
             .want_prefill = 107},
        // ... copies arrive one per step while the producer prefills (24 a step) and wait for its partial
        // block ...
        Case{.name = "cow_arriving_mid_prefill",
             .prompts = 1,
             .copies = 8,
             .suffix = 128,
             .block_size = 16,
             .budget = 24,
             .temperature = 0.8f,
             .max_new = 8,
             .arrive_every = 1,
             .context = 256,
             .want_prefill = 135},
        // ... two prompts (100, 128 tokens) of 4 copies each, arriving one per step
        Case{.name = "cow_two_prompts_arriving",
             .prompts = 2,
             .copies = 4,
             .suffix = 100,
             .block_size = 16,
             .budget = 40,
             .temperature = 0.0f,
             .max_new = 8,
             .arrive_every = 1,
             .stride = 28,
             .context = 256,
             .want_prefill = 234},
        // copies arriving every 3 steps: the later ones copy a source block its producer has filled since
        Case{.name = "cow_late_arrivals",
             .prompts = 1,
             .copies = 6,
             .suffix = 100,
             .block_size = 16,
             .budget = 256,
             .temperature = 0.8f,
             .max_new = 16,
             .arrive_every = 3,
             .context = 256,
             .want_prefill = 105},
        // preemption after the copies (20 blocks): the readmitted sequences hit their own cached blocks
        Case{.name = "cow_preemption_greedy",
             .prompts = 1,
             .copies = 6,
             .suffix = 100,
             .block_size = 16,
             .budget = 256,
             .num_blocks = 20,
             .temperature = 0.0f,
             .max_new = 40,
             .preempts = true,
             .context = 256},
        Case{.name = "cow_preemption_seeded",
             .prompts = 1,
             .copies = 6,
             .suffix = 100,
             .block_size = 16,
             .budget = 256,
             .num_blocks = 20,
             .temperature = 0.8f,
             .max_new = 40,
             .preempts = true,
             .context = 256}),
    [](const auto& info) { return std::string(info.param.name); });

// n samples of one prompt through the engine (block 16): the prompt is prefilled once, each copy shares its
// full blocks, copies the rest but its last token from the first copy's partial block, and computes that
// token alone: n = 8 costs len + 7 prompt tokens, every copy reports len - 1 cached tokens.
class EnginePrefixCacheCost : public ::testing::TestWithParam<int64_t> {};

TEST_P(EnginePrefixCacheCost, EightSamplesPrefillThePromptOnce) {
  Qwen3Model& model = long_model();
  const int64_t len = GetParam();
  std::vector<int32_t> prompt;
  std::mt19937_64 rng(3);
  for (int64_t i = 0; i < len; ++i) prompt.push_back(3 + static_cast<int32_t>(rng() % 250));
  auto cost = [&](int n, bool caching, std::vector<int64_t>* cached) {
    PlanLog log;
    EngineConfig cfg;
    cfg.scheduler = {.max_num_seqs = 16, .max_num_batched_tokens = 2048, .max_model_len = 256};
    cfg.enable_prefix_caching = caching;
    auto engine =
        Engine::create(model.config(), nullptr, cfg, std::make_unique<RecordingRunner>(model, &log));
    EXPECT_TRUE(engine);
    for (int i = 0; i < n; ++i) {
      GenerateParams p;
      p.max_new_tokens = 8;
      p.ignore_eos = true;
      p.seed = static_cast<uint64_t>(i);
      p.sampling.temperature = 0.8f;
      EXPECT_TRUE(engine->add(static_cast<uint64_t>(i), prompt, p));
    }
    if (cached) cached->assign(static_cast<size_t>(n), -1);
    while (!engine->idle()) {
      auto outs = engine->step();
      EXPECT_TRUE(outs);
      if (cached)
        for (const RequestOutput& o : *outs) (*cached)[o.id] = o.cached_tokens;
    }
    EXPECT_EQ(engine->pool().free_blocks(), engine->pool().num_blocks());
    if (caching) {
      EXPECT_EQ(engine->counters().prefix_queries, len * n);
      EXPECT_EQ(engine->counters().prefix_hits, (len - 1) * (n - 1));
    }
    int64_t tokens = 0;
    for (const StepPlan& plan : log.plans)
      for (const ScheduledChunk& c : plan.chunks)
        tokens += std::max<int64_t>(0, std::min<int64_t>(c.start + c.count, len) - c.start);
    return tokens;
  };
  std::vector<int64_t> cached;
  const int64_t one = cost(1, true, nullptr), eight = cost(8, true, &cached),
                eight_off = cost(8, false, nullptr);
  std::printf(
      "engine, %lld-token prompt, block 16: prefill tokens n=1 %lld, n=8 %lld (%.3fx), n=8 caching off "
      "%lld\n",
      static_cast<long long>(len), static_cast<long long>(one), static_cast<long long>(eight),
      static_cast<double>(eight) / static_cast<double>(one), static_cast<long long>(eight_off));
  EXPECT_EQ(one, len);
  EXPECT_EQ(eight, len + 7);
  EXPECT_LE(eight * 5, one * 6);  // <= 1.2x
  EXPECT_EQ(eight_off, 8 * len);
  std::vector<int64_t> want(8, len - 1);
  want[0] = 0;
  EXPECT_EQ(cached, want);
}

INSTANTIATE_TEST_SUITE_P(Engine, EnginePrefixCacheCost, ::testing::Values(100, 113, 128, 129),
                         [](const auto& info) { return "len" + std::to_string(info.param); });

// Aborting copies (the one that prefilled the shared blocks among them) leaves the others' tokens as they
// were and every block free in the end; the shared blocks stay cached for the next request.
TEST(EnginePrefixCacheAbort, CopiesOutliveTheirProducer) {
  Qwen3Model& model = *TinyModel::get().model;
  const std::vector<int32_t> prompt = random_prompt(30);
  auto run_copies = [&](bool caching, bool abort) {
    EngineConfig cfg;
    cfg.scheduler = {.max_num_seqs = 8, .max_num_batched_tokens = 64, .max_model_len = 64};
    cfg.block_size = 4;
    cfg.enable_prefix_caching = caching;
    auto engine = Engine::create(model.config(), nullptr, cfg, make_cpu_runner(model));
    EXPECT_TRUE(engine);
    GenerateParams p;
    p.max_new_tokens = 10;
    p.ignore_eos = true;
    p.sampling.num_logprobs = 2;
    for (uint64_t id = 0; id < 4; ++id) EXPECT_TRUE(engine->add(id, prompt, p));
    std::vector<std::vector<SampledToken>> got(4);
    for (int step = 0; !engine->idle(); ++step) {
      if (abort && step == 3) {
        EXPECT_TRUE(engine->abort(0));
        EXPECT_TRUE(engine->abort(2));
      }
      auto outs = engine->step();
      EXPECT_TRUE(outs);
      for (auto& o : *outs) got[o.id].insert(got[o.id].end(), o.tokens.begin(), o.tokens.end());
    }
    EXPECT_EQ(engine->pool().free_blocks(), engine->pool().num_blocks());
    if (caching) {
      EXPECT_GE(engine->pool().cached_blocks(), 7);
    }
    return got;
  };
  const auto want = run_copies(false, false), got = run_copies(true, true);
  for (size_t id : {1, 3}) {
    ASSERT_EQ(got[id].size(), want[id].size());
    for (size_t t = 0; t < got[id].size(); ++t) {
      EXPECT_EQ(got[id][t].id, want[id][t].id);
      EXPECT_EQ(std::bit_cast<uint32_t>(got[id][t].logprob), std::bit_cast<uint32_t>(want[id][t].logprob));
    }
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The CPU runner's block copy (KvPool::copy_block): a prompt's step writes block 2 (the bits the prompt gets
// alone), then its 3 leading slots go into block 1, K and V of every layer, and nothing past them; ids
// outside the pool are refused by name.
TEST(EnginePrefixCopy, CpuPoolCopiesLeadingSlots) {
  TinyModel& tiny = TinyModel::get();
  const ModelConfig& mc = tiny.model->config();
  const int64_t row = mc.num_key_value_heads * mc.head_dim;
  const std::vector<int32_t> prompt = random_prompt(4);
  std::vector<float> logits(static_cast<size_t>(mc.vocab_size));
  auto alone = Sequence::create(*tiny.model, 4, 4);
  ASSERT_TRUE(alone && alone->append(prompt, logits.data()));
  auto kv = tiny.backend->create_kv({.layers = mc.num_hidden_layers,
                                     .kv_heads = mc.num_key_value_heads,
                                     .head_dim = mc.head_dim,
                                     .num_blocks = 4,
                                     .block_size = 4,
                                     .max_blocks = 4,
                                     .max_tokens = 4,
                                     .max_seqs = 1});
  ASSERT_TRUE(kv) << kv.error().message;
  KvPool& pool = **kv;
  StepMeta& m = pool.host_meta();
  for (int32_t i = 0; i < 4; ++i) m.ids[i] = prompt[i], m.positions[i] = i, m.slot_mapping[i] = 8 + i;
  m.block_tables[0] = 2, m.seq_lens[0] = 4, m.cu_seqlens[0] = 0, m.cu_seqlens[1] = 4;
  *m.num_tokens = 4, *m.num_seqs = 1;
  ForwardShape shape;
  const int32_t last[] = {3};
  shape.rows = 4, shape.seqs = 1, shape.sample_rows = 1, shape.sample_token_rows = last;
  ASSERT_TRUE(tiny.model->step(pool, shape, logits.data()));
  ASSERT_TRUE(pool.copy_block(2, 1, 3));
  const int32_t block2[] = {8, 9, 10, 11}, block1[] = {4, 5, 6, 7};
  for (int64_t l = 0; l < mc.num_hidden_layers; ++l) {
    std::vector<float> want_k, want_v, k2(4 * row), v2(4 * row), k1(4 * row), v1(4 * row);
    ASSERT_TRUE(alone->read_kv(l, want_k, want_v));
    ASSERT_TRUE(pool.read_slots(l, block2, k2.data(), v2.data()));
    ASSERT_TRUE(pool.read_slots(l, block1, k1.data(), v1.data()));
    EXPECT_TRUE(same_bits(k2, want_k) && same_bits(v2, want_v)) << "layer " << l;
    for (int64_t i = 0; i < 4 * row; ++i) {
      const float copied_k = i < 3 * row ? k2[i] : 0.0f;  // slot 3: not copied, still zero
      const float copied_v = i < 3 * row ? v2[i] : 0.0f;
      ASSERT_EQ(std::bit_cast<uint32_t>(k1[i]), std::bit_cast<uint32_t>(copied_k))
          << "layer " << l << ", " << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(v1[i]), std::bit_cast<uint32_t>(copied_v))
          << "layer " << l << ", " << i;
    }
  }
  auto outside = pool.copy_block(2, 4, 1);
  ASSERT_FALSE(outside);
  EXPECT_NE(outside.error().message.find("the pool has 4 blocks of 4 slots"), std::string::npos)
      << outside.error().message;
  EXPECT_FALSE(pool.copy_block(2, 3, 5));
}

// K/V of each position and the last logits, computed with the prompt split into the given chunks.
struct ChunkRun {
  std::vector<float> k, v, logits;
};
ChunkRun run_chunks(const std::vector<int32_t>& prompt, const std::vector<int64_t>& chunks) {
  Qwen3Model& model = *TinyModel::get().model;
  const ModelConfig& mc = model.config();
  auto seq = Sequence::create(model, static_cast<int64_t>(prompt.size()));
  EXPECT_TRUE(seq);
  ChunkRun r;
  r.logits.resize(static_cast<size_t>(mc.vocab_size));
  int64_t at = 0;
  for (int64_t n : chunks) {
    EXPECT_TRUE(
        seq->append(std::span<const int32_t>(prompt).subspan(static_cast<size_t>(at), static_cast<size_t>(n)),
                    r.logits.data()));
    at += n;
  }
  for (int64_t l = 0; l < mc.num_hidden_layers; ++l) {
    std::vector<float> k, v;
    EXPECT_TRUE(seq->read_kv(l, k, v));
    r.k.insert(r.k.end(), k.begin(), k.end());
    r.v.insert(r.v.end(), v.begin(), v.end());
  }
  return r;
}

class EngineChunkInvariance : public ::testing::TestWithParam<std::vector<int64_t>> {};

// Chunks of two tokens or more: the same bits as one chunk of the whole prompt.
TEST_P(EngineChunkInvariance, KvAndLogitsDoNotDependOnTheChunking) {
  const auto prompt = random_prompt(40);
  const ChunkRun whole = run_chunks(prompt, {40}), split = run_chunks(prompt, GetParam());
  EXPECT_TRUE(same_bits(whole.k, split.k));
  EXPECT_TRUE(same_bits(whole.v, split.v));
  EXPECT_TRUE(same_bits(whole.logits, split.logits));
}

INSTANTIATE_TEST_SUITE_P(Engine, EngineChunkInvariance,
                         ::testing::Values(std::vector<int64_t>{20, 20}, std::vector<int64_t>{13, 27},
                                           std::vector<int64_t>{2, 38}, std::vector<int64_t>{38, 2},
                                           std::vector<int64_t>{2, 2, 2, 34},
                                           std::vector<int64_t>{16, 16, 8}),
                         [](const auto& info) {
                           std::string s = "chunks";
                           for (int64_t n : info.param) s += "_" + std::to_string(n);
                           return s;
                         });

// A one-token chunk: linear() runs M = 1 and M > 1 in the same summation order (cpu/linear.cpp), so a
// position computed alone (a decode, or a prompt whose cache hit leaves one token) carries the same bits as
// inside a wider chunk.
TEST(EngineOneTokenChunk, EqualsOneWideChunk) {
  const auto prompt = random_prompt(40);
  const ChunkRun whole = run_chunks(prompt, {40});
  for (const std::vector<int64_t>& chunks :
       {std::vector<int64_t>{39, 1}, std::vector<int64_t>{1, 39}, std::vector<int64_t>{20, 1, 19}}) {
    const ChunkRun split = run_chunks(prompt, chunks);
    EXPECT_TRUE(same_bits(whole.k, split.k)) << chunks.size() << " chunks";
    EXPECT_TRUE(same_bits(whole.v, split.v));
    EXPECT_TRUE(same_bits(whole.logits, split.logits));
  }
}

}  // namespace
}  // namespace mxq
