// What the engine takes from the linear dispatch table beside linear() itself (cuda/linear/linear.h):
//   linear_weights: one expert of a stacked [E, n, k] tensor prepared as a whole is the same native matrix as
//     that expert prepared alone: y bitwise equal on fresh random planes for every format, M on both sides
//     of the GEMV / GEMM split; wrong plane sizes and ranks refused naming the tensor;
//   linear_f32: bf16 weights, f32 output (logits, router logits) against the CPU linear; other formats
//     refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../op_test_util.h"
#include "cpu/linear.h"
#include "cuda/linear/gemv_mx_launch.h"
#include "cuda/linear/linear.h"
#include "format/codec.h"

namespace mxq::cuda {
namespace {

// Random canonical planes of [rows, k] (rows = E·n); FP8-B128 scales (1 + u) · 2^-10.
HostPlanes random_planes(std::mt19937_64& rng, Format f, const TensorGeometry& g) {
  return test::random_planes(rng, f, g.values.bytes(), g.scales.bytes(), -10, 1);
}

// Expert e's rows of a canonical plane of `experts` equal row blocks.
std::vector<uint8_t> expert_rows(const std::vector<uint8_t>& plane, int64_t experts, int64_t e) {
  const size_t per = plane.size() / static_cast<size_t>(experts);
  return {plane.begin() + static_cast<int64_t>(per) * e, plane.begin() + static_cast<int64_t>(per) * (e + 1)};
}

class LinearExperts : public ::testing::TestWithParam<Format> {};

TEST_P(LinearExperts, ExpertViewOfStackedTensorEqualsTheExpertAlone) {
  const Format f = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto arch = device_arch(0);
  ASSERT_TRUE(arch) << arch.error().message;
  auto ctx = LinearContext::create(*arch);
  ASSERT_TRUE(ctx) << ctx.error().message;
  // note: n = 200 is not a multiple of 128 (FP8-B128's scale rows are per 128 rows of one expert), k = 384
  const int64_t E = 3, n = 200, k = 384;
  const std::vector<int64_t> stacked_shape = {E, n, k}, one_shape = {n, k};
  auto gs = tensor_geometry("experts", f, stacked_shape);
  auto g1 = tensor_geometry("expert", f, one_shape);
  ASSERT_TRUE(gs && g1);
  const HostPlanes canonical = random_planes(rng, f, *gs);
  auto native = linear_prepare(f, *arch, *gs, canonical);
  ASSERT_TRUE(native) << native.error().message;
  auto dv = test::must(test::upload(native->values));
  auto ds = test::must(test::upload(native->scales.empty() ? std::vector<uint8_t>(16) : native->scales));
  const std::span<const uint8_t> values(dv.as<uint8_t>(), native->values.size()),
      scales(ds.as<uint8_t>(), native->scales.size());
  for (int64_t e = 0; e < E; ++e) {
    auto alone = linear_prepare(
        f, *arch, *g1,
        HostPlanes{expert_rows(canonical.values, E, e),
                   f == Format::kBF16 ? std::vector<uint8_t>{} : expert_rows(canonical.scales, E, e)});
    ASSERT_TRUE(alone) << alone.error().message;
    auto av = test::must(test::upload(alone->values));
    auto as = test::must(test::upload(alone->scales.empty() ? std::vector<uint8_t>(16) : alone->scales));
    const LinearWeights w1{f, av.as<uint8_t>(), f == Format::kBF16 ? nullptr : as.as<uint8_t>(), n, k};
    auto we = linear_weights("experts", f, stacked_shape, values, scales, e);
    ASSERT_TRUE(we) << we.error().message;
    EXPECT_EQ(we->n, n);
    EXPECT_EQ(we->k, k);
    for (int64_t m : {1, 5, 16, 17, 40}) {
      const auto x = test::random_bf16(rng, static_cast<size_t>(m * k));
      auto dx = test::must(test::upload(x));
      auto y1 = test::must(test::poisoned<uint16_t>(static_cast<size_t>(m * n)));
      auto ye = test::must(test::poisoned<uint16_t>(static_cast<size_t>(m * n)));
      auto st = linear(**ctx, w1, dx.as<uint16_t>(), m, y1.as<uint16_t>(), nullptr);
      ASSERT_TRUE(st) << st.error().message;
      st = linear(**ctx, *we, dx.as<uint16_t>(), m, ye.as<uint16_t>(), nullptr);
      ASSERT_TRUE(st) << st.error().message;
      const auto a = test::must(test::download<uint16_t>(y1, static_cast<size_t>(m * n)));
      const auto b = test::must(test::download<uint16_t>(ye, static_cast<size_t>(m * n)));
      ASSERT_EQ(a, b) << "expert " << e << ", M = " << m;
      ASSERT_NE(a[0], 0xFFFF) << "output left unwritten";
    }
  }
  // The whole tensor as one matrix, a missing expert and a short plane are refused naming the tensor.
  for (const auto& r :
       {linear_weights("experts", f, stacked_shape, values, scales, -1),
        linear_weights("experts", f, stacked_shape, values, scales, E),
        linear_weights("experts", f, stacked_shape, values.first(values.size() - 1), scales, 0),
        linear_weights("experts", f, one_shape, values, scales, -1)}) {
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("experts"), std::string::npos) << r.error().message;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, LinearExperts,
                         ::testing::Values(Format::kBF16, Format::kMXFP8, Format::kMXFP4, Format::kFP8_B128),
                         [](const auto& info) {
                           std::string name(traits(info.param).name);
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

// linear_parts: q/k/v- and gate/up-like parts of one x give, part by part, the bytes linear() gives each part
// alone, for every format on both sides of the GEMV / GEMM split (one launch where the entry is a GEMV).
class LinearParts : public ::testing::TestWithParam<Format> {};

TEST_P(LinearParts, EachPartEqualsItsOwnLinear) {
  const Format f = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto arch = device_arch(0);
  ASSERT_TRUE(arch) << arch.error().message;
  auto ctx = LinearContext::create(*arch);
  ASSERT_TRUE(ctx) << ctx.error().message;
  // note: ragged n (200 and 72 rows are not multiples of the 16-row tile), k = 384 (a 64-wide MXFP8 tail
  // group for neither, a 128-wide MXFP4 tail: 384 = 3 · 128)
  const int64_t k = 384;
  // note: {4104, 1032, 1032} is 387 row tiles, more than the persistent GEMV grid (2 blocks per SM, 264 on an
  // H200): its blocks walk several tiles across part boundaries.
  for (const std::vector<int64_t>& ns : {std::vector<int64_t>{200, 72, 72}, std::vector<int64_t>{520, 520},
                                         std::vector<int64_t>{4104, 1032, 1032}}) {
    std::vector<DeviceBuffer> dv, ds;
    std::vector<LinearWeights> w;
    for (int64_t n : ns) {
      const std::vector<int64_t> shape = {n, k};
      auto g = tensor_geometry("part", f, shape);
      ASSERT_TRUE(g) << g.error().message;
      auto native = linear_prepare(f, *arch, *g, random_planes(rng, f, *g));
      ASSERT_TRUE(native) << native.error().message;
      dv.push_back(test::must(test::upload(native->values)));
      ds.push_back(
          test::must(test::upload(native->scales.empty() ? std::vector<uint8_t>(16) : native->scales)));
      w.push_back(LinearWeights{f, dv.back().as<uint8_t>(),
                                f == Format::kBF16 ? nullptr : ds.back().as<uint8_t>(), n, k});
    }
    // Every GEMV variant (gemv_mx_launch.h; the others ignore the switch) on both sides.
    for (GemvKernel v : kGemvKernels)
      for (int64_t m : {1, 3, 8, 9, 17, 32, 40}) {
        SCOPED_TRACE(fmt::format("{} parts, M = {}, GEMV variant {}", ns.size(), m, gemv_kernel_name(v)));
        set_gemv_kernel(v);
        const auto x = test::random_bf16(rng, static_cast<size_t>(m * k));
        auto dx = test::must(test::upload(x));
        std::vector<DeviceBuffer> ya, yb;
        std::vector<uint16_t*> ys;
        for (int64_t n : ns) {
          ya.push_back(test::must(test::poisoned<uint16_t>(static_cast<size_t>(m * n))));
          yb.push_back(test::must(test::poisoned<uint16_t>(static_cast<size_t>(m * n))));
          ys.push_back(yb.back().as<uint16_t>());
        }
        for (size_t i = 0; i < ns.size(); ++i) {
          auto st = linear(**ctx, w[i], dx.as<uint16_t>(), m, ya[i].as<uint16_t>(), nullptr);
          ASSERT_TRUE(st) << st.error().message;
        }
        auto st = linear_parts(**ctx, w, dx.as<uint16_t>(), m, ys, nullptr);
        set_gemv_kernel(GemvKernel::kAuto);
        ASSERT_TRUE(st) << st.error().message;
        for (size_t i = 0; i < ns.size(); ++i) {
          const auto a = test::must(test::download<uint16_t>(ya[i], static_cast<size_t>(m * ns[i])));
          const auto b = test::must(test::download<uint16_t>(yb[i], static_cast<size_t>(m * ns[i])));
          ASSERT_EQ(a, b) << "part " << i;
          ASSERT_NE(b[b.size() - 1], 0xFFFF) << "part " << i << " left unwritten";
        }
      }
  }
  // Outputs that do not match the weights are refused.
  const LinearWeights one{f, nullptr, nullptr, 16, k};
  uint16_t* none[2] = {nullptr, nullptr};
  EXPECT_FALSE(linear_parts(**ctx, std::span(&one, 1), nullptr, 1, std::span(none, 2), nullptr));
}

INSTANTIATE_TEST_SUITE_P(Formats, LinearParts,
                         ::testing::Values(Format::kBF16, Format::kMXFP8, Format::kMXFP4, Format::kFP8_B128),
                         [](const auto& info) {
                           std::string name(traits(info.param).name);
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

TEST(LinearF32, MatchesCpuTwinAndRefusesQuantizedWeights) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto arch = device_arch(0);
  ASSERT_TRUE(arch) << arch.error().message;
  auto ctx = LinearContext::create(*arch);
  ASSERT_TRUE(ctx) << ctx.error().message;
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape s : {Shape{1, 77, 130}, Shape{7, 512, 256}, Shape{40, 1000, 64}}) {
    SCOPED_TRACE(fmt::format("m {} n {} k {}", s.m, s.n, s.k));
    const auto w = test::random_bf16(rng, static_cast<size_t>(s.n * s.k));
    const auto x = test::random_bf16(rng, static_cast<size_t>(s.m * s.k));
    auto dw = test::must(test::upload(w));
    auto dx = test::must(test::upload(x));
    auto dy = test::must(test::poisoned<float>(static_cast<size_t>(s.m * s.n)));
    const LinearWeights lw{Format::kBF16, dw.as<uint8_t>(), nullptr, s.n, s.k};
    auto st = linear_f32(**ctx, lw, dx.as<uint16_t>(), s.m, dy.as<float>(), nullptr);
    ASSERT_TRUE(st) << st.error().message;
    const auto y = test::must(test::download<float>(dy, static_cast<size_t>(s.m * s.n)));
    std::vector<float> xf(x.size());
    for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_f32(x[i]);
    const WeightView view{Format::kBF16, s.n, s.k, reinterpret_cast<const uint8_t*>(w.data()), nullptr};
    std::vector<float> yref(y.size());
    ASSERT_TRUE(mxq::linear(xf.data(), s.m, view, nullptr, yref.data()));
    const std::vector<double> ref(yref.begin(), yref.end());
    // note: same bf16 operands, f32 accumulation on both sides: only the summation order differs
    EXPECT_LE(test::nmse(y, ref), 1e-8) << "NaN means an output was left unwritten";
  }
  const uint8_t dummy = 0;
  const LinearWeights q{Format::kMXFP8, &dummy, &dummy, 64, 64};
  const auto st = linear_f32(**ctx, q, reinterpret_cast<const uint16_t*>(&dummy), 1,
                             reinterpret_cast<float*>(const_cast<uint8_t*>(&dummy)), nullptr);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("mxfp8"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace mxq::cuda
