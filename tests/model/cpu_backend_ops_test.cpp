// The CPU backend's step ops (the paged seam of docs/one-forward.md) against the per-sequence composition the
// CPU forward ran before them, CPU against CPU, bit for bit: q/k norm + RoPE + a contiguous cache append,
// then causal attention over that cache, one sequence at a time (the cpu/ twins called directly). Three
// sequences share each step, one of them with a prefix from an earlier step, with shuffled blocks; decode
// steps likewise; the pool's block copy and slot reads, and the refusals.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "../cpu/test_util.h"
#include "cpu/attention.h"
#include "cpu/parallel.h"
#include "cpu/rms_norm.h"
#include "cpu/rope.h"
#include "model/backend.h"
#include "model/cpu_backend.h"

namespace mxq {
namespace {

constexpr int64_t kQHeads = 4, kKvHeads = 2, kHeadDim = 32, kBlockSize = 4, kBlocks = 24, kMaxBlocks = 6;
constexpr float kEps = 1e-6f, kTheta = 1e6f;

// A 1-D f32 QTensor over `v` (the norm weights).
QTensor f32_vector(std::vector<float>& v, const char* name) {
  QTensor t;
  t.name = name;
  t.format = Format::kF32;
  t.shape = {static_cast<int64_t>(v.size())};
  t.values = {reinterpret_cast<uint8_t*>(v.data()), v.size() * sizeof(float)};
  return t;
}

// A CPU activation buffer holding `v` (the CPU backend's Act is f32), or of rows x width zeros.
Act act_of(Backend& b, const std::vector<float>& v, int64_t width) {
  Act a = *b.alloc(ActType::kAct, static_cast<int64_t>(v.size()) / width, width);
  std::copy(v.begin(), v.end(), static_cast<float*>(a.mem.get()));
  return a;
}
const float* data(const Act& a) { return static_cast<const float*>(a.mem.get()); }

ForwardShape shape_of(int64_t rows, int32_t seqs, bool decode = false) {
  ForwardShape s;
  s.rows = rows, s.seqs = seqs, s.decode = decode;
  return s;
}

// One sequence as today's forward holds it: a contiguous cache per layer, appended to.
struct Reference {
  std::vector<float> k, v;  // [positions, kv_heads * head_dim]
};

struct Fixture {
  std::mt19937_64 rng{51};
  std::unique_ptr<Backend> b = make_cpu_backend(2);
  std::unique_ptr<KvPool> kv;
  std::vector<float> qn = test::random_floats(rng, kHeadDim), kn = test::random_floats(rng, kHeadDim);
  QTensor q_norm = f32_vector(qn, "q_norm"), k_norm = f32_vector(kn, "k_norm");
  std::vector<std::vector<int32_t>> blocks;  // per sequence, its physical blocks in position order
  std::vector<int64_t> length;               // per sequence, positions in the cache
  std::vector<Reference> ref;

  explicit Fixture(int seqs) {
    auto p = b->create_kv({.layers = 1,
                           .kv_heads = kKvHeads,
                           .head_dim = kHeadDim,
                           .num_blocks = kBlocks,
                           .block_size = kBlockSize,
                           .max_blocks = kMaxBlocks,
                           .max_tokens = 32,
                           .max_seqs = 8});
    EXPECT_TRUE(p) << p.error().message;
    kv = std::move(*p);
    std::vector<int32_t> perm(kBlocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int s = 0; s < seqs; ++s)
      blocks.emplace_back(perm.begin() + s * kMaxBlocks, perm.begin() + (s + 1) * kMaxBlocks);
    length.assign(seqs, 0);
    ref.resize(seqs);
  }

