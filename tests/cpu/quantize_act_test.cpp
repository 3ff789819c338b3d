// CPU activation quantizer (FP8-B128, 1x128 blocks of a row) against the rule written out with the scalar
// codec: amax' = max(amax, 1e-4), e4m3(x · RN(448 / amax')), scale = amax' / 448; and its NaN refusal.
#include "cpu/quantize_act.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "format/codec.h"

namespace mxq {
namespace {

uint16_t to_bf16(float f) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16); }

TEST(QuantizeActFp8B128, FollowsTheRulePerRowBlock) {
  std::mt19937_64 rng(7);
  constexpr int64_t m = 3, k = 300;  // note: a short last block of 44
  std::vector<uint16_t> x(m * k);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& h : x) h = to_bf16(dist(rng));
  for (int64_t j = 128; j < 256; ++j) x[j] = to_bf16(1e-6f * static_cast<float>(j - 127));  // amax under 1e-4
  std::vector<uint8_t> v(m * k);
  std::vector<float> s(m * 3);
  ASSERT_TRUE(quantize_act_fp8_b128(x.data(), m, k, v.data(), s.data()));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t b = 0; b < 3; ++b) {
      const int64_t c0 = b * 128, c1 = std::min(k, c0 + 128);
      float amax = 0;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(bf16_to_f32(x[r * k + c])));
      const float a = std::max(amax, 1e-4f);
      ASSERT_EQ(s[r * 3 + b], a / 448.0f) << "row " << r << " block " << b;
      const float mul = 448.0f / a;
      for (int64_t c = c0; c < c1; ++c)
        ASSERT_EQ(v[r * k + c], f32_to_e4m3(bf16_to_f32(x[r * k + c]) * mul)) << "row " << r << " col " << c;
    }
}

TEST(QuantizeActFp8B128, RefusesNaNNamingTheRow) {
  std::vector<uint16_t> x(2 * 128, to_bf16(1.0f));
  x[128 + 5] = 0x7FC0;  // bf16 NaN in row 1
  std::vector<uint8_t> v(x.size());
  std::vector<float> s(2);
  const Status st = quantize_act_fp8_b128(x.data(), 2, 128, v.data(), s.data());
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("activation row 1"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace mxq
