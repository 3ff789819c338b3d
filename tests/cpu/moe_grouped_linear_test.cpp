// cpu/moe_grouped_linear (the twin of the CUDA grouped expert linear) against a plain per-entry dot product
// in f64 over bf16 weights, and cpu/moe_route's active-expert list against the counts.
#include "cpu/moe_grouped_linear.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "cpu/moe_route.h"
#include "format/codec.h"
#include "test_util.h"

namespace mxq {
namespace {

TEST(MoeGroupedLinearTwin, EveryEntryIsItsExpertsRowTimesTheWeights) {
  std::mt19937_64 rng(77);
  const int64_t T = 23, E = 12, K = 3, n = 40, k = 64, P = 2;
  const auto logits = test::random_floats(rng, static_cast<size_t>(T * E));
  std::vector<int32_t> ids(T * K), counts(E), offsets(E + 1), sorted(T * K), row_of(T * K), active(E);
  std::vector<float> rw(T * K);
  ASSERT_TRUE(moe_route(logits.data(), T, E, K, true, ids.data(), rw.data(), counts.data(), offsets.data(),
                        sorted.data(), row_of.data(), active.data()));
  // active: the experts with entries, ascending, then -1
  int64_t a = 0;
  for (int64_t e = 0; e < E; ++e)
    if (counts[e] > 0) {
      EXPECT_EQ(active[a++], e);
    }
  for (; a < E; ++a) EXPECT_EQ(active[a], -1);

  const auto wf = test::random_floats(rng, static_cast<size_t>(E * P * n * k));
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16(wf[i]);
  std::vector<WeightView> views;
  for (int64_t i = 0; i < E * P; ++i)
    views.push_back(
        WeightView{Format::kBF16, n, k, reinterpret_cast<const uint8_t*>(wb.data() + i * n * k), nullptr});
  const auto x = test::random_floats(rng, static_cast<size_t>(T * k));
  const int64_t stride = T * K * n;
  std::vector<float> y(static_cast<size_t>(P * stride), NAN);
  ASSERT_TRUE(
      moe_grouped_linear("experts", views, P, offsets.data(), sorted.data(), K, x.data(), y.data(), stride));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t p = offsets[e]; p < offsets[e + 1]; ++p) {
      ASSERT_EQ(ids[sorted[p]], e);
      const int64_t t = sorted[p] / K;
      for (int64_t q = 0; q < P; ++q)
        for (int64_t r = 0; r < n; ++r) {
          double want = 0;
          for (int64_t c = 0; c < k; ++c)
            want += static_cast<double>(x[t * k + c]) * bf16_to_f32(wb[((e * P + q) * n + r) * k + c]);
          ASSERT_NEAR(y[q * stride + p * n + r], want, 1e-4 * (1 + std::abs(want)))
              << "expert " << e << " entry " << p << " part " << q << " row " << r;
        }
    }
}

TEST(MoeGroupedLinearTwin, RefusesMixedShapesByName) {
  const std::vector<uint16_t> w(64 * 64, 0x3F80);
  const auto* v = reinterpret_cast<const uint8_t*>(w.data());
  const std::vector<WeightView> views = {{Format::kBF16, 64, 64, v, nullptr},
                                         {Format::kBF16, 32, 64, v, nullptr}};
  const int32_t offsets[3] = {0, 0, 0};
  auto st = moe_grouped_linear("layer.experts", views, 1, offsets, nullptr, 1, nullptr, nullptr, 0);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("layer.experts"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace mxq