  // One step: chunk[s] new tokens for each sequence (0: not in the step). Runs it on the backend and, one
  // sequence at a time, through the old ops; expects equal q, equal attention output and equal K/V.
  void step(const std::vector<int64_t>& chunk, bool decode) {
    StepMeta& m = kv->host_meta();
    const int64_t qw = kQHeads * kHeadDim, kw = kKvHeads * kHeadDim;
    int64_t T = 0;
    int32_t S = 0;
    m.cu_seqlens[0] = 0;
    std::vector<int> in_step;
    for (size_t s = 0; s < chunk.size(); ++s) {
      if (!chunk[s]) continue;
      for (int64_t i = 0; i < chunk[s]; ++i, ++T) {
        const int64_t p = length[s] + i;
        m.positions[T] = static_cast<int32_t>(p);
        m.slot_mapping[T] = blocks[s][p / kBlockSize] * static_cast<int32_t>(kBlockSize) +
                            static_cast<int32_t>(p % kBlockSize);
      }
      std::copy(blocks[s].begin(), blocks[s].end(), m.block_tables + S * kMaxBlocks);
      m.seq_lens[S] = static_cast<int32_t>(length[s] + chunk[s]);
      m.cu_seqlens[S + 1] = static_cast<int32_t>(T);
      in_step.push_back(static_cast<int>(s));
      ++S;
    }
    *m.num_tokens = static_cast<int32_t>(T);
    const auto q = test::random_floats(rng, T * qw), k = test::random_floats(rng, T * kw),
               v = test::random_floats(rng, T * kw);
    const Act aq = act_of(*b, q, qw), ak = act_of(*b, k, kw), av = act_of(*b, v, kw);
    const Act q_out = *b->alloc(ActType::kAct, T, qw), out = *b->alloc(ActType::kAct, T, qw);
    const ForwardShape shape = shape_of(T, S, decode);
    ASSERT_TRUE(b->run_step(*kv, shape, [&]() -> Status {
      if (auto st = b->qk_norm_rope_cache(0, aq, ak, av, q_norm, k_norm, kEps, kTheta, q_out); !st) return st;
      return decode ? b->paged_attention_decode(0, q_out, out) : b->attention_prefill(0, q_out, out);
    }));

    // the per-sequence forward's composition, one sequence at a time
    int64_t row = 0;
    for (int s : in_step) {
      const int64_t n = chunk[s];
      std::vector<float> wq(q.begin() + row * qw, q.begin() + (row + n) * qw),
          wk(k.begin() + row * kw, k.begin() + (row + n) * kw);
      std::vector<int64_t> pos(n);
      std::iota(pos.begin(), pos.end(), length[s]);
      head_rms_norm(wq.data(), n, kQHeads, kHeadDim, qn.data(), kEps, default_pool());
      head_rms_norm(wk.data(), n, kKvHeads, kHeadDim, kn.data(), kEps, default_pool());
      ASSERT_TRUE(rope(wq.data(), n, kQHeads, kHeadDim, pos.data(), kTheta));
      ASSERT_TRUE(rope(wk.data(), n, kKvHeads, kHeadDim, pos.data(), kTheta));
      Reference& r = ref[s];
      r.k.insert(r.k.end(), wk.begin(), wk.end());
      r.v.insert(r.v.end(), v.begin() + row * kw, v.begin() + (row + n) * kw);
      std::vector<float> want(n * qw);
      ASSERT_TRUE(attention(wq.data(), n, kQHeads, r.k.data(), r.v.data(), length[s] + n, kKvHeads, kHeadDim,
                            want.data(), default_pool()));
      EXPECT_EQ(0, std::memcmp(wq.data(), data(q_out) + row * qw, wq.size() * sizeof(float)))
          << "q, seq " << s;
      EXPECT_EQ(0, std::memcmp(want.data(), data(out) + row * qw, want.size() * sizeof(float)))
          << "attention, seq " << s;
      // the pool holds the contiguous cache's K/V at the sequence's slots
      std::vector<int32_t> slots;
      for (int64_t p = 0; p < length[s] + n; ++p)
        slots.push_back(blocks[s][p / kBlockSize] * static_cast<int32_t>(kBlockSize) +
                        static_cast<int32_t>(p % kBlockSize));
      std::vector<float> pk(slots.size() * kw), pv(pk.size());
      ASSERT_TRUE(kv->read_slots(0, slots, pk.data(), pv.data()));
      EXPECT_EQ(0, std::memcmp(pk.data(), r.k.data(), pk.size() * sizeof(float))) << "K, seq " << s;
      EXPECT_EQ(0, std::memcmp(pv.data(), r.v.data(), pv.size() * sizeof(float))) << "V, seq " << s;
      row += n;
      length[s] += n;
    }
  }
};

TEST(CpuBackendOps, PagedPrefillEqualsPerSequenceOps) {
  Fixture f(3);
  f.step({5, 6, 9}, false);  // fresh prompts, one of them across three blocks
  f.step({3, 0, 7}, false);  // chunks after a cached prefix; sequence 1 not in the step
  f.step({1, 1, 1}, false);  // one-token chunks through the prefill op
}

TEST(CpuBackendOps, PagedDecodeEqualsPerSequenceOps) {
  Fixture f(3);
  f.step({7, 2, 12}, false);
  for (int i = 0; i < 5; ++i) f.step({1, 1, 1}, true);
}

TEST(CpuBackendOps, CopyKvBlockCopiesLeadingSlots) {
  Fixture f(1);
  f.step({6}, false);  // block 0 of the sequence full, block 1 holds two slots
  // copy-on-write: the partial block's two slots into a fresh block, then decode from it
  const int32_t src = f.blocks[0][1], dst = f.blocks[0].back();
  ASSERT_TRUE(f.kv->copy_block(src, dst, 2));
  f.blocks[0][1] = dst;
  f.step({1}, true);  // reads slots 4, 5 from dst: equal to the contiguous cache only if the copy held
  auto st = f.kv->copy_block(0, kBlocks, 1);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("into block 24, the pool has 24 blocks"), std::string::npos)
      << st.error().message;
  EXPECT_FALSE(f.kv->copy_block(0, 1, kBlockSize + 1));
  std::vector<float> k(kKvHeads * kHeadDim), v(k.size());
  const int32_t outside[] = {kBlocks * kBlockSize};
  st = f.kv->read_slots(0, outside, k.data(), v.data());
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("slot 96 outside the pool of 96 slots"), std::string::npos)
      << st.error().message;
}

