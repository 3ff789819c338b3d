// GPU fused q/k norm + RoPE + paged KV write against cpu/qk_norm_rope_cache (itself head_rms_norm + rope, the
// CPU forward's steps) on fresh random qkv rows, positions up to 40k, shuffled slots with padding (-1)
// tokens; q and k within two bf16 half-ulps, v bitwise, untouched slots and rows still poisoned; separate
// q / k / v inputs bitwise equal to the fused rows.
#include "cuda/attention/qk_norm_rope_cache.h"

#include <algorithm>
#include <climits>
#include <numeric>

#include "../op_test_util.h"
#include "cpu/qk_norm_rope_cache.h"
#include "cpu/rope.h"

namespace mxq::cuda {
namespace {

struct QkCase {
  int q_heads, kv_heads, head_dim, tokens, capacity, num_slots;
};
void PrintTo(const QkCase& c, std::ostream* os) {
  *os << "Hq=" << c.q_heads << " Hkv=" << c.kv_heads << " D=" << c.head_dim << " tokens=" << c.tokens << "/"
      << c.capacity << " slots=" << c.num_slots;
}

class QkNormRopeCache : public ::testing::TestWithParam<QkCase> {};

TEST_P(QkNormRopeCache, MatchesCpuTwin) {
  const QkCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int D = c.head_dim, width = (c.q_heads + 2 * c.kv_heads) * D;
  const float eps = 1e-6f, theta = 1000000.0f;
  const auto qkv = test::normal_bf16(rng, static_cast<size_t>(c.capacity) * width, 2.0f);
  const auto qn = test::normal_bf16(rng, D), kn = test::normal_bf16(rng, D);
  std::vector<int32_t> pos(static_cast<size_t>(c.capacity)), slots(pos.size());
  std::uniform_int_distribution<int32_t> pos_dist(0, 40000);
  for (auto& p : pos) p = pos_dist(rng);
  std::vector<int32_t> perm(static_cast<size_t>(c.num_slots));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (size_t t = 0; t < slots.size(); ++t) slots[t] = t % 5 == 3 ? -1 : perm[t];  // every 5th token: padding
  const auto inv_freq = *rope_inv_freq(theta, D);

  const size_t kv_elems = static_cast<size_t>(c.num_slots) * c.kv_heads * D;
  std::vector<float> q_ref(static_cast<size_t>(c.tokens) * c.q_heads * D), k_ref(kv_elems, NAN),
      v_ref(kv_elems, NAN);
  const auto qkvf = test::to_f32(qkv), qnf = test::to_f32(qn), knf = test::to_f32(kn);
  const std::vector<int64_t> pos64(pos.begin(), pos.end());
  ASSERT_TRUE(qk_norm_rope_cache({.qkv = qkvf.data(),
                                  .tokens = c.tokens,
                                  .q_heads = c.q_heads,
                                  .kv_heads = c.kv_heads,
                                  .head_dim = D,
                                  .q_norm = qnf.data(),
                                  .k_norm = knf.data(),
                                  .eps = eps,
                                  .positions = pos64.data(),
                                  .theta = theta,
                                  .slot_mapping = slots.data(),
                                  .num_slots = c.num_slots,
                                  .q_out = q_ref.data(),
                                  .k_cache = k_ref.data(),
                                  .v_cache = v_ref.data()}));

  auto dqkv = test::must(test::upload(qkv));
  auto dqn = test::must(test::upload(qn));
  auto dkn = test::must(test::upload(kn));
  auto dfreq = test::must(test::upload(inv_freq));
  auto dpos = test::must(test::upload(pos));
  auto dslot = test::must(test::upload(slots));
  auto dn = test::must(test::upload(std::vector<int32_t>{c.tokens}));
  auto dbad = test::must(test::upload(std::vector<int32_t>{INT_MAX}));
  const size_t q_cap = static_cast<size_t>(c.capacity) * c.q_heads * D;
  auto dq = test::must(test::poisoned<uint16_t>(q_cap));
  auto dk = test::must(test::poisoned<uint16_t>(kv_elems));
  auto dv = test::must(test::poisoned<uint16_t>(kv_elems));
  QkNormRopeArgs a{};
  a.qkv = dqkv.as<uint16_t>(), a.q_norm = dqn.as<uint16_t>(), a.k_norm = dkn.as<uint16_t>();
  a.inv_freq = dfreq.as<float>(), a.positions = dpos.as<int32_t>(), a.slot_mapping = dslot.as<int32_t>();
  a.num_tokens = dn.as<int32_t>(), a.q_out = dq.as<uint16_t>(), a.k_cache = dk.as<uint16_t>();
  a.v_cache = dv.as<uint16_t>(), a.bad_token = dbad.as<int32_t>();
  a.max_tokens = c.capacity, a.num_slots = c.num_slots, a.q_heads = c.q_heads, a.kv_heads = c.kv_heads;
  a.head_dim = D, a.eps = eps;
  ASSERT_EQ(launch_qk_norm_rope_cache(a, nullptr), cudaSuccess);
  const auto gq = test::must(test::download<uint16_t>(dq, q_cap));
  const auto gk = test::must(test::download<uint16_t>(dk, kv_elems));
  const auto gv = test::must(test::download<uint16_t>(dv, kv_elems));
  EXPECT_EQ(test::must(test::download<int32_t>(dbad, 1))[0], INT_MAX);
  // note: |values| after the norm are O(|w|); the atol covers sincosf vs f64 cos/sin on near-cancelling
  // pairs.
  test::expect_close_bf16({gq.begin(), gq.begin() + static_cast<int64_t>(q_ref.size())}, q_ref,
                          test::kBf16Rtol, 1e-4, "q");
  for (size_t i = q_ref.size(); i < q_cap; ++i) ASSERT_EQ(gq[i], 0xFFFF) << "q row past num_tokens written";
  std::vector<uint16_t> gk_w;
  std::vector<float> k_w;
  for (size_t i = 0; i < kv_elems; ++i) {
    if (std::isnan(k_ref[i])) {  // slot not written by the twin
      ASSERT_EQ(gk[i], 0xFFFF) << "k entry " << i << " written";
      ASSERT_EQ(gv[i], 0xFFFF) << "v entry " << i << " written";
      continue;
    }
    gk_w.push_back(gk[i]);
    k_w.push_back(k_ref[i]);
    ASSERT_EQ(bf16_to_f32(gv[i]), v_ref[i]) << "v entry " << i;
  }
  test::expect_close_bf16(gk_w, k_w, test::kBf16Rtol, 1e-4, "k");

  // Separate q / k / v inputs (k_in, v_in: the engine's three projection outputs) read the same heads: the
  // outputs equal the fused-row run's bit for bit, rows past num_tokens and unmapped slots still poisoned.
  const int qw = c.q_heads * D, kw = c.kv_heads * D;
  std::vector<uint16_t> sq, sk, sv;
  for (int t = 0; t < c.capacity; ++t) {
    const auto row = qkv.begin() + static_cast<int64_t>(t) * width;
    sq.insert(sq.end(), row, row + qw);
    sk.insert(sk.end(), row + qw, row + qw + kw);
    sv.insert(sv.end(), row + qw + kw, row + width);
  }
  auto dsq = test::must(test::upload(sq));
  auto dsk = test::must(test::upload(sk));
  auto dsv = test::must(test::upload(sv));
  auto dq2 = test::must(test::poisoned<uint16_t>(q_cap));
  auto dk2 = test::must(test::poisoned<uint16_t>(kv_elems));
  auto dv2 = test::must(test::poisoned<uint16_t>(kv_elems));
  QkNormRopeArgs s = a;
  s.qkv = dsq.as<uint16_t>(), s.k_in = dsk.as<uint16_t>(), s.v_in = dsv.as<uint16_t>();
  s.q_out = dq2.as<uint16_t>(), s.k_cache = dk2.as<uint16_t>(), s.v_cache = dv2.as<uint16_t>();
  ASSERT_EQ(launch_qk_norm_rope_cache(s, nullptr), cudaSuccess);
  EXPECT_EQ(test::must(test::download<uint16_t>(dq2, q_cap)), gq) << "q (separate inputs)";
  EXPECT_EQ(test::must(test::download<uint16_t>(dk2, kv_elems)), gk) << "k cache (separate inputs)";
  EXPECT_EQ(test::must(test::download<uint16_t>(dv2, kv_elems)), gv) << "v cache (separate inputs)";
  s.v_in = nullptr;
  EXPECT_EQ(launch_qk_norm_rope_cache(s, nullptr), cudaErrorInvalidValue) << "k_in without v_in";
}

INSTANTIATE_TEST_SUITE_P(Shapes, QkNormRopeCache,
                         ::testing::Values(QkCase{6, 2, 64, 1, 1, 16}, QkCase{6, 2, 64, 37, 40, 64},
                                           QkCase{32, 8, 128, 5, 8, 48}, QkCase{16, 8, 128, 130, 130, 160},
                                           QkCase{32, 4, 128, 3, 3, 32}, QkCase{4, 4, 64, 17, 20, 20}));

TEST(QkNormRopeCacheSlots, SlotPastTheCacheIsFlaggedNotWritten) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int D = 64, hq = 2, hkv = 1, T = 3, slots_n = 4;
  const auto qkv = test::normal_bf16(rng, static_cast<size_t>(T) * (hq + 2 * hkv) * D);
  const auto w = test::normal_bf16(rng, D);
  const auto inv_freq = *rope_inv_freq(10000.0f, D);
  auto dqkv = test::must(test::upload(qkv));
  auto dw = test::must(test::upload(w));
  auto dfreq = test::must(test::upload(inv_freq));
  auto dpos = test::must(test::upload(std::vector<int32_t>{0, 1, 2}));
  auto dslot = test::must(test::upload(std::vector<int32_t>{0, 4, 1}));  // token 1 past the 4 slots
  auto dbad = test::must(test::upload(std::vector<int32_t>{INT_MAX}));
  auto dq = test::must(test::poisoned<uint16_t>(static_cast<size_t>(T) * hq * D));
  auto dk = test::must(test::poisoned<uint16_t>(static_cast<size_t>(slots_n) * hkv * D));
  auto dv = test::must(test::poisoned<uint16_t>(static_cast<size_t>(slots_n) * hkv * D));
  QkNormRopeArgs a{dqkv.as<uint16_t>(),
                   dw.as<uint16_t>(),
                   dw.as<uint16_t>(),
                   dfreq.as<float>(),
                   dpos.as<int32_t>(),
                   dslot.as<int32_t>(),
                   nullptr,
                   dq.as<uint16_t>(),
                   dk.as<uint16_t>(),
                   dv.as<uint16_t>(),
                   dbad.as<int32_t>(),
                   T,
                   slots_n,
                   hq,
                   hkv,
                   D,
                   1e-6f,
                   nullptr,
                   nullptr};
  ASSERT_EQ(launch_qk_norm_rope_cache(a, nullptr), cudaSuccess);
  EXPECT_EQ(test::must(test::download<int32_t>(dbad, 1))[0], 1);
  const auto gk = test::must(test::download<uint16_t>(dk, static_cast<size_t>(slots_n) * hkv * D));
  for (int i = 2 * D; i < 4 * D; ++i) EXPECT_EQ(gk[i], 0xFFFF) << "slots 2, 3 were never mapped";
  a.head_dim = 96;
  EXPECT_EQ(launch_qk_norm_rope_cache(a, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace mxq::cuda
