// The sm_90a FP8-B128 GEMM (bench/cuda/gemm_fp8_b128_sm90.h) against the CPU twin: fresh random canonical
// planes in linear_prepare's native layout, fresh bf16 x, y poisoned before each run; the reference is the
// CPU linear (cpu/linear.h) on x taken through the CPU twin of the 1x128 quantizer, as the kernel sees it.
// Every case runs every kernel shape (128- and 64-wide W tiles, 2-CTA clusters sharing W) and the automatic
// pick, and cuBLASLt (Fp8B128Gemm::run) on the same inputs, which must agree with the kernel as closely as
// each agrees with the reference. M covers 1..4096 ragged (tiles cut by M), tiles past the SM count (the
// persistent loop wraps), K from one block to 16; shapes the kernel does not take (N or K not a multiple of
// 128) are refused by name.
#include "bench/cuda/gemm_fp8_b128_sm90.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../cuda/gpu_test_util.h"
#include "../cuda/op_test_util.h"
#include "cpu/linear.h"
#include "cpu/quantize_act.h"
#include "cuda/linear/linear.h"
#include "format/codec.h"

namespace mxq::cuda {
namespace {

struct GemmCase {
  int64_t m, n, k;
};
void PrintTo(const GemmCase& c, std::ostream* os) { *os << "m=" << c.m << " n=" << c.n << " k=" << c.k; }

class GemmFp8B128Sm90 : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmFp8B128Sm90, MatchesCpuTwinAndCublasLt) {
  const GemmCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto arch = device_arch(0);
  ASSERT_TRUE(arch) << arch.error().message;
  if (*arch != Arch::kSm90a) GTEST_SKIP() << "sm_90a kernel; this device is " << arch_name(*arch);
  auto g = Fp8B128Gemm::create();
  ASSERT_TRUE(g) << g.error().message;

  const Format f = Format::kFP8_B128;
  const std::vector<int64_t> shape = {c.n, c.k};
  auto geo = tensor_geometry("w", f, shape);
  ASSERT_TRUE(geo) << geo.error().message;
  const HostPlanes canonical =
      test::random_planes(rng, f, values_bytes(f, c.n, c.k), scales_bytes(f, c.n, c.k));
  auto native = linear_prepare(f, *arch, *geo, canonical);
  ASSERT_TRUE(native) << native.error().message;
  const std::vector<uint16_t> x = test::random_bf16(rng, static_cast<size_t>(c.m * c.k));
  auto dx = test::upload(x);
  auto dv = test::upload(native->values);
  auto ds = test::upload(native->scales);
  ASSERT_TRUE(dx && dv && ds);
  const Fp8B128Weights w{dv->as<uint8_t>(), ds->as<float>(), c.n, c.k};

  // Reference: the CPU linear on x quantized by the CPU twin, dequantized.
  const int64_t blocks = cdiv(c.k, 128);
  std::vector<uint8_t> xv(x.size());
  std::vector<float> xs(static_cast<size_t>(c.m * blocks)), xf(x.size());
  ASSERT_TRUE(mxq::quantize_act_fp8_b128(x.data(), c.m, c.k, xv.data(), xs.data()));
  for (int64_t r = 0; r < c.m; ++r)
    for (int64_t j = 0; j < c.k; ++j) {
      const size_t i = static_cast<size_t>(r * c.k + j);
      xf[i] = e4m3_to_f32(xv[i]) * xs[static_cast<size_t>(r * blocks + j / 128)];
    }
  const WeightView view{f, c.n, c.k, canonical.values.data(), canonical.scales.data()};
  std::vector<float> yref(static_cast<size_t>(c.m * c.n));
  ASSERT_TRUE(mxq::linear(xf.data(), c.m, view, nullptr, yref.data()));
  const std::vector<double> ref(yref.begin(), yref.end());
  const double tol = traits(f).nmse_tolerance;

