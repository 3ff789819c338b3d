// The paged attention twins (cpu/attention_prefill, cpu/paged_attention_decode) against cpu/attention on the
// same cache laid out contiguously: bitwise, since the paged ops only gather. Shuffled block pools, ragged
// batches, a cached prefix before a query chunk, padding sequences, and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "cpu/attention.h"
#include "cpu/attention_prefill.h"
#include "cpu/paged_attention_decode.h"
#include "test_util.h"

namespace mxq {
namespace {

struct Paged {
  std::vector<float> k, v;                 // [num_blocks * block_size, kv_heads, head_dim]
  std::vector<int32_t> tables;             // [sequences, max_blocks]
  std::vector<std::vector<float>> kc, vc;  // per sequence, contiguous [len, kv_heads, head_dim]
  PagedKvView view;
};

Paged make_paged(std::mt19937_64& rng, const std::vector<int32_t>& lens, int64_t bs, int64_t hkv, int64_t d) {
  Paged p;
  int64_t blocks = 2, max_blocks = 1;
  for (int32_t l : lens)
    blocks += (l + bs - 1) / bs, max_blocks = std::max<int64_t>(max_blocks, (l + bs - 1) / bs);
  std::vector<int32_t> perm(static_cast<size_t>(blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  p.k = test::random_floats(rng, static_cast<size_t>(blocks * bs * hkv * d));
  p.v = test::random_floats(rng, p.k.size());
  p.tables.assign(lens.size() * static_cast<size_t>(max_blocks), 0);
  size_t next = 0;
  const int64_t row = hkv * d;
  for (size_t s = 0; s < lens.size(); ++s) {
    std::vector<float> kc(static_cast<size_t>(lens[s] * row)), vc(kc.size());
    for (int64_t b = 0; b < (lens[s] + bs - 1) / bs; ++b) p.tables[s * max_blocks + b] = perm[next++];
    for (int64_t pos = 0; pos < lens[s]; ++pos) {
      const int64_t slot = p.tables[s * max_blocks + pos / bs] * bs + pos % bs;
      std::copy_n(p.k.begin() + slot * row, row, kc.begin() + pos * row);
      std::copy_n(p.v.begin() + slot * row, row, vc.begin() + pos * row);
    }
    p.kc.push_back(std::move(kc));
    p.vc.push_back(std::move(vc));
  }
  p.view = {p.k.data(), p.v.data(), p.tables.data(), blocks, bs, max_blocks, hkv, d};
  return p;
}

TEST(AttentionPrefillTwin, BitwiseEqualsContiguousAttention) {
  std::mt19937_64 rng(11);
  const int64_t hq = 6, hkv = 2, d = 16, bs = 4;
  const std::vector<std::pair<int32_t, int32_t>> seqs = {{3, 3}, {1, 9}, {0, 0}, {5, 13}, {8, 8}};
  std::vector<int32_t> cu{0}, lens;
  for (auto [q, l] : seqs) cu.push_back(cu.back() + q), lens.push_back(l);
  Paged p = make_paged(rng, lens, bs, hkv, d);
  const auto q = test::random_floats(rng, static_cast<size_t>(cu.back() * hq * d));
  std::vector<float> out(q.size(), NAN);
  ASSERT_TRUE(attention_prefill(q.data(), cu.data(), lens.data(), static_cast<int64_t>(seqs.size()), hq,
                                p.view, out.data()));
  for (size_t s = 0; s < seqs.size(); ++s) {
    if (seqs[s].first == 0) continue;
    std::vector<float> want(static_cast<size_t>(seqs[s].first * hq * d));
    ASSERT_TRUE(attention(q.data() + cu[s] * hq * d, seqs[s].first, hq, p.kc[s].data(), p.vc[s].data(),
                          seqs[s].second, hkv, d, want.data()));
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(out[cu[s] * hq * d + i], want[i]) << "seq " << s;
  }
}

TEST(PagedAttentionDecodeTwin, BitwiseEqualsContiguousAttentionAndZeroesPadding) {
  std::mt19937_64 rng(12);
  const int64_t hq = 8, hkv = 2, d = 8, bs = 16;
  const std::vector<int32_t> lens = {1, 17, 0, 40};
  Paged p = make_paged(rng, lens, bs, hkv, d);
  const auto q = test::random_floats(rng, lens.size() * hq * d);
  std::vector<float> out(q.size(), NAN);
  ASSERT_TRUE(paged_attention_decode(q.data(), lens.data(), static_cast<int64_t>(lens.size()), hq, p.view,
                                     out.data()));
  for (size_t s = 0; s < lens.size(); ++s) {
    std::vector<float> want(static_cast<size_t>(hq * d), 0.0f);
    if (lens[s] > 0) {
      ASSERT_TRUE(attention(q.data() + s * hq * d, 1, hq, p.kc[s].data(), p.vc[s].data(), lens[s], hkv, d,
                            want.data()));
    }
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(out[s * hq * d + i], want[i]) << "seq " << s;
  }
}

TEST(AttentionPrefillTwin, Refusals) {
  std::mt19937_64 rng(13);
  Paged p = make_paged(rng, {8}, 4, 1, 4);
  const auto q = test::random_floats(rng, 64);
  std::vector<float> out(64);
  const std::vector<int32_t> cu = {0, 9}, lens = {8};
  auto st = attention_prefill(q.data(), cu.data(), lens.data(), 1, 1, p.view, out.data());
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("9 queries but only 8"), std::string::npos) << st.error().message;
  const std::vector<int32_t> long_lens = {100}, cu1 = {0, 1};
  st = attention_prefill(q.data(), cu1.data(), long_lens.data(), 1, 1, p.view, out.data());
  EXPECT_FALSE(st);
  p.tables[0] = 99;
  const std::vector<int32_t> ok_lens = {8};
  st = attention_prefill(q.data(), cu1.data(), ok_lens.data(), 1, 1, p.view, out.data());
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("block 99"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace mxq