TEST(CpuBackendOps, RefusesByName) {
  auto b = make_cpu_backend(1);
  auto bad = b->create_kv({.layers = 1,
                           .kv_heads = 0,
                           .head_dim = 8,
                           .num_blocks = 1,
                           .block_size = 1,
                           .max_blocks = 1,
                           .max_tokens = 1,
                           .max_seqs = 1});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("kv_heads 0"), std::string::npos) << bad.error().message;
  Fixture f(1);
  *f.kv->host_meta().num_tokens = 33;
  auto st = f.b->run_step(*f.kv, shape_of(33, 1), [] { return Status{}; });
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("at most 32 tokens"), std::string::npos) << st.error().message;
  // a pool some other backend made
  struct ForeignPool final : KvPool {
    KvShape s;
    StepMeta m{};
    const KvShape& shape() const override { return s; }
    StepMeta& host_meta() override { return m; }
    Status copy_block(int32_t, int32_t, int32_t) override { return {}; }
    Status read_slots(int64_t, std::span<const int32_t>, float*, float*) const override { return {}; }
  } foreign;
  st = b->run_step(foreign, shape_of(1, 1), [] { return Status{}; });
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("not one of the cpu backend's"), std::string::npos) << st.error().message;
  *f.kv->host_meta().num_tokens = 1;
  f.kv->host_meta().slot_mapping[0] = kBlocks * kBlockSize;  // one past the pool
  const Act x = *f.b->alloc(ActType::kAct, 1, kQHeads * kHeadDim), y = *f.b->alloc(ActType::kAct, 1, x.width),
            kv1 = *f.b->alloc(ActType::kAct, 1, kKvHeads * kHeadDim);
  st = f.b->run_step(*f.kv, shape_of(1, 1), [&] {
    return f.b->qk_norm_rope_cache(0, x, kv1, kv1, f.q_norm, f.k_norm, kEps, kTheta, y);
  });
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("token 0 maps to slot 96"), std::string::npos) << st.error().message;
  st = f.b->qk_norm_rope_cache(0, x, kv1, kv1, f.q_norm, f.k_norm, kEps, kTheta, y);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("outside run_step"), std::string::npos) << st.error().message;
  st = f.b->run_step(*f.kv, shape_of(1, 1), [&] { return f.b->attention_prefill(1, x, y); });
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("layer 1 outside the KV pool of 1 layers"), std::string::npos)
      << st.error().message;
  // a buffer narrower than the op needs
  st = f.b->run_step(*f.kv, shape_of(1, 1), [&] {
    return f.b->qk_norm_rope_cache(0, x, x, kv1, f.q_norm, f.k_norm, kEps, kTheta, y);
  });
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("qk_norm_rope_cache: buffer of 1 x 128, the step needs 1 x 64"),
            std::string::npos)
      << st.error().message;
}

}  // namespace
}  // namespace mxq
