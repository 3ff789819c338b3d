// GPU GEMV (MXFP8 / MXFP4 weight-only) against an f64 reference built from codec.h's exact decoders, on fresh
// random codes, scales and activations at ragged N, K with and without a short layout group, and M = 1..32.
// Every case runs each kernel variant of gemv_mx_launch.h (per-group loop, step body, persistent blocks,
// shared-memory ring); the persistent variants must equal their one-tile-per-block twins bit for bit, and the
// ring variants the step body.
#include "cuda/linear/gemv_mx.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include "../gpu_test_util.h"
#include "cuda/linear/gemv_layout.h"
#include "cuda/linear/gemv_mx_launch.h"
#include "format/codec.h"

namespace mxq::cuda {
namespace {

struct GemvCase {
  Format format;
  int64_t m, n, k;
  int x_lo = -6, x_hi = 2;  // activations' exponent range, |x| in [2^x_lo, 2^x_hi)
};
void PrintTo(const GemvCase& c, std::ostream* os) {
  *os << traits(c.format).name << " m=" << c.m << " n=" << c.n << " k=" << c.k << " |x| in [2^" << c.x_lo
      << ", 2^" << c.x_hi << ")";
}

class GemvMx : public ::testing::TestWithParam<GemvCase> {};

TEST_P(GemvMx, MatchesF64ReferenceOnDequantizedWeights) {
  const GemvCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const bool fp8 = c.format == Format::kMXFP8;
  const int64_t vbytes = values_bytes(c.format, c.n, c.k), sbytes = scales_bytes(c.format, c.n, c.k);
  std::vector<uint8_t> values(static_cast<size_t>(vbytes)), scales(static_cast<size_t>(sbytes));
  std::uniform_int_distribution<int> byte_dist(0, 255), scale_dist(100, 140);
  for (auto& v : values) {
    do v = static_cast<uint8_t>(byte_dist(rng));
    while (fp8 && (v & 0x7F) == 0x7F);  // note: E4M3 NaN codes are not weights
  }
  for (auto& s : scales) s = static_cast<uint8_t>(scale_dist(rng));
  const std::vector<uint16_t> x = test::random_bf16(rng, static_cast<size_t>(c.m * c.k), c.x_lo, c.x_hi);

  // Reference: y[m][n] = sum_k x[m][k] * code(n,k) * 2^(b-127), in f64.
  std::vector<double> w(static_cast<size_t>(c.n * c.k));
  for (int64_t r = 0; r < c.n; ++r)
    for (int64_t k = 0; k < c.k; ++k) {
      const size_t i = static_cast<size_t>(r * c.k + k);
      const float code = fp8 ? e4m3_to_f32(values[i]) : e2m1_to_f32((values[i / 2] >> (4 * (i % 2))) & 0xF);
      w[i] = static_cast<double>(code) * e8m0_to_f32(scales[static_cast<size_t>(r * (c.k / 32) + k / 32)]);
    }
  std::vector<double> ref(static_cast<size_t>(c.m * c.n), 0.0);
  for (int64_t mi = 0; mi < c.m; ++mi)
    for (int64_t r = 0; r < c.n; ++r) {
      double s = 0;
      for (int64_t k = 0; k < c.k; ++k)
        s += bf16_to_f32(x[static_cast<size_t>(mi * c.k + k)]) * w[static_cast<size_t>(r * c.k + k)];
      ref[static_cast<size_t>(mi * c.n + r)] = s;
    }

  std::vector<uint8_t> native(values.size());
  ASSERT_TRUE(prepare_gemv_values(c.format, values.data(), native.data(), c.n, c.k));
  auto dx = test::upload(x);
  auto dv = test::upload(native);
  auto ds = test::upload(scales);
  ASSERT_TRUE(dx && dv && ds);
  const MxGemvWeights wt{c.format, dv->as<uint8_t>(), ds->as<uint8_t>(), c.n, c.k};
  std::vector<std::vector<uint16_t>> outs;  // per kGemvKernels entry
  for (GemvKernel kernel : kGemvKernels) {
    SCOPED_TRACE(std::string("kernel ") + gemv_kernel_name(kernel));
    auto dy = test::poisoned<uint16_t>(static_cast<size_t>(c.m * c.n));
    ASSERT_TRUE(dy);
    set_gemv_kernel(kernel);
    const Status st = fp8 ? gemv_mxfp8(dx->as<uint16_t>(), c.m, wt, dy->as<uint16_t>(), nullptr)
                          : gemv_mxfp4(dx->as<uint16_t>(), c.m, wt, dy->as<uint16_t>(), nullptr);
    set_gemv_kernel(GemvKernel::kAuto);
    ASSERT_TRUE(st) << st.error().message;
    auto y = test::download<uint16_t>(*dy, static_cast<size_t>(c.m * c.n));
    ASSERT_TRUE(y) << y.error().message;
    std::vector<float> out(y->size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32((*y)[i]);
    const double err = test::nmse(out, ref);
    EXPECT_LE(err, traits(c.format).nmse_tolerance) << "NaN means an output was left unwritten";
    outs.push_back(std::move(*y));
  }
  // Persistent blocks change which block runs a tile, not what it computes: bitwise the one-tile-per-block
  // kernel with the same loop body (MXFP8: kAuto takes the step body; MXFP4: kAuto the per-group loop, at
  // m = 1 the ring kernel's step body, which gives the loop's bits: both scale paths make the same f32).
  auto out_of = [&](GemvKernel k) -> const std::vector<uint16_t>& {
    return outs[static_cast<size_t>(std::find(std::begin(kGemvKernels), std::end(kGemvKernels), k) -
                                    std::begin(kGemvKernels))];
  };
  EXPECT_EQ(out_of(GemvKernel::kPersist), out_of(GemvKernel::kAuto));
  EXPECT_EQ(out_of(GemvKernel::kPersistStep), out_of(GemvKernel::kRegisterStep));
  // The ring kernel (gemv_mx_ring.cuh, where it fits; elsewhere the step body itself) keeps the step body's
  // K slices, vote and order of sums: bitwise equal.
  for (GemvKernel k : {GemvKernel::kRing, GemvKernel::kRingPersist, GemvKernel::kRingDeep})
    EXPECT_EQ(out_of(k), out_of(GemvKernel::kRegisterStep)) << gemv_kernel_name(k);
}

// The study trace (GemvTrace, gemv_mx_launch.h): with it set, the ring kernel writes one record per block
// (each block once, times in order, its grid) and y keeps its bits.
TEST(GemvMxTrace, RecordsEveryBlockAndKeepsTheBits) {
  for (Format f : {Format::kMXFP8, Format::kMXFP4}) {
    SCOPED_TRACE(traits(f).name);
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    constexpr int64_t kN = 300, kK = 1024, kTiles = (kN + 15) / 16;
    std::vector<uint8_t> values(static_cast<size_t>(values_bytes(f, kN, kK))),
        scales(static_cast<size_t>(scales_bytes(f, kN, kK)));
    for (auto& v : values) {
      do v = static_cast<uint8_t>(rng());
      while (f == Format::kMXFP8 && (v & 0x7F) == 0x7F);
    }
    for (auto& b : scales) b = static_cast<uint8_t>(110 + rng() % 20);
    std::vector<uint8_t> native(values.size());
    ASSERT_TRUE(prepare_gemv_values(f, values.data(), native.data(), kN, kK));
    auto dx = test::upload(test::random_bf16(rng, kK));
    auto dv = test::upload(native);
    auto ds = test::upload(scales);
    auto records = DeviceBuffer::alloc(kTiles * 2 * kGemvTraceWords * 8);
    auto count = test::upload(std::vector<unsigned int>{0});
    ASSERT_TRUE(dx && dv && ds && records && count);
    const MxGemvWeights wt{f, dv->as<uint8_t>(), ds->as<uint8_t>(), kN, kK};
    std::vector<uint16_t> outs[2];
    for (int traced = 0; traced < 2; ++traced) {
      auto dy = test::poisoned<uint16_t>(kN);
      ASSERT_TRUE(dy);
      set_gemv_kernel(GemvKernel::kRingDeep);
      if (traced)
        set_gemv_trace(
            {records->as<unsigned long long>(), count->as<unsigned int>(), static_cast<int>(2 * kTiles)});
      const Status st = f == Format::kMXFP8
                            ? gemv_mxfp8(dx->as<uint16_t>(), 1, wt, dy->as<uint16_t>(), nullptr)
                            : gemv_mxfp4(dx->as<uint16_t>(), 1, wt, dy->as<uint16_t>(), nullptr);
      set_gemv_trace({});
      set_gemv_kernel(GemvKernel::kAuto);
      ASSERT_TRUE(st) << st.error().message;
      auto y = test::download<uint16_t>(*dy, kN);
      ASSERT_TRUE(y);
      outs[traced] = std::move(*y);
    }
    EXPECT_EQ(outs[1], outs[0]);
    auto n = test::download<unsigned int>(*count, 1);
    auto words = test::download<unsigned long long>(*records, kTiles * kGemvTraceWords);
    ASSERT_TRUE(n && words);
    ASSERT_EQ((*n)[0], kTiles);  // note: 19 tiles, fewer than 2 blocks per SM: one block a tile
    std::vector<bool> seen(kTiles, false);
    for (int64_t i = 0; i < kTiles; ++i) {
      const unsigned long long* r = words->data() + i * kGemvTraceWords;
      EXPECT_LE(r[0], r[1]);
      EXPECT_LE(r[1], r[2]);
      EXPECT_LE(r[2], r[3]);
      EXPECT_EQ(r[5], static_cast<unsigned long long>(kTiles) | reinterpret_cast<uintptr_t>(dv->as<uint8_t>())
                                                                    << 32);
      const uint64_t id = r[4] >> 32;
      ASSERT_LT(id, static_cast<uint64_t>(kTiles));
      EXPECT_FALSE(seen[id]) << "block " << id << " recorded twice";
      seen[id] = true;
    }
  }
}

std::vector<GemvCase> gemv_cases() {
  std::vector<GemvCase> cases;
  for (Format f : {Format::kMXFP8, Format::kMXFP4}) {
    for (int64_t m = 1; m <= 32; ++m) {
      cases.push_back({f, m, 75, 320});  // 320: an MXFP4 tail group of 64 (register kernel)
      cases.push_back({f, m, 75, 384});  // streaming kernel
      // 512: whole warp steps (the ring kernel at m <= 8); 2 (MXFP8) or 1 (MXFP4) of the 8 warps have groups.
      if (m <= 8) cases.push_back({f, m, 75, 512});
    }
    // K: one block, the MXFP8 tail (96), every MXFP4 tail (160, 224, 4128), Qwen3 K sizes; N ragged.
    // K % 128 == 0 (128, 640, 768, 4096) streams; 640 and 768 leave some of the 8 warps without groups.
    for (int64_t k : {32, 96, 128, 160, 224, 640, 768, 4096, 4128}) cases.push_back({f, 3, 33, k});
    cases.push_back({f, 1, 1, 64});
    cases.push_back({f, 1, 4096, 4096});
    cases.push_back({f, 8, 1000, 12288});
    cases.push_back({f, 16, 257, 2048});
    cases.push_back({f, 32, 1000, 12288});
    cases.push_back({f, 24, 2049, 768});
    // Large ragged N with tails: the grid runs past one resident wave.
    cases.push_back({f, 3, 6144, 256});
    cases.push_back({f, 9, 12288, 160});
    cases.push_back({f, 1, 24577, 96});
    // More tiles than resident blocks: each streaming block walks several tiles, its ring crossing them.
    cases.push_back({f, 5, 24577, 256});
    cases.push_back({f, 32, 6151, 512});
    // More tiles (438) than the ring's persistent grids (3 or 2 blocks per SM on 132 SMs), whole warp steps.
    cases.push_back({f, 2, 7000, 4096});
    // Small and large activations (every x row tiny or huge): the decodes that leave values 2^-120 too small
    // (MXFP8 "bits") must not lose products below the f32 range, nor overflow.
    for (int64_t m : {1, 8, 17})
      for (auto [lo, hi] : {std::pair{-24, -16}, std::pair{-60, -40}, std::pair{40, 80}})
        cases.push_back({f, m, 300, 4096, lo, hi});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvMx, ::testing::ValuesIn(gemv_cases()), [](const auto& info) {
  const GemvCase& c = info.param;
  std::string name = std::string(traits(c.format).name) + "_m" + std::to_string(c.m) + "_n" +
                     std::to_string(c.n) + "_k" + std::to_string(c.k);
  if (c.x_lo != -6 || c.x_hi != 2)
    name += "_x" + std::string(c.x_lo < 0 ? "m" : "") + std::to_string(std::abs(c.x_lo)) + "to" +
            std::string(c.x_hi < 0 ? "m" : "") + std::to_string(std::abs(c.x_hi));
  return name;
});

// Every non-NaN code against every E8M0 range edge, bit-exact: row r holds code r / kScales in all K
// elements with scale byte kScaleBytes[r % kScales], every x = 1, so y = K · code · 2^(b-127) exactly (or
// inf) in every activation row. Rows of one 16-row tile mix small and large scale bytes. K = one group
// (register kernel) and K = 256 (streaming kernel); M = 1 and M = 32 (4 n-tiles); every kernel variant.
// Catches a decode that drops subnormal codes (E4M3 0x01..0x07 decode to bf16 subnormals in the folded
// path), a wrong sign or table entry, and a folded scale that overflows or flushes for small or large bytes.
constexpr uint8_t kScaleBytes[] = {0, 1, 7, 100, 127, 134, 135, 136, 200, 254};
constexpr int64_t kScales = std::size(kScaleBytes);

struct ExactCase {
  Format format;
  int64_t k, m;
};
void PrintTo(const ExactCase& c, std::ostream* os) {
  *os << traits(c.format).name << " k=" << c.k << " m=" << c.m;
}

class GemvMxExact : public ::testing::TestWithParam<ExactCase> {};

TEST_P(GemvMxExact, EveryCodeAndScaleEdge) {
  const auto [f, k, m] = GetParam();
  const bool fp8 = f == Format::kMXFP8;
  const int64_t codes = fp8 ? 256 : 16;
  const int64_t n = codes * kScales;
  std::vector<uint8_t> values(static_cast<size_t>(values_bytes(f, n, k))), scales;
  std::vector<double> ref(static_cast<size_t>(n));
  const int64_t row_bytes = values_bytes(f, 1, k);
  for (int64_t r = 0; r < n; ++r) {
    uint8_t code = static_cast<uint8_t>(r / kScales);
    if (fp8 && (code & 0x7F) == 0x7F) code = 0;  // note: E4M3 NaN codes are not weights
    const uint8_t b = kScaleBytes[r % kScales];
    for (int64_t i = 0; i < row_bytes; ++i)
      values[static_cast<size_t>(r * row_bytes + i)] = fp8 ? code : static_cast<uint8_t>(code | code << 4);
    for (int64_t i = 0; i < k / 32; ++i) scales.push_back(b);
    const double v = fp8 ? e4m3_to_f32(code) : e2m1_to_f32(code);
    ref[static_cast<size_t>(r)] = static_cast<double>(k) * v * e8m0_to_f32(b);
  }
  const std::vector<uint16_t> x(static_cast<size_t>(m * k), 0x3F80);  // bf16 1.0
  std::vector<uint8_t> native(values.size());
  ASSERT_TRUE(prepare_gemv_values(f, values.data(), native.data(), n, k));
  auto dx = test::upload(x);
  auto dv = test::upload(native);
  auto ds = test::upload(scales);
  ASSERT_TRUE(dx && dv && ds);
  const MxGemvWeights wt{f, dv->as<uint8_t>(), ds->as<uint8_t>(), n, k};
  for (GemvKernel kernel : kGemvKernels) {
    SCOPED_TRACE(std::string("kernel ") + gemv_kernel_name(kernel));
    auto dy = test::poisoned<uint16_t>(static_cast<size_t>(m * n));
    ASSERT_TRUE(dy);
    set_gemv_kernel(kernel);
    const Status st = fp8 ? gemv_mxfp8(dx->as<uint16_t>(), m, wt, dy->as<uint16_t>(), nullptr)
                          : gemv_mxfp4(dx->as<uint16_t>(), m, wt, dy->as<uint16_t>(), nullptr);
    set_gemv_kernel(GemvKernel::kAuto);
    ASSERT_TRUE(st) << st.error().message;
    auto y = test::download<uint16_t>(*dy, static_cast<size_t>(m * n));
    ASSERT_TRUE(y) << y.error().message;
    int bad = 0;
    for (int64_t mi = 0; mi < m; ++mi)
      for (int64_t r = 0; r < n; ++r) {
        // note: K · code · 2^(b-127) has at most 4 significant bits (K a power of two), so it is a bf16
        // (subnormal down to 2^-133) or overflows to inf; -0 codes may come back +0, which == accepts.
        const float want = static_cast<float>(ref[static_cast<size_t>(r)]);
        const float got = bf16_to_f32((*y)[static_cast<size_t>(mi * n + r)]);
        if (got == want || bad++ >= 8) continue;
        ADD_FAILURE() << "row " << mi << ": code 0x" << std::hex << r / kScales << std::dec << " scale byte "
                      << int{kScaleBytes[r % kScales]} << ": got " << got << ", want " << want;
      }
    EXPECT_EQ(bad, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, GemvMxExact,
    ::testing::Values(ExactCase{Format::kMXFP8, 64, 1}, ExactCase{Format::kMXFP8, 256, 1},
                      ExactCase{Format::kMXFP8, 256, 32}, ExactCase{Format::kMXFP8, 64, 17},
                      ExactCase{Format::kMXFP4, 128, 1}, ExactCase{Format::kMXFP4, 256, 1},
                      ExactCase{Format::kMXFP4, 256, 32}, ExactCase{Format::kMXFP4, 512, 1},
                      ExactCase{Format::kMXFP4, 512, 8}, ExactCase{Format::kMXFP8, 1024, 8}),
    [](const auto& info) {
      return std::string(traits(info.param.format).name) + "_k" + std::to_string(info.param.k) + "_m" +
             std::to_string(info.param.m);
    });

struct RefusalCase {
  const char* what;
  int64_t m, k;
  Format weights;
  const char* expect;
};
void PrintTo(const RefusalCase& c, std::ostream* os) { *os << c.what; }

class GemvMxRefuses : public ::testing::TestWithParam<RefusalCase> {};

TEST_P(GemvMxRefuses, ByName) {  // covers N-13
  const RefusalCase c = GetParam();
  const uint8_t dummy = 0;
  uint16_t out = 0;
  const MxGemvWeights w{c.weights, &dummy, &dummy, 8, c.k};
  const Status st = gemv_mxfp8(reinterpret_cast<const uint16_t*>(&dummy), c.m, w, &out, nullptr);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find(c.expect), std::string::npos) << st.error().message;
}

INSTANTIATE_TEST_SUITE_P(Cases, GemvMxRefuses,
                         ::testing::Values(RefusalCase{"m0", 0, 64, Format::kMXFP8, "m = 0"},
                                           RefusalCase{"m33", 33, 64, Format::kMXFP8, "m = 33"},
                                           RefusalCase{"k48", 1, 48, Format::kMXFP8, "[8, 48]"},
                                           RefusalCase{"wrong_format", 1, 64, Format::kMXFP4,
                                                       "weights are mxfp4"}),
                         [](const auto& info) { return std::string(info.param.what); });

}  // namespace
}  // namespace mxq::cuda
