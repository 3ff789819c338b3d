// CPU activation quantizer (FP8-B128, 1x128 blocks of a row) against the rule written out with the scalar
// codec: amax' = max(amax, 1e-4), e4m3(x · RN(448 / amax')), scale = amax' / 448; and its NaN refusal.
// The W8A8 mode's MXFP8 quantize-dequantize against spec/reference_notes.md §1.6's worked example (rule ceil
// row, and the same block 2^40 smaller) and its NaN blocks.
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

TEST(FakeQuantMxfp8, SpecWorkedExampleCeilRow) {
  // Block [500, 1, 0.0078125, -3, 0 x 28]: scale byte 128 (x2), dequantized 512, 1, 0.0078125, -3, 0 ...;
  // then the same block 2^40 smaller (scale byte 88): the same elements 2^40 smaller.
  std::vector<float> x(64, 0.0f);
  x[0] = 500.0f, x[1] = 1.0f, x[2] = 0.0078125f, x[3] = -3.0f;
  for (int e = 0; e < 32; ++e) x[32 + e] = x[e] * 0x1p-40f;
  std::vector<uint16_t> xb(64), yb(64);
  for (int i = 0; i < 64; ++i) xb[i] = to_bf16(x[i]);
  ASSERT_TRUE(fake_quant_mxfp8(xb.data(), 2, 32, yb.data()));
  const float want[4] = {512.0f, 1.0f, 0.0078125f, -3.0f};
  for (int e = 0; e < 32; ++e) {
    EXPECT_EQ(bf16_to_f32(yb[e]), e < 4 ? want[e] : 0.0f) << "element " << e;
    EXPECT_EQ(bf16_to_f32(yb[32 + e]), (e < 4 ? want[e] : 0.0f) * 0x1p-40f) << "element " << e << " (small)";
  }
}

TEST(FakeQuantMxfp8, NonFiniteBlockBecomesNaNOthersKeep) {
  std::vector<uint16_t> x(3 * 32, to_bf16(1.5f));
  x[32 + 9] = 0x7F80;  // +Inf in block 1
  std::vector<uint16_t> y(x.size());
  ASSERT_TRUE(fake_quant_mxfp8(x.data(), 1, 96, y.data()));
  for (int i = 0; i < 96; ++i) {
    if (i >= 32 && i < 64)
      EXPECT_TRUE(std::isnan(bf16_to_f32(y[i]))) << "element " << i;
    else
      EXPECT_EQ(bf16_to_f32(y[i]), 1.5f) << "element " << i;
  }
  const Status st = fake_quant_mxfp8(x.data(), 2, 48, y.data());
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("multiple of 32"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace mxq
