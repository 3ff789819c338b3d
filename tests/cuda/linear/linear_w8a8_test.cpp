// The linear table's W8A8 mode (cuda/linear/linear.h, LinearWeights::act = MXFP8): for MXFP8 (W8A8) and MXFP4
// (W4A8) weights at GEMV and GEMM M, linear() and linear_parts() give bitwise what the weight-only entry
// gives on x taken through the CPU twin of the activation quantize-dequantize, and match the CPU linear on
// those dequantized operands within the format's tolerance; y poisoned first. Also the refusals (FP8-B128
// or bf16 weights with MXFP8 activations, parts with different act modes).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../gpu_test_util.h"
#include "../op_test_util.h"
#include "cpu/linear.h"
#include "cpu/quantize_act.h"
#include "cuda/linear/linear.h"
#include "format/codec.h"
#include "layout/probe.h"

namespace mxq::cuda {
namespace {

struct W8a8Case {
  Format format;
  int64_t m, n, k;
};
void PrintTo(const W8a8Case& c, std::ostream* os) {
  *os << traits(c.format).name << " m=" << c.m << " n=" << c.n << " k=" << c.k;
}

class LinearW8a8 : public ::testing::TestWithParam<W8a8Case> {};

TEST_P(LinearW8a8, EqualsWeightOnlyOnQuantizedActivations) {
  const W8a8Case c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto arch = device_arch(0);
  ASSERT_TRUE(arch) << arch.error().message;
  auto ctx = LinearContext::create(*arch);
  ASSERT_TRUE(ctx) << ctx.error().message;
  const std::vector<int64_t> shape = {c.n, c.k};
  auto g = tensor_geometry("w", c.format, shape);
  ASSERT_TRUE(g) << g.error().message;
  const HostPlanes canonical =
      test::random_planes(rng, c.format, values_bytes(c.format, c.n, c.k), scales_bytes(c.format, c.n, c.k));
  auto native = linear_prepare(c.format, *arch, *g, canonical);
  ASSERT_TRUE(native) << native.error().message;
  const std::vector<uint16_t> x = test::random_bf16(rng, static_cast<size_t>(c.m * c.k), -8, 4);
  std::vector<uint16_t> xq(x.size());
  ASSERT_TRUE(mxq::fake_quant_mxfp8(x.data(), c.m, c.k, xq.data()));
  auto dx = test::upload(x);
  auto dxq = test::upload(xq);
  auto dv = test::upload(native->values);
  auto ds = test::upload(native->scales);
  const size_t ny = static_cast<size_t>(c.m * c.n);
  auto dy = test::poisoned<uint16_t>(ny);
  auto dref = test::poisoned<uint16_t>(ny);
  auto dp0 = test::poisoned<uint16_t>(ny);
  auto dp1 = test::poisoned<uint16_t>(ny);
  ASSERT_TRUE(dx && dxq && dv && ds && dy && dref && dp0 && dp1);
  LinearWeights w{c.format, dv->as<uint8_t>(), ds->as<uint8_t>(), c.n, c.k};
  ASSERT_TRUE(linear(**ctx, w, dxq->as<uint16_t>(), c.m, dref->as<uint16_t>(), nullptr));
  w.act = Format::kMXFP8;
  const Status st = linear(**ctx, w, dx->as<uint16_t>(), c.m, dy->as<uint16_t>(), nullptr);
  ASSERT_TRUE(st) << st.error().message;
  const LinearWeights parts[2] = {w, w};
  uint16_t* const ys[2] = {dp0->as<uint16_t>(), dp1->as<uint16_t>()};
  const Status pst = linear_parts(**ctx, parts, dx->as<uint16_t>(), c.m, ys, nullptr);
  ASSERT_TRUE(pst) << pst.error().message;

  auto ref = test::download<uint16_t>(*dref, ny);
  auto y = test::download<uint16_t>(*dy, ny);
  auto p0 = test::download<uint16_t>(*dp0, ny);
  auto p1 = test::download<uint16_t>(*dp1, ny);
  ASSERT_TRUE(ref && y && p0 && p1);
  for (size_t i = 0; i < ny; ++i) {
    ASSERT_EQ((*y)[i], (*ref)[i]) << "linear, row " << i / c.n << " col " << i % c.n;
    ASSERT_EQ((*p0)[i], (*ref)[i]) << "linear_parts part 0, row " << i / c.n << " col " << i % c.n;
    ASSERT_EQ((*p1)[i], (*ref)[i]) << "linear_parts part 1, row " << i / c.n << " col " << i % c.n;
  }
  // "dequantize both, bf16 product, f32 accumulate": the CPU linear on the dequantized operands
  const WeightView view{c.format, c.n, c.k, canonical.values.data(), canonical.scales.data()};
  std::vector<float> yref(ny);
  ASSERT_TRUE(mxq::linear(test::to_f32(xq).data(), c.m, view, nullptr, yref.data()));
  const std::vector<double> want(yref.begin(), yref.end());
  EXPECT_LE(test::nmse(test::to_f32(*y), want), traits(c.format).nmse_tolerance);
}

std::vector<W8a8Case> w8a8_cases() {
  std::vector<W8a8Case> cases;
  for (int64_t m : {1, 3, 8, 17, 33, 300})
    for (Format f : {Format::kMXFP8, Format::kMXFP4}) {
      cases.push_back({f, m, 264, 800});
      cases.push_back({f, m, 1000, 1024});
    }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Table, LinearW8a8, ::testing::ValuesIn(w8a8_cases()), [](const auto& info) {
  const W8a8Case& c = info.param;
  return std::string(traits(c.format).name == std::string_view("mxfp8") ? "mxfp8" : "mxfp4") + "_m" +
         std::to_string(c.m) + "_n" + std::to_string(c.n) + "_k" + std::to_string(c.k);
});

TEST(LinearW8a8Refuses, NonMxWeightsAndMixedParts) {
  auto arch = device_arch(0);
  ASSERT_TRUE(arch) << arch.error().message;
  auto ctx = LinearContext::create(*arch);
  ASSERT_TRUE(ctx) << ctx.error().message;
  auto buf = test::poisoned<uint8_t>(1 << 20);
  ASSERT_TRUE(buf);
  uint8_t* p = buf->as<uint8_t>();
  auto* x = reinterpret_cast<uint16_t*>(p);
  auto* y = reinterpret_cast<uint16_t*>(p + (1 << 19));
  for (Format f : {Format::kFP8_B128, Format::kBF16}) {
    const LinearWeights w{f, p, p, 128, 128, Format::kMXFP8};
    const Status st = linear(**ctx, w, x, 1, y, nullptr);
    ASSERT_FALSE(st) << traits(f).name;
    EXPECT_NE(st.error().message.find("mxfp8 activations with"), std::string::npos) << st.error().message;
  }
  const LinearWeights a{Format::kMXFP8, p, p, 128, 128, Format::kMXFP8}, b{Format::kMXFP8, p, p, 128, 128};
  const LinearWeights parts[2] = {a, b};
  uint16_t* const ys[2] = {y, y + 1024};
  const Status st = linear_parts(**ctx, parts, x, 1, ys, nullptr);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("part 1"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace mxq::cuda
