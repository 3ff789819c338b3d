// GPU quantizers, bitwise against references written here from spec/formats.md: brute-force nearest-code
// encoders over codec.h's exact decoders (ties to the even code), and the scale rules through std::frexp.
#include "cuda/quantize/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "../gpu_test_util.h"
#include "cuda/common/pdl.h"
#include "cuda/quantize/quantize_launch.h"
#include "format/codec.h"
#include "format/quantize.h"

namespace mxq::cuda {
namespace {

// ---- references ---------------------------------------------------------------------------------------
uint8_t ref_e4m3(float v) {
  static const std::array<float, 0x7F> table = [] {
    std::array<float, 0x7F> t{};
    for (int c = 0; c < 0x7F; ++c) t[static_cast<size_t>(c)] = e4m3_to_f32(static_cast<uint8_t>(c));
    return t;
  }();
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const float a = std::fabs(v);
  if (a >= 448.0f) return sign | 0x7E;
  const auto hi = std::lower_bound(table.begin(), table.end(), a);
  int c = static_cast<int>(hi - table.begin());
  if (c > 0) {
    const float d_lo = a - table[static_cast<size_t>(c - 1)], d_hi = table[static_cast<size_t>(c)] - a;
    if (d_lo < d_hi || (d_lo == d_hi && (c - 1) % 2 == 0)) c -= 1;
  }
  return static_cast<uint8_t>(sign | c);
}

// Sign from the unscaled input `sign_src` (spec: a negative value that rounds to zero is code 8, -0 is 0).
uint8_t ref_e2m1(float v, float sign_src) {
  const float a = std::fabs(v);
  int best = 7;
  if (a < 6.0f) {
    best = 0;
    for (int c = 1; c < 8; ++c) {
      const float d = std::fabs(a - kE2M1Values[c]), db = std::fabs(a - kE2M1Values[best]);
      if (d < db || (d == db && c % 2 == 0)) best = c;
    }
  }
  return static_cast<uint8_t>(sign_src < 0.0f ? best | 8 : best);
}

int clamp_scale(int b) { return std::clamp(b, 0, 254); }

uint8_t ref_mxfp8_scale(float amax) {
  const float q = std::max(amax, FLT_MIN) / 448.0f;
  int e = 0;
  const float fr = std::frexp(q, &e);  // q = fr · 2^e, fr in [0.5, 1)
  return static_cast<uint8_t>(clamp_scale((fr == 0.5f ? e - 1 : e) + 127));
}

uint8_t ref_mxfp4_scale(float amax) {
  if (amax == 0.0f) return 0;
  int e = 0;
  const float m = 2.0f * std::frexp(amax, &e);  // amax = m · 2^(e-1), m in [1, 2)
  return static_cast<uint8_t>(clamp_scale(127 + (e - 1) - 2 + (m >= 1.75f ? 1 : 0)));
}

struct Planes {
  std::vector<uint8_t> values, scales;
};

Planes ref_quantize(Format f, const std::vector<uint16_t>& x, int64_t rows, int64_t cols) {
  Planes p{std::vector<uint8_t>(static_cast<size_t>(values_bytes(f, rows, cols)), 0),
           std::vector<uint8_t>(static_cast<size_t>(scales_bytes(f, rows, cols)), 0)};
  auto xf = [&](int64_t r, int64_t c) { return bf16_to_f32(x[static_cast<size_t>(r * cols + c)]); };
  if (f == Format::kFP8_B128) {
    const auto shape = scales_shape(f, rows, cols);
    for (int64_t br = 0; br < shape[0]; ++br)
      for (int64_t bc = 0; bc < shape[1]; ++bc) {
        float amax = 0.0f;
        for (int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r)
          for (int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c)
            amax = std::max(amax, std::fabs(xf(r, c)));
        // note: m = fl(fl(1 / amax') * 448), torch's evaluation of the reference's 448.0 / amax (formats.md)
        const float amax_c = std::max(amax, 1e-4f), factor = (1.0f / amax_c) * 448.0f,
                    scale = amax_c / 448.0f;
        std::memcpy(&p.scales[static_cast<size_t>((br * shape[1] + bc) * 4)], &scale, 4);
        for (int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r)
          for (int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c)
            p.values[static_cast<size_t>(r * cols + c)] = ref_e4m3(xf(r, c) * factor);
      }
    return p;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 32; ++b) {
      float amax = 0.0f;
      for (int64_t c = b * 32; c < b * 32 + 32; ++c) amax = std::max(amax, std::fabs(xf(r, c)));
      const uint8_t s = f == Format::kMXFP8 ? ref_mxfp8_scale(amax) : ref_mxfp4_scale(amax);
      p.scales[static_cast<size_t>(r * (cols / 32) + b)] = s;
      const float factor = std::ldexp(1.0f, 127 - s);
      for (int64_t c = b * 32; c < b * 32 + 32; ++c) {
        const size_t i = static_cast<size_t>(r * cols + c);
        if (f == Format::kMXFP8)
          p.values[i] = ref_e4m3(xf(r, c) * factor);
        else
          p.values[i / 2] |= static_cast<uint8_t>(ref_e2m1(xf(r, c) * factor, xf(r, c)) << (4 * (i % 2)));
      }
    }
  return p;
}

// Random bf16 with a regime per 32-run: ordinary, huge, tiny (bf16 subnormals too), signed zeros, or
// values built to land on encoder ties (few mantissa bits set).
std::vector<uint16_t> regime_bf16(std::mt19937_64& rng, size_t count) {
  std::vector<uint16_t> v(count);
  std::uniform_int_distribution<int> regime_dist(0, 9), bit(0, 1), man(0, 127), few(0, 7);
  for (size_t run = 0; run < count; run += 32) {
    const int regime = regime_dist(rng);
    int lo = 119, hi = 135;  // note: biased exponent fields; 127 = 2^0
    if (regime == 7) lo = 200, hi = 254;
    if (regime == 8) lo = 0, hi = 8;
    for (size_t i = run; i < std::min(count, run + 32); ++i) {
      std::uniform_int_distribution<int> exp_dist(lo, hi);
      const int mant = regime == 6 ? few(rng) << 4 : man(rng);
      v[i] = regime == 9 ? static_cast<uint16_t>(bit(rng) << 15)
                         : static_cast<uint16_t>(bit(rng) << 15 | exp_dist(rng) << 7 | mant);
    }
  }
  return v;
}

// Runs the GPU quantizer on x [rows, cols] (poisoned outputs) and expects `want`'s planes byte for byte; a
// values mismatch names the input pair and the block's first element.
void expect_gpu_planes(Format f, const std::vector<uint16_t>& x, int64_t rows, int64_t cols,
                       const Planes& want) {
  auto dx = test::upload(x);
  auto dv = test::poisoned<uint8_t>(want.values.size());
  auto ds = test::poisoned<uint8_t>(want.scales.size());
  ASSERT_TRUE(dx && dv && ds);
  const Status st =
      quantize_bf16(f, dx->as<uint16_t>(), rows, cols, dv->as<uint8_t>(), ds->as(), "test.weight", nullptr);
  ASSERT_TRUE(st) << st.error().message;
  auto values = test::download<uint8_t>(*dv, want.values.size());
  auto scales = test::download<uint8_t>(*ds, want.scales.size());
  ASSERT_TRUE(values && scales);
  for (size_t i = 0; i < want.scales.size(); ++i)
    ASSERT_EQ((*scales)[i], want.scales[i]) << "scale byte " << i;
  const size_t per_byte = f == Format::kMXFP4 ? 2 : 1;
  auto describe = [&](size_t i) {
    const size_t elem = per_byte * i, lead = f == Format::kFP8_B128 ? elem : elem / 32 * 32;
    std::ostringstream os;
    os << "value byte " << i << ", input bf16 0x" << std::hex << x[elem];
    if (per_byte == 2) os << " 0x" << x[elem + 1];
    os << ", block lead 0x" << x[lead];
    return os.str();
  };
  for (size_t i = 0; i < want.values.size(); ++i) ASSERT_EQ((*values)[i], want.values[i]) << describe(i);
}

// ---- cases ----------------------------------------------------------------------------------------------
struct QuantCase {
  Format format;
  int64_t rows, cols;
};
void PrintTo(const QuantCase& c, std::ostream* os) {
  *os << traits(c.format).name << " [" << c.rows << ", " << c.cols << "]";
}
std::string case_name(const QuantCase& c) {
  std::string n(traits(c.format).name);
  std::replace(n.begin(), n.end(), '-', '_');
  return n + "_" + std::to_string(c.rows) + "x" + std::to_string(c.cols);
}

class GpuQuantize : public ::testing::TestWithParam<QuantCase> {};

TEST_P(GpuQuantize, BitwiseEqualsSpecReference) {  // covers N-11, N-12
  const QuantCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<uint16_t> x = regime_bf16(rng, static_cast<size_t>(c.rows * c.cols));
  expect_gpu_planes(c.format, x, c.rows, c.cols, ref_quantize(c.format, x, c.rows, c.cols));
}

// The CPU twin (format/quantize.h, default rules) on the same fresh input: identical planes, byte for byte.
TEST_P(GpuQuantize, BitwiseEqualsCpuQuantize) {  // covers N-12
  const QuantCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<uint16_t> x = regime_bf16(rng, static_cast<size_t>(c.rows * c.cols));
  std::vector<uint8_t> cpu_values(static_cast<size_t>(values_bytes(c.format, c.rows, c.cols)));
  std::vector<uint8_t> cpu_scales(static_cast<size_t>(scales_bytes(c.format, c.rows, c.cols)));
  const Status cpu = quantize(c.format, default_scale_rule(c.format), Format::kBF16, x.data(), c.rows, c.cols,
                              cpu_values.data(), cpu_scales.data(), "test.weight");
  ASSERT_TRUE(cpu) << cpu.error().message;
  expect_gpu_planes(c.format, x, c.rows, c.cols, Planes{std::move(cpu_values), std::move(cpu_scales)});
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuQuantize,
    ::testing::Values(QuantCase{Format::kMXFP8, 1, 32}, QuantCase{Format::kMXFP8, 3, 96},
                      QuantCase{Format::kMXFP8, 61, 4096}, QuantCase{Format::kMXFP8, 300, 1024},
                      QuantCase{Format::kMXFP4, 1, 32}, QuantCase{Format::kMXFP4, 5, 160},
                      QuantCase{Format::kMXFP4, 61, 4096}, QuantCase{Format::kMXFP4, 300, 1024},
                      QuantCase{Format::kFP8_B128, 1, 1}, QuantCase{Format::kFP8_B128, 128, 128},
                      QuantCase{Format::kFP8_B128, 130, 260}, QuantCase{Format::kFP8_B128, 257, 300},
                      QuantCase{Format::kFP8_B128, 256, 4096}),
    [](const auto& info) { return case_name(info.param); });

// Every finite bf16 pattern as an element of an MX block, at five block scales: block k holds 31 consecutive
// patterns (both signs, subnormals and zeros included) and, first, its largest magnitude times 2^s (s = 0..4,
// where finite), so each value is encoded at its own scale and at four larger ones (codes 0..7, every tie).
class GpuQuantizeEveryBf16 : public ::testing::TestWithParam<Format> {};

TEST_P(GpuQuantizeEveryBf16, BitwiseEqualsSpecReference) {  // covers N-11, N-12
  const Format f = GetParam();
  std::vector<uint16_t> finite;
  for (uint32_t b = 0; b < 0x10000; ++b)
    if ((b & 0x7F80u) != 0x7F80u) finite.push_back(static_cast<uint16_t>(b));
  std::vector<uint16_t> x;
  for (int s = 0; s <= 4; ++s)
    for (size_t k = 0; k < finite.size(); k += 31) {
      float amax = 0.0f;
      for (size_t j = k; j < std::min(finite.size(), k + 31); ++j)
        amax = std::max(amax, std::fabs(bf16_to_f32(finite[j])));
      const float lead = std::ldexp(amax, s);
      uint32_t bits = 0;
      std::memcpy(&bits, &lead, 4);
      x.push_back(lead <= 3.0e38f ? static_cast<uint16_t>(bits >> 16) : finite[k]);  // note: amax is a bf16
      for (size_t j = k; j < k + 31; ++j) x.push_back(finite[std::min(j, finite.size() - 1)]);
    }
  const int64_t cols = 32, rows = static_cast<int64_t>(x.size()) / cols;
  expect_gpu_planes(f, x, rows, cols, ref_quantize(f, x, rows, cols));
}

INSTANTIATE_TEST_SUITE_P(Formats, GpuQuantizeEveryBf16, ::testing::Values(Format::kMXFP8, Format::kMXFP4),
                         [](const auto& info) { return std::string(traits(info.param).name); });

// Every launch shape of the three bf16 kernels (QuantLaunch: the variants `mxq-bench quantize --device cuda`
// times), PDL on and off, on shapes whose last CTA is ragged and (FP8-B128 with ctas_per_sm > 0) where a CTA
// loops over several tiles: bitwise against the spec reference, nothing flagged, then one Inf and one NaN
// placed in the input and the first of their blocks (row-major block order) reported.
struct ShapeCase {
  Format format;
  QuantLaunch shape;
};
void PrintTo(const ShapeCase& c, std::ostream* os) {
  *os << traits(c.format).name << " unroll " << c.shape.unroll << " ctas_per_sm " << c.shape.ctas_per_sm
      << " (0 / -1: the default)";
}

cudaError_t launch_shape(const ShapeCase& c, const void* x, int64_t rows, int64_t cols, void* values,
                         void* scales, unsigned long long* bad) {
  const auto* xb = static_cast<const uint16_t*>(x);
  auto* v = static_cast<uint8_t*>(values);
  if (c.format == Format::kMXFP8)
    return launch_quantize_mxfp8_ceil(xb, rows, cols, v, static_cast<uint8_t*>(scales), bad, nullptr,
                                      c.shape);
  if (c.format == Format::kMXFP4)
    return launch_quantize_mxfp4_ct(xb, rows, cols, v, static_cast<uint8_t*>(scales), bad, nullptr, c.shape);
  return launch_quantize_fp8_b128(xb, rows, cols, v, static_cast<float*>(scales), bad, nullptr, c.shape);
}

class GpuQuantizeLaunchShape : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(GpuQuantizeLaunchShape, BitwiseEqualsSpecReference) {  // covers N-10, N-11, N-12
  const ShapeCase c = GetParam();
  const Format f = c.format;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<std::array<int64_t, 2>> dims =
      f == Format::kFP8_B128
          ? std::vector<std::array<int64_t, 2>>{{1, 1}, {257, 300}, {1100, 2999}, {3000, 3000}}
          : std::vector<std::array<int64_t, 2>>{{1, 32}, {3, 96}, {61, 4096}, {1000, 2080}};
  for (const auto& [rows, cols] : dims) {
    SCOPED_TRACE("shape [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
    std::vector<uint16_t> x = regime_bf16(rng, static_cast<size_t>(rows * cols));
    const Planes want = ref_quantize(f, x, rows, cols);
    // The block index (row-major over the scales plane) of element (r, col).
    const auto block_of = [&](int64_t r, int64_t col) -> unsigned long long {
      if (f == Format::kFP8_B128)
        return static_cast<unsigned long long>(r / 128 * ((cols + 127) / 128) + col / 128);
      return static_cast<unsigned long long>(r * (cols / 32) + col / 32);
    };
    for (bool pdl : {true, false}) {
      SCOPED_TRACE(pdl ? "pdl on" : "pdl off");
      set_pdl(pdl);
      for (bool with_bad : {false, true}) {
        std::vector<uint16_t> xi = x;
        unsigned long long expect_bad = ~0ull;
        if (with_bad) {
          xi[static_cast<size_t>(rows / 2 * cols + cols / 2)] = 0xFF80;  // -inf
          expect_bad = block_of(rows / 2, cols / 2);
          if (rows >= 3) {
            xi[static_cast<size_t>((rows - 1) * cols)] = 0x7FC1;  // NaN
            expect_bad = std::min(expect_bad, block_of(rows - 1, 0));
          }
        }
        auto dx = test::upload(xi);
        auto dv = test::poisoned<uint8_t>(want.values.size());
        auto ds = test::poisoned<uint8_t>(want.scales.size());
        auto db = test::poisoned<unsigned long long>(1);
        ASSERT_TRUE(dx && dv && ds && db);
        ASSERT_EQ(launch_shape(c, dx->as(), rows, cols, dv->as(), ds->as(), db->as<unsigned long long>()),
                  cudaSuccess);
        auto bad = test::download<unsigned long long>(*db, 1);
        ASSERT_TRUE(bad);
        ASSERT_EQ((*bad)[0], expect_bad) << (with_bad ? "with Inf and NaN" : "all finite");
        if (with_bad) continue;
        auto values = test::download<uint8_t>(*dv, want.values.size());
        auto scales = test::download<uint8_t>(*ds, want.scales.size());
        ASSERT_TRUE(values && scales);
        for (size_t i = 0; i < want.scales.size(); ++i)
          ASSERT_EQ((*scales)[i], want.scales[i]) << "scale byte " << i;
        for (size_t i = 0; i < want.values.size(); ++i)
          ASSERT_EQ((*values)[i], want.values[i]) << "value byte " << i;
      }
    }
  }
  set_pdl(true);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuQuantizeLaunchShape,
    ::testing::Values(ShapeCase{Format::kMXFP8, {2, 0}}, ShapeCase{Format::kMXFP8, {4, 0}},
                      ShapeCase{Format::kMXFP8, {8, 0}}, ShapeCase{Format::kMXFP4, {2, 0}},
                      ShapeCase{Format::kMXFP4, {4, 0}}, ShapeCase{Format::kMXFP4, {8, 0}},
                      ShapeCase{Format::kFP8_B128, {4, 0}}, ShapeCase{Format::kFP8_B128, {4, 1}},
                      ShapeCase{Format::kFP8_B128, {4, 2}}, ShapeCase{Format::kFP8_B128, {4, 3}},
                      ShapeCase{Format::kFP8_B128, {4, 4}}, ShapeCase{Format::kMXFP8, {}},
                      ShapeCase{Format::kMXFP4, {}}, ShapeCase{Format::kFP8_B128, {}}),
    [](const auto& info) {
      std::string n(traits(info.param.format).name);
      std::replace(n.begin(), n.end(), '-', '_');
      const QuantLaunch& l = info.param.shape;
      if (l.unroll == 0 && l.ctas_per_sm == -1) return n + "_default";
      return n + "_unroll" + std::to_string(l.unroll) + "_ctas" + std::to_string(l.ctas_per_sm);
    });

TEST(GpuQuantizeArgs, RefusesUnknownLaunchShape) {
  EXPECT_EQ(launch_quantize_mxfp8_ceil(nullptr, 1, 32, nullptr, nullptr, nullptr, nullptr, {3, 0}),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_quantize_mxfp4_ct(nullptr, 1, 32, nullptr, nullptr, nullptr, nullptr, {16, 0}),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_quantize_fp8_b128(nullptr, 1, 1, nullptr, nullptr, nullptr, nullptr, {4, 5}),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch_quantize_fp8_b128(nullptr, 1, 1, nullptr, nullptr, nullptr, nullptr, {4, -2}),
            cudaErrorInvalidValue);
}

class GpuQuantizeRefuses : public ::testing::TestWithParam<Format> {};

TEST_P(GpuQuantizeRefuses, NanOrInfBlockByIndex) {  // covers N-10
  const Format f = GetParam();
  const int64_t rows = 256, cols = 256;
  std::mt19937_64 rng(test::fresh_seed());
  std::vector<uint16_t> x = test::random_bf16(rng, static_cast<size_t>(rows * cols));
  x[static_cast<size_t>(130 * cols + 200)] = 0x7F80;  // +inf at row 130, col 200
  x[static_cast<size_t>(131 * cols + 40)] = 0x7FC0;   // NaN later in row order, lower block column
  auto dx = test::upload(x);
  auto dv = test::poisoned<uint8_t>(static_cast<size_t>(values_bytes(f, rows, cols)));
  auto ds = test::poisoned<uint8_t>(static_cast<size_t>(scales_bytes(f, rows, cols)));
  ASSERT_TRUE(dx && dv && ds);
  const Status st =
      quantize_bf16(f, dx->as<uint16_t>(), rows, cols, dv->as<uint8_t>(), ds->as(), "layers.0.w", nullptr);
  ASSERT_FALSE(st);
  // The first bad block in row-major block order: MX (1x32) row 130, block col 6; FP8-B128 block (1, 0).
  const std::string expect =
      f == Format::kFP8_B128 ? "block row 1, block col 0" : "block row 130, block col 6";
  EXPECT_NE(st.error().message.find("layers.0.w"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find(expect), std::string::npos) << st.error().message;
}

INSTANTIATE_TEST_SUITE_P(Formats, GpuQuantizeRefuses,
                         ::testing::Values(Format::kMXFP8, Format::kMXFP4, Format::kFP8_B128),
                         [](const auto& info) {
                           std::string n(traits(info.param).name);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(GpuQuantizeArgs, RefusesMxColsNotMultipleOf32) {  // covers N-13
  const Status st = quantize_bf16(Format::kMXFP8, nullptr, 2, 48, nullptr, nullptr, "w", nullptr);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("K = 48"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace mxq::cuda
