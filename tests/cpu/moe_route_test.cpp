// cpu/moe_route against model/qwen3.cpp's expert loop: the grouping lists each expert's routed rows in token
// order (the loop's `rows`), and moe_combine equals the gather → scatter-add in expert order, bit for bit.
#include "cpu/moe_route.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "cpu/moe_router.h"
#include "test_util.h"

namespace mxq {
namespace {

TEST(MoeRouteTwin, GroupingAndCombineFollowTheExpertLoop) {
  std::mt19937_64 rng(31);
  const int64_t T = 37, E = 16, K = 4, H = 24;
  const auto logits = test::random_floats(rng, static_cast<size_t>(T * E));
  std::vector<int32_t> ids(T * K), counts(E), offsets(E + 1), sorted(T * K), row_of(T * K), want_ids(T * K);
  std::vector<float> w(T * K), want_w(T * K);
  ASSERT_TRUE(moe_route(logits.data(), T, E, K, true, ids.data(), w.data(), counts.data(), offsets.data(),
                        sorted.data(), row_of.data()));
  ASSERT_TRUE(moe_router(logits.data(), T, E, K, true, want_ids.data(), want_w.data()));
  EXPECT_EQ(ids, want_ids);
  EXPECT_EQ(w, want_w);
  // y rows in sorted order: expert e's rows [offsets[e], offsets[e + 1]) are its outputs for its routed rows
  const auto y = test::random_floats(rng, static_cast<size_t>(T * K * H));
  std::vector<float> want(T * H, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> rows;
    std::vector<float> scale;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < K; ++j)
        if (want_ids[t * K + j] == e) rows.push_back(t), scale.push_back(want_w[t * K + j]);
    ASSERT_EQ(counts[e], static_cast<int32_t>(rows.size()));
    for (size_t r = 0; r < rows.size(); ++r) {
      const int32_t entry = sorted[offsets[e] + r];
      ASSERT_EQ(entry / K, rows[r]) << "expert " << e << " row " << r;
      ASSERT_EQ(row_of[entry], offsets[e] + static_cast<int32_t>(r));
      add_scaled_row(want.data() + rows[r] * H, y.data() + (offsets[e] + r) * H, scale[r], H);
    }
  }
  EXPECT_EQ(offsets[E], T * K);
  std::vector<float> out(T * H, NAN);
  moe_combine(y.data(), H, ids.data(), w.data(), row_of.data(), T, K, out.data());
  // note: same terms in the same (expert) order through the one row body: equal bits
  EXPECT_EQ(0, std::memcmp(out.data(), want.data(), out.size() * sizeof(float)));
}

}  // namespace
}  // namespace mxq
