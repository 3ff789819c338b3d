// GPU activation quantizer (FP8-B128, 1x128 blocks) against its CPU twin, bitwise: values as bytes, scales
// as f32 bits after the K-block-major permutation; the scale pads past m stay as poisoned.
#include "cuda/quantize/quantize_act.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../gpu_test_util.h"
#include "cpu/quantize_act.h"
#include "format/formats.h"

namespace mxq::cuda {
namespace {

struct ActCase {
  int64_t m, k, ld_pad;
};
void PrintTo(const ActCase& c, std::ostream* os) {
  *os << "m=" << c.m << " k=" << c.k << " pad=" << c.ld_pad;
}

class QuantizeAct : public ::testing::TestWithParam<ActCase> {};

TEST_P(QuantizeAct, BitwiseEqualsCpuTwin) {
  const ActCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // note: wide exponents, so blocks hit the 1e-4 amax floor (2^-20..) and large amaxes alike.
  std::vector<uint16_t> x = test::random_bf16(rng, static_cast<size_t>(c.m * c.k), -24, 12);
  const int64_t blocks = cdiv(c.k, 128), ld = c.m + c.ld_pad;
  std::vector<uint8_t> want_v(static_cast<size_t>(c.m * c.k));
  std::vector<float> want_s(static_cast<size_t>(c.m * blocks));
  ASSERT_TRUE(mxq::quantize_act_fp8_b128(x.data(), c.m, c.k, want_v.data(), want_s.data()));

  auto dx = test::upload(x);
  auto dv = test::poisoned<uint8_t>(want_v.size());
  auto ds = test::poisoned<float>(static_cast<size_t>(blocks * ld));
  ASSERT_TRUE(dx && dv && ds);
  const Status st = cuda::quantize_act_fp8_b128(dx->as<uint16_t>(), c.m, c.k, dv->as<uint8_t>(),
                                                ds->as<float>(), ld, nullptr);
  ASSERT_TRUE(st) << st.error().message;
  auto v = test::download<uint8_t>(*dv, want_v.size());
  auto s = test::download<uint32_t>(*ds, static_cast<size_t>(blocks * ld));
  ASSERT_TRUE(v && s);
  for (size_t i = 0; i < want_v.size(); ++i)
    ASSERT_EQ((*v)[i], want_v[i]) << "row " << i / c.k << " col " << i % c.k;
  for (int64_t r = 0; r < ld; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const uint32_t got = (*s)[static_cast<size_t>(b * ld + r)];
      uint32_t want = 0xFFFFFFFFu;  // note: pad rows are never written
      if (r < c.m) std::memcpy(&want, &want_s[static_cast<size_t>(r * blocks + b)], 4);
      ASSERT_EQ(got, want) << "row " << r << " block " << b;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, QuantizeAct,
                         ::testing::Values(ActCase{1, 128, 0}, ActCase{3, 4096, 1}, ActCase{17, 784, 3},
                                           ActCase{33, 100, 0}, ActCase{5, 4100, 0}, ActCase{2, 131, 2},
                                           ActCase{128, 2048, 0}, ActCase{512, 12288, 0}),
                         [](const auto& info) {
                           const ActCase& c = info.param;
                           return "m" + std::to_string(c.m) + "_k" + std::to_string(c.k) + "_pad" +
                                  std::to_string(c.ld_pad);
                         });

TEST(QuantizeActRefuses, ScaleLdBelowM) {
  uint8_t dummy = 0;
  const Status st = cuda::quantize_act_fp8_b128(reinterpret_cast<const uint16_t*>(&dummy), 4, 128, &dummy,
                                                reinterpret_cast<float*>(&dummy), 3, nullptr);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("scale_ld 3"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace mxq::cuda
