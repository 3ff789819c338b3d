// cpu/qk_norm_rope_cache against the CPU forward's separate steps (head_rms_norm, rope, contiguous copy):
// bitwise, with shuffled slots, padding tokens (slot -1) and the out-of-range slot refusal; its separate
// q / k / v form against its interleaved form, bitwise.
#include "cpu/qk_norm_rope_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "cpu/rms_norm.h"
#include "cpu/rope.h"
#include "test_util.h"

namespace mxq {
namespace {

TEST(QkNormRopeCacheTwin, BitwiseEqualsSeparateSteps) {
  std::mt19937_64 rng(21);
  const int64_t T = 7, hq = 4, hkv = 2, d = 16, slots_n = 10, width = (hq + 2 * hkv) * d;
  const float eps = 1e-6f, theta = 10000.0f;
  const auto qkv = test::random_floats(rng, static_cast<size_t>(T * width));
  const auto qn = test::random_floats(rng, d), kn = test::random_floats(rng, d);
  std::vector<int64_t> pos = {0, 5, 9, 100, 3, 4000, 1};
  std::vector<int32_t> perm(slots_n);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> slots(perm.begin(), perm.begin() + T);
  slots[2] = -1;
  std::vector<float> q(static_cast<size_t>(T * hq * d)), kc(static_cast<size_t>(slots_n * hkv * d), -7.0f),
      vc(kc);
  QkNormRopeCacheArgs a{.qkv = qkv.data(),
                        .tokens = T,
                        .q_heads = hq,
                        .kv_heads = hkv,
                        .head_dim = d,
                        .q_norm = qn.data(),
                        .k_norm = kn.data(),
                        .eps = eps,
                        .positions = pos.data(),
                        .theta = theta,
                        .slot_mapping = slots.data(),
                        .num_slots = slots_n,
                        .q_out = q.data(),
                        .k_cache = kc.data(),
                        .v_cache = vc.data()};
  ASSERT_TRUE(qk_norm_rope_cache(a));
  std::vector<float> wq(q.size()), wk(static_cast<size_t>(T * hkv * d));
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(qkv.begin() + t * width, hq * d, wq.begin() + t * hq * d);
    std::copy_n(qkv.begin() + t * width + hq * d, hkv * d, wk.begin() + t * hkv * d);
  }
  head_rms_norm(wq.data(), T, hq, d, qn.data(), eps);
  head_rms_norm(wk.data(), T, hkv, d, kn.data(), eps);
  ASSERT_TRUE(rope(wq.data(), T, hq, d, pos.data(), theta));
  ASSERT_TRUE(rope(wk.data(), T, hkv, d, pos.data(), theta));
  EXPECT_EQ(q, wq);
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    for (int64_t i = 0; i < hkv * d; ++i) {
      ASSERT_EQ(kc[slots[t] * hkv * d + i], wk[t * hkv * d + i]) << "token " << t;
      ASSERT_EQ(vc[slots[t] * hkv * d + i], qkv[t * width + (hq + hkv) * d + i]) << "token " << t;
    }
  }
  for (int64_t s = 0; s < slots_n; ++s) {
    if (std::find(slots.begin(), slots.end(), s) != slots.end()) continue;
    for (int64_t i = 0; i < hkv * d; ++i) ASSERT_EQ(kc[s * hkv * d + i], -7.0f) << "unmapped slot " << s;
  }
  slots[4] = static_cast<int32_t>(slots_n);
  auto st = qk_norm_rope_cache(a);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("token 4"), std::string::npos) << st.error().message;
}

// The seam's form: q, k and v as three projections wrote them. Same bits as one interleaved row, on a pool
// of its own; k_in without v_in refused by name.
TEST(QkNormRopeCacheTwin, SeparateInputsEqualInterleaved) {
  std::mt19937_64 rng(22);
  const int64_t T = 9, hq = 8, hkv = 2, d = 64, slots_n = 16, qw = hq * d, kw = hkv * d, width = qw + 2 * kw;
  const auto qkv = test::random_floats(rng, static_cast<size_t>(T * width));
  const auto qn = test::random_floats(rng, d), kn = test::random_floats(rng, d);
  std::vector<int64_t> pos(T);
  std::vector<int32_t> slots(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = 37 * t + 5, slots[t] = t == 4 ? -1 : static_cast<int32_t>(15 - t);
  std::vector<float> q(static_cast<size_t>(T * qw)), kc(static_cast<size_t>(slots_n * kw), -3.0f), vc(kc);
  QkNormRopeCacheArgs a{.qkv = qkv.data(),
                        .tokens = T,
                        .q_heads = hq,
                        .kv_heads = hkv,
                        .head_dim = d,
                        .q_norm = qn.data(),
                        .k_norm = kn.data(),
                        .eps = 1e-6f,
                        .positions = pos.data(),
                        .theta = 1e6f,
                        .slot_mapping = slots.data(),
                        .num_slots = slots_n,
                        .q_out = q.data(),
                        .k_cache = kc.data(),
                        .v_cache = vc.data()};
  ASSERT_TRUE(qk_norm_rope_cache(a));
  std::vector<float> qs(static_cast<size_t>(T * qw)), ks(static_cast<size_t>(T * kw)), vs(ks);
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(qkv.begin() + t * width, qw, qs.begin() + t * qw);
    std::copy_n(qkv.begin() + t * width + qw, kw, ks.begin() + t * kw);
    std::copy_n(qkv.begin() + t * width + qw + kw, kw, vs.begin() + t * kw);
  }
  std::vector<float> q2(q.size()), kc2(kc.size(), -3.0f), vc2(kc2);
  ThreadPool pool(3);
  auto b = a;
  b.qkv = qs.data(), b.k_in = ks.data(), b.v_in = vs.data();
  b.q_out = q2.data(), b.k_cache = kc2.data(), b.v_cache = vc2.data();
  ASSERT_TRUE(qk_norm_rope_cache(b, pool));
  EXPECT_EQ(0, std::memcmp(q.data(), q2.data(), q.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(kc.data(), kc2.data(), kc.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(vc.data(), vc2.data(), vc.size() * sizeof(float)));
  b.v_in = nullptr;
  auto st = qk_norm_rope_cache(b);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("got only k_in"), std::string::npos) << st.error().message;
}

TEST(RopeInvFreq, IsTheTableRopeRotatesBy) {
  const auto f = rope_inv_freq(1e6f, 128);
  ASSERT_TRUE(f);
  ASSERT_EQ(f->size(), 64u);
  EXPECT_EQ((*f)[0], 1.0f);
  // one rotation at position 1 of a unit vector in dims (i, i + 64) gives (cos f_i, sin f_i)
  std::vector<float> x(128, 0.0f);
  x[10] = 1.0f;
  const int64_t pos = 1;
  ASSERT_TRUE(rope(x.data(), 1, 1, 128, &pos, 1e6f));
  EXPECT_EQ(x[10], static_cast<float>(std::cos(static_cast<double>((*f)[10]))));
  EXPECT_EQ(x[74], static_cast<float>(std::sin(static_cast<double>((*f)[10]))));
  EXPECT_FALSE(rope_inv_freq(1e6f, 7));
  EXPECT_FALSE(rope_inv_freq(0.5f, 8));
}

}  // namespace
}  // namespace mxq
