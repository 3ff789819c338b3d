// The CUDA linear dispatch table (cuda/linear/linear.h) against the CPU linear (cpu/linear.h) on the same
// dequantized operands, for every table entry: fresh random canonical planes, linear_prepare's native
// layout, y poisoned first, M in {1, 3, 8, 16, 17, 24, 32, 33, 128, 512} and ragged N, K (MX: K % 128 == 0,
// the streaming GEMV at M > 24, and K % 128 != 0). FP8-B128 at M > 8 (sm_90a) runs
// cuBLASLt on x quantized per 1x128, so its reference takes x through the CPU twin of that quantizer.
// Also: load-time refusals (names format, arch, tensor) and the prepares probed as byte permutations.
#include "cuda/linear/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../gpu_test_util.h"
#include "../op_test_util.h"
#include "cpu/linear.h"
#include "cpu/quantize_act.h"
#include "cuda/linear/gemv_fp8_b128.h"
#include "cuda/linear/gemv_mx_launch.h"
#include "format/codec.h"
#include "layout/probe.h"

namespace mxq::cuda {
namespace {

struct LinearCase {
  Format format;
  int64_t m, n, k;
};
void PrintTo(const LinearCase& c, std::ostream* os) {
  *os << traits(c.format).name << " m=" << c.m << " n=" << c.n << " k=" << c.k;
}

HostPlanes random_planes(std::mt19937_64& rng, Format f, int64_t n, int64_t k) {
  return test::random_planes(rng, f, values_bytes(f, n, k), scales_bytes(f, n, k));
}

class Linear : public ::testing::TestWithParam<LinearCase> {};

TEST_P(Linear, MatchesCpuTwinOnDequantizedOperands) {
  const LinearCase c = GetParam();
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
  const HostPlanes canonical = random_planes(rng, c.format, c.n, c.k);
  auto native = linear_prepare(c.format, *arch, *g, canonical);
  ASSERT_TRUE(native) << native.error().message;
  const std::vector<uint16_t> x = test::random_bf16(rng, static_cast<size_t>(c.m * c.k));
  auto dx = test::upload(x);
  auto dv = test::upload(native->values);
  auto ds = test::upload(native->scales);
  auto dy = test::poisoned<uint16_t>(static_cast<size_t>(c.m * c.n));
  ASSERT_TRUE(dx && dv && ds && dy);
  const LinearWeights w{c.format, dv->as<uint8_t>(), native->scales.empty() ? nullptr : ds->as<uint8_t>(),
                        c.n, c.k};
  const Status st = linear(**ctx, w, dx->as<uint16_t>(), c.m, dy->as<uint16_t>(), nullptr);

  auto kernel = linear_kernel_name(c.format, *arch, c.m);
  if (!kernel) {  // a refusal entry of the table: linear() must refuse with the same words
    ASSERT_FALSE(st) << "linear ran where the table has no kernel";
    EXPECT_EQ(st.error().message, kernel.error().message);
    return;
  }
  ASSERT_TRUE(st) << st.error().message;

  // Reference: CPU linear (f32) on the canonical weights and on x as the kernel sees it.
  std::vector<float> xf(x.size());
  const bool act_quant = *kernel == std::string_view("cublaslt_fp8_b128");
  if (act_quant) {
    const int64_t blocks = cdiv(c.k, 128);
    std::vector<uint8_t> xv(x.size());
    std::vector<float> xs(static_cast<size_t>(c.m * blocks));
    ASSERT_TRUE(mxq::quantize_act_fp8_b128(x.data(), c.m, c.k, xv.data(), xs.data()));
    for (int64_t r = 0; r < c.m; ++r)
      for (int64_t j = 0; j < c.k; ++j) {
        const size_t i = static_cast<size_t>(r * c.k + j);
        xf[i] = e4m3_to_f32(xv[i]) * xs[static_cast<size_t>(r * blocks + j / 128)];
      }
  } else {
    for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_f32(x[i]);
  }
  const WeightView view{c.format, c.n, c.k, canonical.values.data(),
                        canonical.scales.empty() ? nullptr : canonical.scales.data()};
  std::vector<float> yref(static_cast<size_t>(c.m * c.n));
  ASSERT_TRUE(mxq::linear(xf.data(), c.m, view, nullptr, yref.data()));
  const std::vector<double> ref(yref.begin(), yref.end());
  auto check = [&](const char* variant) {
    auto y = test::download<uint16_t>(*dy, static_cast<size_t>(c.m * c.n));
    ASSERT_TRUE(y) << y.error().message;
    std::vector<float> out(y->size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32((*y)[i]);
    const double err = test::nmse(out, ref);
    EXPECT_LE(err, traits(c.format).nmse_tolerance)
        << *kernel << " (" << variant << "); NaN means an output was left unwritten";
  };
  check("default");
  // The GEMVs again in every kernel variant of gemv_mx_launch.h (streaming configurations, register kernel).
  if (kernel->substr(0, 4) != "gemv") return;
  for (GemvKernel v : kGemvKernels) {
    auto dy2 = test::poisoned<uint16_t>(static_cast<size_t>(c.m * c.n));
    ASSERT_TRUE(dy2);
    std::swap(*dy, *dy2);
    set_gemv_kernel(v);
    const Status st2 = linear(**ctx, w, dx->as<uint16_t>(), c.m, dy->as<uint16_t>(), nullptr);
    set_gemv_kernel(GemvKernel::kAuto);
    ASSERT_TRUE(st2) << st2.error().message;
    check(gemv_kernel_name(v));
  }
}

std::vector<LinearCase> linear_cases() {
  std::vector<LinearCase> cases;
  const int64_t ms[] = {1, 3, 8, 16, 17, 24, 32, 33, 128, 512};
  for (int64_t m : ms) {
    cases.push_back({Format::kBF16, m, 77, 130});
    cases.push_back({Format::kBF16, m, 256, 4096});
    for (Format f : {Format::kMXFP8, Format::kMXFP4}) {
      cases.push_back({f, m, 75, 320});
      cases.push_back({f, m, 264, 800});
      cases.push_back({f, m, 1000, 1024});
    }
    // FP8-B128: K with a short last block (784 = 6·128 + 16, 400 = 3·128 + 16), N not a multiple of 128 or
    // 16 (200), and a Qwen3-30B-A3B expert shape.
    cases.push_back({Format::kFP8_B128, m, 200, 784});
    cases.push_back({Format::kFP8_B128, m, 264, 400});
    cases.push_back({Format::kFP8_B128, m, 1536, 2048});
    cases.push_back({Format::kFP8_B128, m, 1000, 768});  // K % 64 == 0: the streaming GEMV
  }
  cases.push_back({Format::kFP8_B128, 4, 4096, 4096});
  cases.push_back({Format::kFP8_B128, 64, 2048, 768});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Table, Linear, ::testing::ValuesIn(linear_cases()), [](const auto& info) {
  const LinearCase& c = info.param;
  std::string name(traits(c.format).name);
  for (char& ch : name)
    if (ch == '-') ch = '_';
  return name + "_m" + std::to_string(c.m) + "_n" + std::to_string(c.n) + "_k" + std::to_string(c.k);
});

// The FP8-B128 GEMV called directly at M 17..32 (sm_80's table serves those M with it; sm_90a's takes
// cuBLASLt), ragged N, K with and without a tail group, both loop bodies; against the CPU linear.
class GemvFp8B128Direct : public ::testing::TestWithParam<LinearCase> {};

TEST_P(GemvFp8B128Direct, MatchesCpuTwin) {
  const LinearCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<int64_t> shape = {c.n, c.k};
  auto g = tensor_geometry("w", c.format, shape);
  ASSERT_TRUE(g) << g.error().message;
  const HostPlanes canonical = random_planes(rng, c.format, c.n, c.k);
  auto native = linear_prepare(c.format, Arch::kSm80, *g, canonical);
  ASSERT_TRUE(native) << native.error().message;
  const std::vector<uint16_t> x = test::random_bf16(rng, static_cast<size_t>(c.m * c.k));
  std::vector<float> xf(x.size()), yref(static_cast<size_t>(c.m * c.n));
  for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_f32(x[i]);
  const WeightView view{c.format, c.n, c.k, canonical.values.data(), canonical.scales.data()};
  ASSERT_TRUE(mxq::linear(xf.data(), c.m, view, nullptr, yref.data()));
  const std::vector<double> ref(yref.begin(), yref.end());
  auto dx = test::upload(x);
  auto dv = test::upload(native->values);
  auto ds = test::upload(native->scales);
  ASSERT_TRUE(dx && dv && ds);
  for (GemvKernel v : {GemvKernel::kAuto, GemvKernel::kRegisterStep}) {
    SCOPED_TRACE(gemv_kernel_name(v));
    auto dy = test::poisoned<uint16_t>(static_cast<size_t>(c.m * c.n));
    ASSERT_TRUE(dy);
    set_gemv_kernel(v);
    const Status st = gemv_fp8_b128(dx->as<uint16_t>(), c.m, {dv->as<uint8_t>(), ds->as<float>(), c.n, c.k},
                                    dy->as<uint16_t>(), nullptr);
    set_gemv_kernel(GemvKernel::kAuto);
    ASSERT_TRUE(st) << st.error().message;
    auto y = test::download<uint16_t>(*dy, static_cast<size_t>(c.m * c.n));
    ASSERT_TRUE(y) << y.error().message;
    std::vector<float> out(y->size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32((*y)[i]);
    EXPECT_LE(test::nmse(out, ref), traits(c.format).nmse_tolerance)
        << "NaN means an output was left unwritten";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvFp8B128Direct,
                         ::testing::Values(LinearCase{Format::kFP8_B128, 1, 200, 784},
                                           LinearCase{Format::kFP8_B128, 5, 1000, 768},
                                           LinearCase{Format::kFP8_B128, 17, 200, 784},
                                           LinearCase{Format::kFP8_B128, 24, 1000, 768},
                                           LinearCase{Format::kFP8_B128, 32, 264, 400},
                                           LinearCase{Format::kFP8_B128, 32, 2048, 4096}),
                         [](const auto& info) {
                           return "m" + std::to_string(info.param.m) + "_n" + std::to_string(info.param.n) +
                                  "_k" + std::to_string(info.param.k);
                         });

struct SupportCase {
  const char* what;
  Format format;
  Arch arch;
  int64_t n, k, max_m;
  const char* expect;  // "" = supported
};
void PrintTo(const SupportCase& c, std::ostream* os) { *os << c.what; }

class LinearSupport : public ::testing::TestWithParam<SupportCase> {};

TEST_P(LinearSupport, RefusesByFormatArchAndTensor) {  // covers N-13
  const SupportCase c = GetParam();
  const std::string tensor = "model.layers.3.mlp.down_proj.weight";
  const Status st = check_linear_supported(c.format, c.arch, tensor, c.n, c.k, c.max_m);
  if (std::string_view(c.expect).empty()) {
    EXPECT_TRUE(st) << st.error().message;
    return;
  }
  ASSERT_FALSE(st);
  const std::string& msg = st.error().message;
  for (std::string_view part :
       {std::string_view(tensor), traits(c.format).name, arch_name(c.arch), std::string_view(c.expect)})
    EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LinearSupport,
    ::testing::Values(
        SupportCase{"fp8_sm90_prefill", Format::kFP8_B128, Arch::kSm90a, 4096, 4096, 4096, ""},
        SupportCase{"mxfp8_decode_only", Format::kMXFP8, Arch::kSm90a, 4096, 12288, 32, ""},
        SupportCase{"bf16_sm80", Format::kBF16, Arch::kSm80, 77, 130, 4096, ""},
        SupportCase{"mxfp8_prefill", Format::kMXFP8, Arch::kSm90a, 4096, 12288, 512, ""},
        SupportCase{"mxfp4_prefill_sm80", Format::kMXFP4, Arch::kSm80, 4096, 4096, 17, ""},
        SupportCase{"mxfp4_prefill_k48", Format::kMXFP4, Arch::kSm90a, 64, 48, 4096, "multiple of 32"},
        SupportCase{"fp8_sm80_prefill", Format::kFP8_B128, Arch::kSm80, 4096, 4096, 64, "for M = 33"},
        SupportCase{"fp8_ragged_n", Format::kFP8_B128, Arch::kSm90a, 100, 768, 64, "multiple of 8"},
        SupportCase{"fp8_ragged_k", Format::kFP8_B128, Arch::kSm90a, 128, 100, 1, "multiple of 16"},
        SupportCase{"mxfp8_k48", Format::kMXFP8, Arch::kSm90a, 64, 48, 1, "multiple of 32"},
        SupportCase{"e4m3_plain", Format::kE4M3, Arch::kSm90a, 64, 64, 1, "no e4m3 linear kernel"}),
    [](const auto& info) { return std::string(info.param.what); });

// Each format's native layout, learned by probing linear_prepare: a byte permutation (plus padding) of the
// canonical planes; the FP8-B128 scales land where gemm_fp8_b128_cublaslt.h's offset function says.
struct PrepareCase {
  Format format;
  std::vector<int64_t> shape;
};
void PrintTo(const PrepareCase& c, std::ostream* os) {
  *os << traits(c.format).name << " rank " << c.shape.size();
}

class LinearPrepare : public ::testing::TestWithParam<PrepareCase> {};

TEST_P(LinearPrepare, ProbesAsPermutation) {
  const PrepareCase c = GetParam();
  auto g = tensor_geometry("w", c.format, c.shape);
  ASSERT_TRUE(g) << g.error().message;
  const TensorGeometry geometry = *g;
  auto layout = probe_layout("w", linear_layout_name(c.format), c.format, c.shape, [&](const HostPlanes& in) {
    return linear_prepare(c.format, Arch::kSm90a, geometry, in);
  });
  ASSERT_TRUE(layout) << layout.error().message;
  if (c.format != Format::kFP8_B128) return;
  const int64_t n = geometry.rows, k = geometry.cols, sr = cdiv(n, 128), sc = cdiv(k, 128);
  const int64_t per_expert = fp8_b128_scale_floats(n, k);
  for (int64_t e = 0; e < geometry.experts; ++e)
    for (int64_t nb = 0; nb < sr; ++nb)
      for (int64_t kb = 0; kb < sc; ++kb)
        for (int64_t j = 0; j < 4; ++j)
          ASSERT_EQ(layout->scales.native_offset(e * sr + nb, kb * 4 + j),
                    (e * per_expert + fp8_b128_scale_offset(nb, kb, n, k)) * 4 + j)
              << "expert " << e << " block (" << nb << ", " << kb << ")";
}

INSTANTIATE_TEST_SUITE_P(Formats, LinearPrepare,
                         ::testing::Values(PrepareCase{Format::kBF16, {40, 72}},
                                           PrepareCase{Format::kMXFP8, {75, 320}},
                                           PrepareCase{Format::kMXFP4, {33, 160}},
                                           PrepareCase{Format::kFP8_B128, {300, 784}},
                                           PrepareCase{Format::kFP8_B128, {2, 136, 400}}));

}  // namespace
}  // namespace mxq::cuda
