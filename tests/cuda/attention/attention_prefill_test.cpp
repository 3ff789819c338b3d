// GPU causal flash attention over the paged cache against cpu/attention_prefill (cpu/attention on the
// gathered cache) on fresh random q/K/V: ragged batches of (queries, cache length) pairs, whole prompts and
// chunks after a cached prefix, lengths around the 64-row/64-key tiles and the 16-entry blocks, GQA groups
// 1, 3, 4, 8, D 64 and 128, and a capacity above the batch (extra CTAs and padding sequences idle).
#include "cuda/attention/attention_prefill.h"

#include "../op_test_util.h"
#include "cpu/attention_prefill.h"

namespace mxq::cuda {
namespace {

struct PrefillCase {
  int q_heads, kv_heads, head_dim, block_size;
  std::vector<std::pair<int32_t, int32_t>> seqs;  // (query tokens, cache entries incl. them)
};
void PrintTo(const PrefillCase& c, std::ostream* os) {
  *os << "Hq=" << c.q_heads << " Hkv=" << c.kv_heads << " D=" << c.head_dim << " bs=" << c.block_size
      << " seqs=";
  for (auto [q, l] : c.seqs) *os << q << "/" << l << ",";
}

class AttentionPrefill : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(AttentionPrefill, MatchesCpuTwin) {
  const PrefillCase& c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int D = c.head_dim, S = static_cast<int>(c.seqs.size());
  const int max_seqs = S + 2;  // note: two padding sequences (no queries, length 0) past the batch
  std::vector<int32_t> cu(static_cast<size_t>(max_seqs) + 1, 0), lens(static_cast<size_t>(max_seqs), 0);
  for (int s = 0; s < S; ++s) {
    cu[s + 1] = cu[s] + c.seqs[s].first;
    lens[s] = c.seqs[s].second;
  }
  for (int s = S; s < max_seqs; ++s) cu[s + 1] = cu[s];
  const int T = cu[S], capacity = T + 37;
  const test::PagedCache cache = test::random_paged_cache(rng, lens, c.block_size, c.kv_heads, D);
  const size_t row = static_cast<size_t>(c.q_heads) * D;
  const auto q = test::normal_bf16(rng, static_cast<size_t>(capacity) * row);
  const auto qf = test::to_f32(q);
  std::vector<float> ref(static_cast<size_t>(T) * row);
  const PagedKvView view{cache.kf.data(),  cache.vf.data(),  cache.tables.data(), cache.num_blocks,
                         cache.block_size, cache.max_blocks, cache.kv_heads,      cache.head_dim};
  ASSERT_TRUE(attention_prefill(qf.data(), cu.data(), lens.data(), max_seqs, c.q_heads, view, ref.data()));
  // The error bound of rounding P to bf16 before P·V (FlashAttention's choice): each term p_i v_i moves by at
  // most 2^-9 p_i |v_i|, so |Δout| <= 2^-9 Σ p_i |v_i| / l, and the same twin run on |V| computes that sum.
  std::vector<float> abs_v(cache.vf.size()), ref_abs(ref.size());
  for (size_t i = 0; i < abs_v.size(); ++i) abs_v[i] = std::abs(cache.vf[i]);
  const PagedKvView abs_view{cache.kf.data(),  abs_v.data(),     cache.tables.data(), cache.num_blocks,
                             cache.block_size, cache.max_blocks, cache.kv_heads,      cache.head_dim};
  ASSERT_TRUE(
      attention_prefill(qf.data(), cu.data(), lens.data(), max_seqs, c.q_heads, abs_view, ref_abs.data()));

  auto dq = test::must(test::upload(q));
  auto dk = test::must(test::upload(cache.k));
  auto dv = test::must(test::upload(cache.v));
  auto dt = test::must(test::upload(cache.tables));
  auto dcu = test::must(test::upload(cu));
  auto dl = test::must(test::upload(lens));
  auto dout = test::must(test::poisoned<uint16_t>(static_cast<size_t>(capacity) * row));
  PrefillArgs a{dq.as<uint16_t>(),
                dk.as<uint16_t>(),
                dv.as<uint16_t>(),
                dt.as<int32_t>(),
                dcu.as<int32_t>(),
                dl.as<int32_t>(),
                dout.as<uint16_t>(),
                capacity,
                max_seqs,
                static_cast<int>(cache.max_blocks),
                c.block_size,
                c.q_heads,
                c.kv_heads,
                D};
  ASSERT_EQ(launch_attention_prefill(a, nullptr), cudaSuccess);
  const auto got = test::must(test::download<uint16_t>(dout, static_cast<size_t>(capacity) * row));
  const std::vector<uint16_t> head(got.begin(), got.begin() + static_cast<int64_t>(ref.size()));
  // note: 2^-8 = twice that bound (the row sum l is of the unrounded p), plus the output's own rounding.
  int misses = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = bf16_to_f32(head[i]), bound = test::kBf16Rtol * std::abs(ref[i]) + 0x1p-8 * ref_abs[i];
    if (!(std::abs(g - ref[i]) <= bound) && ++misses <= 5)
      ADD_FAILURE() << "out[" << i << "]: got " << g << ", want " << ref[i] << " ± " << bound;
  }
  EXPECT_EQ(misses, 0);
  std::vector<float> gf(head.size());
  for (size_t i = 0; i < head.size(); ++i) gf[i] = bf16_to_f32(head[i]);
  EXPECT_LE(test::nmse(gf, std::vector<double>(ref.begin(), ref.end())), 2e-5);
  for (size_t i = ref.size(); i < got.size(); ++i) ASSERT_EQ(got[i], 0xFFFF) << "row past the batch written";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionPrefill,
    ::testing::Values(PrefillCase{6, 2, 64, 16, {{1, 1}}},
                      PrefillCase{6, 2, 64, 16, {{5, 5}, {64, 64}, {65, 65}}},
                      PrefillCase{6, 2, 64, 16, {{17, 300}, {1, 77}, {130, 130}, {64, 200}}},
                      PrefillCase{32, 8, 128, 16, {{200, 200}, {3, 1000}, {129, 129}}},
                      PrefillCase{32, 4, 128, 16, {{70, 90}, {1, 1}}},
                      PrefillCase{4, 4, 64, 32, {{100, 517}}}, PrefillCase{16, 8, 128, 16, {{512, 512}}},
                      PrefillCase{32, 8, 128, 16, {{33, 33}, {63, 64}, {1, 2}, {250, 260}, {8, 8}}}));

}  // namespace
}  // namespace mxq::cuda
