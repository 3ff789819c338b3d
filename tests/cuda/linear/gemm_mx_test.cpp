// GPU GEMM (MXFP8 / MXFP4 weight-only, large M) against the CPU twin (mxq::linear on the canonical planes,
// f32 accumulation) and an f64 reference, on fresh random codes, scales and activations at ragged N and K
// (every layout tail), M from 1 to 4096, through both kernels (wgmma on sm_90a, the portable mma.sync one),
// with extreme scale bytes (0, 1, 2, 253, 254, 255) per row, against the GEMV for M <= 16, and refusals by
// name.
#include "cuda/linear/gemm_mx.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../gpu_test_util.h"
#include "cpu/linear.h"
#include "cuda/linear/gemm_mx_launch.h"
#include "cuda/linear/gemv_layout.h"
#include "format/codec.h"

namespace mxq::cuda {
namespace {

// Canonical weights, their native values plane and the activations of one case.
struct Problem {
  Format format;
  int64_t m, n, k;
  std::vector<uint8_t> values, native, scales;
  std::vector<uint16_t> x;
};

Problem make_problem(std::mt19937_64& rng, Format f, int64_t m, int64_t n, int64_t k, int scale_lo,
                     int scale_hi, int x_lo = -6, int x_hi = 2) {
  Problem p{f, m, n, k, {}, {}, {}, {}};
  const bool fp8 = f == Format::kMXFP8;
  p.values.resize(static_cast<size_t>(values_bytes(f, n, k)));
  p.scales.resize(static_cast<size_t>(scales_bytes(f, n, k)));
  std::uniform_int_distribution<int> byte_dist(0, 255), scale_dist(scale_lo, scale_hi);
  for (auto& v : p.values) {
    do v = static_cast<uint8_t>(byte_dist(rng));
    while (fp8 && (v & 0x7F) == 0x7F);  // note: E4M3 NaN codes are not weights
  }
  for (auto& s : p.scales) s = static_cast<uint8_t>(scale_dist(rng));
  p.x = test::random_bf16(rng, static_cast<size_t>(m * k), x_lo, x_hi);
  p.native.resize(p.values.size());
  EXPECT_TRUE(prepare_gemv_values(f, p.values.data(), p.native.data(), n, k));
  return p;
}

// y = x · W^T in f64 from codec.h's exact decoders (no overflow or underflow at any scale byte).
std::vector<double> f64_reference(const Problem& p) {
  const bool fp8 = p.format == Format::kMXFP8;
  std::vector<double> w(static_cast<size_t>(p.n * p.k));
  for (int64_t r = 0; r < p.n; ++r)
    for (int64_t k = 0; k < p.k; ++k) {
      const size_t i = static_cast<size_t>(r * p.k + k);
      const double code =
          fp8 ? e4m3_to_f32(p.values[i]) : e2m1_to_f32((p.values[i / 2] >> (4 * (i % 2))) & 0xF);
      const int b = p.scales[static_cast<size_t>(r * (p.k / 32) + k / 32)];
      w[i] = b == 255 ? NAN : std::ldexp(code, b - 127);
    }
  std::vector<double> ref(static_cast<size_t>(p.m * p.n));
  for (int64_t mi = 0; mi < p.m; ++mi)
    for (int64_t r = 0; r < p.n; ++r) {
      double s = 0;
      for (int64_t k = 0; k < p.k; ++k)
        s += bf16_to_f32(p.x[static_cast<size_t>(mi * p.k + k)]) * w[static_cast<size_t>(r * p.k + k)];
      ref[static_cast<size_t>(mi * p.n + r)] = s;
    }
  return ref;
}

enum class Kernel { kGemmAuto, kGemmSplitK, kGemmPortable, kGemv };

// Runs one kernel on the problem with a poisoned output; returns y as floats.
Result<std::vector<float>> run_gpu(const Problem& p, Kernel kernel) {
  auto dx = test::upload(p.x);
  auto dv = test::upload(p.native);
  auto ds = test::upload(p.scales);
  auto dy = test::poisoned<uint16_t>(static_cast<size_t>(p.m * p.n));
  if (!dx || !dv || !ds || !dy) return fail("gemm test: device allocation failed");
  const MxGemvWeights w{p.format, dv->as<uint8_t>(), ds->as<uint8_t>(), p.n, p.k};
  const bool fp8 = p.format == Format::kMXFP8;
  const uint16_t* x = dx->as<uint16_t>();
  uint16_t* y = dy->as<uint16_t>();
  if (kernel == Kernel::kGemmAuto) {
    if (Status st = fp8 ? gemm_mxfp8(x, p.m, w, y, nullptr) : gemm_mxfp4(x, p.m, w, y, nullptr); !st)
      return tl::unexpected(st.error());
  } else if (kernel == Kernel::kGemmSplitK) {
    // note: the scratch is poisoned too (NaN), so a partial a split failed to write shows as NaN in y.
    auto ws = test::poisoned<float>(static_cast<size_t>(kGemmSplitKFloats));
    if (!ws) return fail("gemm test: device allocation failed");
    const std::span<float> splitk{ws->as<float>(), static_cast<size_t>(kGemmSplitKFloats)};
    if (Status st =
            fp8 ? gemm_mxfp8(x, p.m, w, y, nullptr, splitk) : gemm_mxfp4(x, p.m, w, y, nullptr, splitk);
        !st)
      return tl::unexpected(st.error());
    MXQ_CUDA_CHECK(cudaDeviceSynchronize());
  } else if (kernel == Kernel::kGemv) {
    if (Status st = fp8 ? gemv_mxfp8(x, p.m, w, y, nullptr) : gemv_mxfp4(x, p.m, w, y, nullptr); !st)
      return tl::unexpected(st.error());
  } else {
    const auto launch = fp8 ? launch_gemm_mxfp8 : launch_gemm_mxfp4;
    MXQ_CUDA_CHECK(launch(x, static_cast<int>(p.m), w.values, w.scales, y, static_cast<int>(p.n),
                          static_cast<int>(p.k), GemmPath::kPortable, nullptr, 0, nullptr));
  }
  MXQ_CUDA_CHECK(cudaGetLastError());
  auto yh = test::download<uint16_t>(*dy, static_cast<size_t>(p.m * p.n));
  if (!yh) return tl::unexpected(yh.error());
  std::vector<float> out(yh->size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32((*yh)[i]);
  return out;
}

struct GemmCase {
  Format format;
  int64_t m, n, k;
};
void PrintTo(const GemmCase& c, std::ostream* os) {
  *os << traits(c.format).name << " m=" << c.m << " n=" << c.n << " k=" << c.k;
}

class GemmMx : public ::testing::TestWithParam<GemmCase> {};

// Both kernels against the CPU twin (f32) and the f64 reference, realistic scale bytes.
TEST_P(GemmMx, MatchesCpuLinear) {
  const GemmCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const Problem p = make_problem(rng, c.format, c.m, c.n, c.k, 100, 140);
  std::vector<float> xf(p.x.size()), twin(static_cast<size_t>(c.m * c.n));
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf16_to_f32(p.x[i]);
  const WeightView view{c.format, c.n, c.k, p.values.data(), p.scales.data()};
  ASSERT_TRUE(linear(xf.data(), c.m, view, nullptr, twin.data()));
  const std::vector<double> ref = f64_reference(p);
  std::vector<double> twin_d(twin.begin(), twin.end());
  const double tol = traits(c.format).nmse_tolerance;
  for (Kernel kernel : {Kernel::kGemmAuto, Kernel::kGemmSplitK, Kernel::kGemmPortable}) {
    SCOPED_TRACE(kernel == Kernel::kGemmAuto     ? "auto kernel"
                 : kernel == Kernel::kGemmSplitK ? "auto kernel, split-K scratch"
                                                 : "portable kernel");
    auto y = run_gpu(p, kernel);
    ASSERT_TRUE(y) << y.error().message;
    EXPECT_LE(test::nmse(*y, twin_d), tol) << "vs CPU linear; NaN means an output was left unwritten";
    EXPECT_LE(test::nmse(*y, ref), tol) << "vs f64";
  }
}

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> cases;
  for (Format f : {Format::kMXFP8, Format::kMXFP4}) {
    // K: 416 = an MXFP8 tail of 32 and an MXFP4 tail of 32; 224, 320: MXFP4 tails of 96 and 64; N ragged.
    // On sm_90a without a split, N % 8 == 0 (200, 496, 4096, 4000, 1000 below) takes the staged 16-byte-store
    // epilogue (partial N and M tiles included), the other N the 2-byte register stores.
    const int64_t ks[] = {416, 224, 320, 1024, 416, 224, 320, 256, 160};
    const int64_t ms[] = {17, 31, 64, 100, 128, 257, 512, 1000, 4096};
    for (size_t i = 0; i < std::size(ms); ++i)
      cases.push_back({f, ms[i], 200 + 37 * static_cast<int64_t>(i), ks[i]});
    cases.push_back({f, 300, 1, 64});      // one weight row
    cases.push_back({f, 33, 4096, 4096});  // a Qwen3 shape, several N tiles and stages
    cases.push_back({f, 600, 129, 2048});  // one row past a tile in N, 3 tiles in M
    // Shapes where the sm_90a kernel picks 256-row activation tiles on 132 SMs (96 tiles, one wave, vs 144
    // 128-row tiles, two), with and without a K tail; the cases above run its 128-row tiles.
    cases.push_back({f, 300, 6100, 96});
    cases.push_back({f, 300, 6100, 128});
    // 256-row tiles past one wave (256 tiles on 132 SMs, ragged M and N, 8 stages): a persistent grid walks
    // 2 tiles a block.
    cases.push_back({f, 2000, 4000, 512});
    // Split-K on sm_90a (with scratch): few tiles and long K. 3 tiles x 8 splits of 4 stages; 8 tiles x 4
    // splits of 5, 5, 5, 2 stages with a K tail (MXFP8 32, MXFP4 32); 2 tiles, M = 5; 32 tiles x 4 splits.
    cases.push_back({f, 17, 300, 2048});
    cases.push_back({f, 100, 1000, 1056});
    cases.push_back({f, 5, 129, 3072});
    cases.push_back({f, 64, 4096, 4096});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmMx, ::testing::ValuesIn(gemm_cases()), [](const auto& info) {
  const GemmCase& c = info.param;
  return std::string(traits(c.format).name) + "_m" + std::to_string(c.m) + "_n" + std::to_string(c.n) + "_k" +
         std::to_string(c.k);
});

// Per weight row, ‖out − ref‖² / ‖ref‖² over m (so small rows are not hidden by large ones).
void expect_rows_close(const std::vector<float>& y, const std::vector<double>& ref, int64_t m, int64_t n,
                       double tol, const char* what) {
  for (int64_t r = 0; r < n; ++r) {
    double num = 0, den = 0;
    bool nan = false;
    for (int64_t i = 0; i < m; ++i) {
      const size_t at = static_cast<size_t>(i * n + r);
      nan |= std::isnan(y[at]);
      num += (y[at] - ref[at]) * (y[at] - ref[at]);
      den += ref[at] * ref[at];
    }
    ASSERT_FALSE(nan) << what << ": row " << r << " has NaN";
    ASSERT_LE(num / den, tol) << what << ": row " << r;
  }
}

struct ExtremeCase {
  const char* what;
  Format format;
  int scale_lo, scale_hi;  // the range each row's bytes are drawn from
  int x_lo, x_hi;          // activation exponents
};
void PrintTo(const ExtremeCase& c, std::ostream* os) { *os << c.what << " " << traits(c.format).name; }

class GemmMxExtreme : public ::testing::TestWithParam<ExtremeCase> {};

// Scale bytes at the edges of E8M0 (0, 1, 2 and 252-254), alone or mixed with middle bytes in one row:
// every row must match the f64 product, which the kernel's row-relative fold keeps exact.
TEST_P(GemmMxExtreme, RowsMatchF64) {
  const ExtremeCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t m = 40, n = 150, k = 352;
  Problem p = make_problem(rng, c.format, m, n, k, c.scale_lo, c.scale_hi, c.x_lo, c.x_hi);
  const std::vector<double> ref = f64_reference(p);
  for (Kernel kernel : {Kernel::kGemmAuto, Kernel::kGemmPortable}) {
    auto y = run_gpu(p, kernel);
    ASSERT_TRUE(y) << y.error().message;
    expect_rows_close(*y, ref, m, n, traits(c.format).nmse_tolerance,
                      kernel == Kernel::kGemmAuto ? "auto kernel" : "portable kernel");
  }
}

// Each block's byte is drawn from the case's range: only edge bytes ("tiny", "huge") or edge bytes mixed
// with bytes up to 20 above or below them in one row ("_mixed"); x is scaled so the huge rows stay finite.
INSTANTIATE_TEST_SUITE_P(Scales, GemmMxExtreme,
                         ::testing::Values(ExtremeCase{"tiny", Format::kMXFP8, 0, 2, -6, 2},
                                           ExtremeCase{"tiny", Format::kMXFP4, 0, 2, -6, 2},
                                           ExtremeCase{"small_mixed", Format::kMXFP8, 0, 20, -6, 2},
                                           ExtremeCase{"small_mixed", Format::kMXFP4, 0, 20, -6, 2},
                                           ExtremeCase{"huge", Format::kMXFP8, 252, 254, -30, -24},
                                           ExtremeCase{"huge", Format::kMXFP4, 252, 254, -30, -24},
                                           ExtremeCase{"huge_mixed", Format::kMXFP8, 234, 254, -30, -24},
                                           ExtremeCase{"huge_mixed", Format::kMXFP4, 234, 254, -30, -24}),
                         [](const auto& info) {
                           return std::string(info.param.what) + "_" +
                                  std::string(traits(info.param.format).name);
                         });

// A NaN scale byte (255) makes its row NaN and leaves the others finite.
TEST(GemmMxNanScale, PoisonsOnlyItsRow) {
  std::mt19937_64 rng(test::fresh_seed());
  for (Format f : {Format::kMXFP8, Format::kMXFP4}) {
    Problem p = make_problem(rng, f, 20, 40, 128, 110, 130);
    p.scales[static_cast<size_t>(7 * (p.k / 32) + 2)] = 255;  // row 7, block 2
    for (Kernel kernel : {Kernel::kGemmAuto, Kernel::kGemmPortable}) {
      auto y = run_gpu(p, kernel);
      ASSERT_TRUE(y) << y.error().message;
      for (int64_t i = 0; i < p.m; ++i)
        for (int64_t r = 0; r < p.n; ++r)
          EXPECT_EQ(std::isnan((*y)[static_cast<size_t>(i * p.n + r)]), r == 7) << "m " << i << " row " << r;
    }
  }
}

// For M <= 16 the GEMV and the GEMM compute the same product (different summation orders: tolerance).
TEST(GemmMxVsGemv, AgreeOnSmallM) {
  std::mt19937_64 rng(test::fresh_seed());
  for (Format f : {Format::kMXFP8, Format::kMXFP4})
    for (int64_t m : {1, 8, 16}) {
      SCOPED_TRACE(std::string(traits(f).name) + " m=" + std::to_string(m));
      const Problem p = make_problem(rng, f, m, 300, 1056, 110, 130);
      auto gemv = run_gpu(p, Kernel::kGemv);
      auto gemm = run_gpu(p, Kernel::kGemmAuto);
      ASSERT_TRUE(gemv && gemm);
      EXPECT_LE(test::nmse(*gemm, std::vector<double>(gemv->begin(), gemv->end())), traits(f).nmse_tolerance);
    }
}

struct RefusalCase {
  const char* what;
  int64_t m, k;
  Format weights;
  bool null_x, misaligned_x;
  const char* expect;
};
void PrintTo(const RefusalCase& c, std::ostream* os) { *os << c.what; }

class GemmMxRefuses : public ::testing::TestWithParam<RefusalCase> {};

TEST_P(GemmMxRefuses, ByName) {
  const RefusalCase c = GetParam();
  alignas(16) uint8_t dummy[32] = {};
  uint16_t out = 0;
  const MxGemvWeights w{c.weights, dummy, dummy, 8, c.k};
  const uint16_t* x =
      c.null_x ? nullptr : reinterpret_cast<const uint16_t*>(dummy + (c.misaligned_x ? 2 : 0));
  const Status st = c.weights == Format::kMXFP4 && c.what != std::string("wrong_format")
                        ? gemm_mxfp4(x, c.m, w, &out, nullptr)
                        : gemm_mxfp8(x, c.m, w, &out, nullptr);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find(c.expect), std::string::npos) << st.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GemmMxRefuses,
    ::testing::Values(RefusalCase{"m0", 0, 64, Format::kMXFP8, false, false, "m = 0"},
                      RefusalCase{"m_negative", -3, 64, Format::kMXFP4, false, false, "m = -3"},
                      RefusalCase{"k48", 20, 48, Format::kMXFP8, false, false, "[8, 48]"},
                      RefusalCase{"k0", 20, 0, Format::kMXFP4, false, false, "[8, 0]"},
                      RefusalCase{"null_x", 20, 64, Format::kMXFP8, true, false, "null device pointer"},
                      RefusalCase{"misaligned_x", 20, 64, Format::kMXFP8, false, true, "16-byte aligned"},
                      RefusalCase{"wrong_format", 20, 64, Format::kMXFP4, false, false, "weights are mxfp4"}),
    [](const auto& info) { return std::string(info.param.what); });

}  // namespace
}  // namespace mxq::cuda
