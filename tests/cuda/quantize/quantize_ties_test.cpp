// Issue 22 edge cases on the GPU quantizers, bitwise against the CPU quantize and the committed goldens:
// FP8-B128 blocks whose torch multiplier fl(fl(1/amax')*448) differs from fl(448/amax') by an ulp, with
// elements on E4M3 ties (tests/golden/make_b128_ties_golden.py), through every bf16 launch shape, the
// any-source kernel (bf16, f32) and the activation quantizer; and MXFP8 rule ct products that underflow f32
// (the +0 zero point is added after the rounded product, never fused into an FMA).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "../../format/golden_npy.h"
#include "../gpu_test_util.h"
#include "cpu/quantize_act.h"
#include "cuda/quantize/quantize.h"
#include "cuda/quantize/quantize_act.h"
#include "cuda/quantize/quantize_launch.h"
#include "format/formats.h"
#include "format/quantize.h"

namespace mxq::cuda {
namespace {

using mxq::testing::load_npy;

struct Golden {
  std::vector<uint8_t> in, values, scales;
  int64_t rows = 0, cols = 0;
};

Golden load_golden(const std::string& tag) {
  Golden g;
  const auto in = load_npy("b128_" + tag + "_in");
  if (in.shape.size() != 2) return g;
  g.in = in.data;
  g.rows = in.shape[0], g.cols = in.shape[1];
  g.values = load_npy("b128_" + tag + "_values").data;
  g.scales = load_npy("b128_" + tag + "_scales").data;
  return g;
}

// The CPU planes of g's input (they must equal the golden: tests/format/quantize_test.cpp checks the same).
void expect_cpu_is_golden(const Golden& g, Format src) {
  std::vector<uint8_t> v(g.values.size()), s(g.scales.size());
  ASSERT_TRUE(quantize(Format::kFP8_B128, ScaleRule::kCeil, src, g.in.data(), g.rows, g.cols, v.data(),
                       s.data(), "ties"));
  ASSERT_EQ(v, g.values);
  ASSERT_EQ(s, g.scales);
}

// Runs launch(dx, dv, ds, bad) and expects the golden planes byte for byte and no block flagged.
template <class Launch>
void expect_gpu_is_golden(const Golden& g, Launch launch) {
  auto dx = test::upload(g.in);
  auto dv = test::poisoned<uint8_t>(g.values.size());
  auto ds = test::poisoned<uint8_t>(g.scales.size());
  auto bad = test::poisoned<unsigned long long>(1);
  ASSERT_TRUE(dx && dv && ds && bad);
  ASSERT_EQ(launch(dx->as(), dv->as<uint8_t>(), ds->as(), bad->as<unsigned long long>()), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto v = test::download<uint8_t>(*dv, g.values.size());
  auto s = test::download<uint8_t>(*ds, g.scales.size());
  auto b = test::download<unsigned long long>(*bad, 1);
  ASSERT_TRUE(v && s && b);
  EXPECT_EQ((*b)[0], ~0ull);
  for (size_t i = 0; i < g.scales.size(); ++i) ASSERT_EQ((*s)[i], g.scales[i]) << "scale byte " << i;
  size_t differ = 0, first = 0;
  for (size_t i = g.values.size(); i-- > 0;)
    if ((*v)[i] != g.values[i]) ++differ, first = i;
  EXPECT_EQ(differ, 0u) << "first at row " << first / static_cast<size_t>(g.cols) << " col "
                        << first % static_cast<size_t>(g.cols);
}

TEST(GpuQuantizeTies, Fp8B128Bf16EveryLaunchShape) {
  const Golden g = load_golden("ties_bf16_16x1448");
  ASSERT_GT(g.rows, 0);
  expect_cpu_is_golden(g, Format::kBF16);
  for (int ctas : {-1, 0, 1, 3, 4}) {
    SCOPED_TRACE("ctas_per_sm " + std::to_string(ctas));
    expect_gpu_is_golden(g, [&](void* x, uint8_t* v, void* s, unsigned long long* bad) {
      return launch_quantize_fp8_b128(static_cast<const uint16_t*>(x), g.rows, g.cols, v,
                                      static_cast<float*>(s), bad, nullptr, QuantLaunch{0, ctas});
    });
  }
}

TEST(GpuQuantizeTies, Fp8B128AnySourceKernel) {
  struct SrcCase {
    const char* tag;
    Format src;
    QuantSrc qsrc;
  };
  for (const SrcCase c : {SrcCase{"ties_bf16_16x1448", Format::kBF16, QuantSrc::kBF16},
                          SrcCase{"ties_f32_8x520", Format::kF32, QuantSrc::kF32}}) {
    SCOPED_TRACE(c.tag);
    const Golden g = load_golden(c.tag);
    ASSERT_GT(g.rows, 0);
    expect_cpu_is_golden(g, c.src);
    expect_gpu_is_golden(g, [&](void* x, uint8_t* v, void* s, unsigned long long* bad) {
      return launch_quantize_src(QuantFormat::kFP8_B128, QuantRule::kCeil, c.qsrc, x, g.rows, g.cols, v, s,
                                 bad, nullptr);
    });
  }
}

// The activation quantizer (1x128 blocks) on the bf16 golden's rows, each block's amax copied into every
// row so that every 1x128 block has one of the separating amaxes: GPU against the CPU twin, bitwise.
TEST(GpuQuantizeTies, ActivationFp8B128) {
  const Golden g = load_golden("ties_bf16_16x1448");
  ASSERT_GT(g.rows, 0);
  const int64_t m = g.rows, k = g.cols, blocks = cdiv(k, 128);
  std::vector<uint16_t> x(static_cast<size_t>(m * k));
  std::memcpy(x.data(), g.in.data(), x.size() * 2);
  for (int64_t r = 1; r < m; ++r)
    for (int64_t b = 0; b < blocks; ++b)
      x[static_cast<size_t>(r * k + b * 128)] = x[static_cast<size_t>(b * 128)];
  std::vector<uint8_t> want_v(x.size());
  std::vector<float> want_s(static_cast<size_t>(m * blocks));
  ASSERT_TRUE(mxq::quantize_act_fp8_b128(x.data(), m, k, want_v.data(), want_s.data()));
  auto dx = test::upload(x);
  auto dv = test::poisoned<uint8_t>(want_v.size());
  auto ds = test::poisoned<float>(want_s.size());
  ASSERT_TRUE(dx && dv && ds);
  const Status st =
      cuda::quantize_act_fp8_b128(dx->as<uint16_t>(), m, k, dv->as<uint8_t>(), ds->as<float>(), m, nullptr);
  ASSERT_TRUE(st) << st.error().message;
  auto v = test::download<uint8_t>(*dv, want_v.size());
  auto s = test::download<uint32_t>(*ds, want_s.size());
  ASSERT_TRUE(v && s);
  for (size_t i = 0; i < want_v.size(); ++i)
    ASSERT_EQ((*v)[i], want_v[i]) << "row " << i / static_cast<size_t>(k) << " col "
                                  << i % static_cast<size_t>(k);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      uint32_t want = 0;
      std::memcpy(&want, &want_s[static_cast<size_t>(r * blocks + b)], 4);
      ASSERT_EQ((*s)[static_cast<size_t>(b * m + r)], want) << "row " << r << " block " << b;
    }
}

// MXFP8 rule ct from f32, one f32-max block (b 247, x · 2^-120): -2^-149 · 2^-120 underflows to -0 in f32
// and the +0 zero point then makes it +0 (0x00), as compressed-tensors' two torch ops; -0 -> 0x00; -2^-140
// stays a nonzero f32 and rounds to -0 in E4M3 (0x80). Rule ceil keeps the sign of the underflow (0x80).
TEST(GpuQuantizeTies, Mxfp8CtUnderflowIsPlusZero) {
  for (ScaleRule rule : {ScaleRule::kCt, ScaleRule::kCeil}) {
    SCOPED_TRACE(std::string(scale_rule_name(rule)));
    std::vector<float> x(64, 0.0f);
    const float head[] = {3.4028235e38f, -0x1p-149f, -0.0f, -0x1p-20f};
    for (int block = 0; block < 2; ++block)
      std::copy(std::begin(head), std::end(head), x.begin() + 32 * block);
    std::vector<uint8_t> want_v(64), want_s(2);
    ASSERT_TRUE(
        quantize(Format::kMXFP8, rule, Format::kF32, x.data(), 1, 64, want_v.data(), want_s.data(), "x"));
    const std::vector<uint8_t> head_bytes = rule == ScaleRule::kCt
                                                ? std::vector<uint8_t>{0x78, 0x00, 0x00, 0x80}
                                                : std::vector<uint8_t>{0x78, 0x80, 0x80, 0x80};
    EXPECT_EQ(std::vector<uint8_t>(want_v.begin(), want_v.begin() + 4), head_bytes);
    auto dx = test::upload(x);
    auto dv = test::poisoned<uint8_t>(64);
    auto ds = test::poisoned<uint8_t>(2);
    ASSERT_TRUE(dx && dv && ds);
    const Status st = cuda::quantize(Format::kMXFP8, rule, Format::kF32, dx->as(), 1, 64, dv->as<uint8_t>(),
                                     ds->as(), "x", nullptr);
    ASSERT_TRUE(st) << st.error().message;
    auto v = test::download<uint8_t>(*dv, 64);
    auto s = test::download<uint8_t>(*ds, 2);
    ASSERT_TRUE(v && s);
    EXPECT_EQ(*s, want_s);
    EXPECT_EQ(*v, want_v);
  }
}

}  // namespace
}  // namespace mxq::cuda