  auto run = [&](auto&& launch) -> std::vector<float> {
    auto dy = test::poisoned<uint16_t>(static_cast<size_t>(c.m * c.n));
    EXPECT_TRUE(dy);
    if (!dy) return {};
    const Status st = launch(dy->as<uint16_t>());
    EXPECT_TRUE(st) << st.error().message;
    if (!st) return {};
    auto y = test::download<uint16_t>(*dy, static_cast<size_t>(c.m * c.n));
    EXPECT_TRUE(y) << y.error().message;
    if (!y) return {};
    std::vector<float> out(y->size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32((*y)[i]);
    return out;
  };
  auto lt = run([&](uint16_t* y) { return (*g)->run(dx->as<uint16_t>(), c.m, w, y, nullptr); });
  ASSERT_EQ(lt.size(), ref.size());
  const double lt_err = test::nmse(lt, ref);
  EXPECT_LE(lt_err, tol) << "cuBLASLt";
  const std::vector<double> lt_ref(lt.begin(), lt.end());
  for (auto [tile, name] :
       {std::pair{Fp8GemmTile::kAuto, "auto"}, std::pair{Fp8GemmTile::kN128, "n128"},
        std::pair{Fp8GemmTile::kN64, "n64"}, std::pair{Fp8GemmTile::kN128Pair, "n128 pair"}}) {
    auto out = run(
        [&](uint16_t* y) { return linear_fp8_b128_sm90(**g, dx->as<uint16_t>(), c.m, w, y, nullptr, tile); });
    ASSERT_EQ(out.size(), ref.size()) << name;
    const double err = test::nmse(out, ref);
    EXPECT_LE(err, tol) << name << " vs the CPU twin; NaN means an output was left unwritten";
    // note: two f32-accumulating GEMMs on the same quantized operands differ by summation order only.
    EXPECT_LE(test::nmse(out, lt_ref), tol) << name << " vs cuBLASLt (its own error " << lt_err << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmFp8B128Sm90,
    ::testing::Values(GemmCase{1, 128, 128}, GemmCase{3, 256, 768}, GemmCase{8, 384, 512},
                      GemmCase{17, 128, 2048}, GemmCase{64, 512, 256}, GemmCase{127, 256, 384},
                      GemmCase{128, 384, 1024}, GemmCase{129, 256, 640}, GemmCase{200, 640, 512},
                      GemmCase{257, 128, 1536}, GemmCase{511, 512, 384}, GemmCase{1000, 256, 768},
                      // 9 x 16 = 144 tiles of 128 x 128 (288 of 128 x 64): each CTA runs two or more
                      GemmCase{1040, 2048, 384}, GemmCase{2048, 1024, 256}, GemmCase{4096, 256, 512},
                      GemmCase{4093, 384, 256}),
    [](const auto& info) {
      const GemmCase& c = info.param;
      return "m" + std::to_string(c.m) + "_n" + std::to_string(c.n) + "_k" + std::to_string(c.k);
    });

TEST(GemmFp8B128Sm90Shapes, RefusesByName) {
  auto g = Fp8B128Gemm::create();
  ASSERT_TRUE(g) << g.error().message;
  auto dy = test::poisoned<uint16_t>(16);
  ASSERT_TRUE(dy);
  const uint16_t x[1] = {};
  for (auto [n, k] : {std::pair<int64_t, int64_t>{200, 768}, {128, 784}, {256, 64}, {0, 128}}) {
    EXPECT_FALSE(fp8_b128_sm90_takes(n, k));
    // note: non-null dummies: the shape is checked before any pointer is used
    const Fp8B128Weights w{reinterpret_cast<const uint8_t*>(x), reinterpret_cast<const float*>(x), n, k};
    const Status st = linear_fp8_b128_sm90(**g, x, 1, w, dy->as<uint16_t>(), nullptr);
    ASSERT_FALSE(st);
    EXPECT_NE(st.error().message.find("[" + std::to_string(n) + ", " + std::to_string(k) + "]"),
              std::string::npos)
        << st.error().message;
  }
  EXPECT_TRUE(fp8_b128_sm90_takes(4096, 12288));
}

}  // namespace
}  // namespace mxq::cuda
