#include "cpu/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <ostream>

#include "test_util.h"

namespace mxq {
namespace {

struct AttentionCase {
  int64_t tokens, seq_len, q_heads, kv_heads, head_dim;
};
void PrintTo(const AttentionCase& c, std::ostream* os) {
  *os << "T=" << c.tokens << " S=" << c.seq_len << " Hq=" << c.q_heads << " Hkv=" << c.kv_heads
      << " D=" << c.head_dim;
}

// Written from the definition, not from the op: explicit causal mask, GQA by integer division, f64.
std::vector<double> reference_attention(const AttentionCase& c, const std::vector<float>& q,
                                        const std::vector<float>& k, const std::vector<float>& v) {
  std::vector<double> out(q.size(), 0.0);
  const int64_t rep = c.q_heads / c.kv_heads;
  for (int64_t t = 0; t < c.tokens; ++t)
    for (int64_t h = 0; h < c.q_heads; ++h) {
      const int64_t g = h / rep, pos = c.seq_len - c.tokens + t;
      std::vector<double> s(c.seq_len, -INFINITY);
      double m = -INFINITY;
      for (int64_t j = 0; j <= pos; ++j) {
        double d = 0;
        for (int64_t e = 0; e < c.head_dim; ++e)
          d += static_cast<double>(q[(t * c.q_heads + h) * c.head_dim + e]) *
               k[(j * c.kv_heads + g) * c.head_dim + e];
        s[j] = d / std::sqrt(static_cast<double>(c.head_dim));
        m = std::max(m, s[j]);
      }
      double z = 0;
      for (int64_t j = 0; j <= pos; ++j) z += std::exp(s[j] - m);
      for (int64_t j = 0; j <= pos; ++j)
        for (int64_t e = 0; e < c.head_dim; ++e)
          out[(t * c.q_heads + h) * c.head_dim + e] +=
              std::exp(s[j] - m) / z * v[(j * c.kv_heads + g) * c.head_dim + e];
    }
  return out;
}

class CpuAttention : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(CpuAttention, MatchesCausalGqaInF64) {
  const AttentionCase& c = GetParam();
  std::mt19937_64 rng(c.tokens * 101 + c.seq_len * 7 + c.q_heads * 3 + c.kv_heads);
  std::vector<float> q = test::random_floats(rng, c.tokens * c.q_heads * c.head_dim, 2.0f);
  std::vector<float> k = test::random_floats(rng, c.seq_len * c.kv_heads * c.head_dim, 2.0f);
  std::vector<float> v = test::random_floats(rng, k.size());
  std::vector<float> out(q.size());
  ASSERT_TRUE(attention(q.data(), c.tokens, c.q_heads, k.data(), v.data(), c.seq_len, c.kv_heads, c.head_dim,
                        out.data()));
  EXPECT_LE(test::nmse(out, reference_attention(c, q, k, v)), 1e-10);
}

// T = 1 (decode) and T > 1 (prefill, chunked prefill with T < S), GQA ratios 1, 2, 4 and 8.
INSTANTIATE_TEST_SUITE_P(CpuAttention, CpuAttention,
                         ::testing::Values(AttentionCase{1, 1, 2, 2, 16}, AttentionCase{1, 37, 4, 4, 64},
                                           AttentionCase{1, 300, 8, 4, 128},
                                           AttentionCase{1, 129, 16, 4, 128}, AttentionCase{7, 7, 4, 2, 32},
                                           AttentionCase{5, 40, 4, 1, 64}, AttentionCase{64, 64, 8, 2, 128},
                                           AttentionCase{33, 100, 16, 2, 64}, AttentionCase{3, 10, 8, 8, 8}),
                         [](const ::testing::TestParamInfo<AttentionCase>& i) {
                           const AttentionCase& c = i.param;
                           return "T" + std::to_string(c.tokens) + "_S" + std::to_string(c.seq_len) + "_Hq" +
                                  std::to_string(c.q_heads) + "_Hkv" + std::to_string(c.kv_heads) + "_D" +
                                  std::to_string(c.head_dim);
                         });

// A query must not see the future: changing keys/values after its position leaves its output unchanged.
TEST(CpuAttention, FutureKeysDoNotLeakIntoEarlierQueries) {
  const int64_t t = 6, hq = 4, hkv = 2, d = 16;
  std::mt19937_64 rng(5);
  std::vector<float> q = test::random_floats(rng, t * hq * d), k = test::random_floats(rng, t * hkv * d);
  std::vector<float> v = test::random_floats(rng, k.size()), a(q.size()), b(q.size());
  ASSERT_TRUE(attention(q.data(), t, hq, k.data(), v.data(), t, hkv, d, a.data()));
  for (int64_t i = 3 * hkv * d; i < t * hkv * d; ++i) k[i] += 1.0f, v[i] -= 2.0f;  // positions 3..5
  ASSERT_TRUE(attention(q.data(), t, hq, k.data(), v.data(), t, hkv, d, b.data()));
  for (int64_t i = 0; i < 3 * hq * d; ++i) EXPECT_EQ(a[i], b[i]) << i;
  EXPECT_NE(a[5 * hq * d], b[5 * hq * d]);
}

TEST(CpuAttention, RefusesBadHeadGroupingAndShortCacheByName) {
  std::vector<float> buf(1024, 1.0f), out(1024);
  EXPECT_NE(attention(buf.data(), 1, 6, buf.data(), buf.data(), 4, 4, 8, out.data())
                .error()
                .message.find("multiple"),
            std::string::npos);
  EXPECT_NE(attention(buf.data(), 5, 2, buf.data(), buf.data(), 4, 2, 8, out.data())
                .error()
                .message.find("KV cache"),
            std::string::npos);
}

}  // namespace
}  // namespace mxq
