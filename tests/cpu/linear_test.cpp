#include "cpu/linear.h"

#include <gtest/gtest.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ostream>

#include "format/codec.h"
#include "test_util.h"

namespace mxq {
namespace {

struct LinearCase {
  Format format;
  int64_t m, n, k;
  bool bias;
  bool unaligned;  // planes start one byte past an aligned address
};

void PrintTo(const LinearCase& c, std::ostream* os) {
  *os << traits(c.format).name << " M=" << c.m << " N=" << c.n << " K=" << c.k << (c.bias ? " +bias" : "")
      << (c.unaligned ? " unaligned" : "");
}

// A weight in canonical planes with random, non-NaN, non-zero-heavy content.
struct RandomWeight {
  std::vector<uint8_t> values, scales;  // one spare leading byte each, for the unaligned cases
  WeightView view;
};

uint8_t random_code(Format element, std::mt19937_64& rng) {
  for (;;) {
    const auto c = static_cast<uint8_t>(rng());
    if (element == Format::kE4M3 && (c & 0x7F) == 0x7F) continue;         // NaN codes
    if (element == Format::kE5M2 && ((c >> 2) & 0x1F) == 0x1F) continue;  // inf / NaN codes
    return c;
  }
}

RandomWeight random_weight(Format f, int64_t n, int64_t k, bool unaligned, std::mt19937_64& rng) {
  const FormatTraits& t = traits(f);
  RandomWeight w;
  w.values.resize(static_cast<size_t>(values_bytes(f, n, k)) + 1);
  w.scales.resize(static_cast<size_t>(scales_bytes(f, n, k)) + 1);
  uint8_t* v = w.values.data() + (unaligned ? 1 : 0);
  uint8_t* s = w.scales.data() + (unaligned ? 1 : 0);
  const int64_t count = n * k;
  std::uniform_int_distribution<int> f16_exp(10, 20);  // |x| in [2^-5, 2^6): normal f16 values
  for (int64_t i = 0; i < count; ++i) {
    switch (t.element) {
      case Format::kBF16: {
        const float x = test::random_floats(rng, 1)[0];
        uint32_t bits;
        std::memcpy(&bits, &x, 4);
        const auto h = static_cast<uint16_t>(bits >> 16);
        std::memcpy(v + 2 * i, &h, 2);
        break;
      }
      case Format::kF16: {
        const auto h = static_cast<uint16_t>((rng() & 0x83FF) | (f16_exp(rng) << 10));
        std::memcpy(v + 2 * i, &h, 2);
        break;
      }
      case Format::kF32: {
        const float x = test::random_floats(rng, 1)[0];
        std::memcpy(v + 4 * i, &x, 4);
        break;
      }
      case Format::kE2M1:
        if (i % 2 == 0) v[i / 2] = static_cast<uint8_t>(rng());
        break;
      default:
        v[i] = random_code(t.element, rng);
    }
  }
  const auto [srows, scols] = scales_shape(f, n, k);
  std::uniform_int_distribution<int> e8m0(120, 134);
  std::uniform_real_distribution<float> b128(1e-3f, 1e-2f);
  for (int64_t i = 0; i < srows * scols; ++i) {
    if (t.scale == ScaleKind::kE8M0) s[i] = static_cast<uint8_t>(e8m0(rng));
    if (t.scale == ScaleKind::kF32) {
      const float x = b128(rng);
      std::memcpy(s + 4 * i, &x, 4);
    }
  }
  w.view = WeightView{f, n, k, v, t.scale == ScaleKind::kNone ? nullptr : s};
  return w;
}

// The oracle: every element decoded with the codec.h decoders, times its scale, in f64.
double reference_element(const WeightView& w, int64_t r, int64_t c) {
  const FormatTraits& t = traits(w.format);
  double x = 0;
  uint16_t h;
  switch (t.element) {
    case Format::kBF16:
      std::memcpy(&h, w.values + 2 * (r * w.cols + c), 2);
      x = bf16_to_f32(h);
      break;
    case Format::kF16:
      std::memcpy(&h, w.values + 2 * (r * w.cols + c), 2);
      x = f16_to_f32(h);
      break;
    case Format::kF32: {
      float f;
      std::memcpy(&f, w.values + 4 * (r * w.cols + c), 4);
      x = f;
      break;
    }
    case Format::kE4M3:
      x = e4m3_to_f32(w.values[r * w.cols + c]);
      break;
    case Format::kE5M2:
      x = e5m2_to_f32(w.values[r * w.cols + c]);
      break;
    case Format::kE2M1: {
      const uint8_t byte = w.values[r * (w.cols / 2) + c / 2];
      x = e2m1_to_f32(c % 2 == 0 ? byte & 0xF : byte >> 4);
      break;
    }
    default:
      ADD_FAILURE() << "no reference decoder for " << t.name;
  }
  if (t.scale == ScaleKind::kE8M0) x *= std::ldexp(1.0, w.scales[r * (w.cols / 32) + c / 32] - 127);
  if (t.scale == ScaleKind::kF32) {
    float s;
    std::memcpy(&s, w.scales + 4 * ((r / 128) * cdiv(w.cols, 128) + c / 128), 4);
    x *= s;
  }
  return x;
}

std::vector<double> reference_linear(const std::vector<float>& x, int64_t m, const WeightView& w,
                                     const std::vector<float>* bias) {
  std::vector<double> wd(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t c = 0; c < w.cols; ++c) wd[r * w.cols + c] = reference_element(w, r, c);
  std::vector<double> y(static_cast<size_t>(m * w.rows));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t r = 0; r < w.rows; ++r) {
      double s = bias ? (*bias)[r] : 0.0;
      for (int64_t c = 0; c < w.cols; ++c) s += static_cast<double>(x[i * w.cols + c]) * wd[r * w.cols + c];
      y[i * w.rows + r] = s;
    }
  return y;
}

class CpuLinear : public ::testing::TestWithParam<LinearCase> {};

TEST_P(CpuLinear, MatchesF64MatmulOnDecodedWeight) {
  const LinearCase& c = GetParam();
  std::mt19937_64 rng(1000 + c.m * 7 + c.n * 13 + c.k * 17 + static_cast<int>(c.format));
  RandomWeight w = random_weight(c.format, c.n, c.k, c.unaligned, rng);
  std::vector<float> x = test::random_floats(rng, static_cast<size_t>(c.m * c.k));
  std::vector<float> bias = test::random_floats(rng, static_cast<size_t>(c.n));
  std::vector<float> y(static_cast<size_t>(c.m * c.n), -1.0f);
  ASSERT_TRUE(linear(x.data(), c.m, w.view, c.bias ? bias.data() : nullptr, y.data()));
  const std::vector<double> want = reference_linear(x, c.m, w.view, c.bias ? &bias : nullptr);
  EXPECT_LE(test::nmse(y, want), traits(c.format).nmse_tolerance);

  // One thread and the default pool compute each output in the same order: bitwise equal.
  ThreadPool single(1);
  std::vector<float> y1(y.size());
  ASSERT_TRUE(linear(x.data(), c.m, w.view, c.bias ? bias.data() : nullptr, y1.data(), single));
  EXPECT_EQ(0, std::memcmp(y.data(), y1.data(), y.size() * sizeof(float)));

  // Each row alone (the M = 1 decode kernel) equals its row of the batch bit for bit: a request's logits do
  // not depend on how its prompt was chunked or on what else shares the step.
  std::vector<float> row(static_cast<size_t>(c.n));
  for (int64_t i = 0; i < c.m; ++i) {
    ASSERT_TRUE(linear(x.data() + i * c.k, 1, w.view, c.bias ? bias.data() : nullptr, row.data()));
    EXPECT_EQ(0, std::memcmp(row.data(), y.data() + i * c.n, row.size() * sizeof(float))) << "row " << i;
  }
}

std::vector<LinearCase> linear_cases() {
  std::vector<LinearCase> cases;
  const int64_t ms[] = {1, 3, 17, 64};
  struct Nk {
    int64_t n, k;
  };
  // note: K = 544 and 1056 are not multiples of 512 (an older chunked kernel's edge); N = 257 leaves a ragged row tile and
  // a 1-row FP8-B128 block; K = 300 / 611 leave a ragged 32-block and a short 128 block.
  const Nk mx_shapes[] = {{1, 32}, {5, 96}, {130, 544}, {257, 1056}};
  const Nk any_shapes[] = {{1, 7}, {5, 96}, {130, 300}, {257, 611}};
  const Format formats[] = {Format::kBF16, Format::kF16,   Format::kF32,   Format::kE4M3,
                            Format::kE5M2, Format::kMXFP8, Format::kMXFP4, Format::kFP8_B128};
  int i = 0;
  for (Format f : formats) {
    const bool mx = traits(f).scale == ScaleKind::kE8M0;
    for (const Nk& s : mx ? mx_shapes : any_shapes)
      for (int64_t m : ms) {
        ++i;
        cases.push_back({f, m, s.n, s.k, i % 2 == 0, i % 3 == 0});
      }
  }
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<LinearCase>& info) {
  const LinearCase& c = info.param;
  std::string name(traits(c.format).name);
  for (char& ch : name)
    if (ch == '-') ch = '_';
  return name + "_M" + std::to_string(c.m) + "_N" + std::to_string(c.n) + "_K" + std::to_string(c.k) +
         (c.bias ? "_bias" : "") + (c.unaligned ? "_unaligned" : "");
}

INSTANTIATE_TEST_SUITE_P(CpuLinear, CpuLinear, ::testing::ValuesIn(linear_cases()), case_name);

// ---- refusals and edge policy --------------------------------------------------------------------------
struct RefusalCase {
  const char* what;
  WeightView view;
  const char* expect_in_message;
};
void PrintTo(const RefusalCase& c, std::ostream* os) { *os << c.what; }

const uint8_t kBytes[4096] = {};

class CpuLinearRefuses : public ::testing::TestWithParam<RefusalCase> {};

TEST_P(CpuLinearRefuses, ByName) {
  const RefusalCase& c = GetParam();
  std::vector<float> x(static_cast<size_t>(std::max<int64_t>(c.view.cols, 1)), 1.0f), y(64);
  const Status s = linear(x.data(), 1, c.view, nullptr, y.data());
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find(c.expect_in_message), std::string::npos) << s.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    CpuLinearRefuses, CpuLinearRefuses,
    ::testing::Values(
        // covers N-13 (K not a multiple of 32 for an MX format: refused, no out-of-bounds read)
        RefusalCase{"mxfp8 K=48", {Format::kMXFP8, 2, 48, kBytes, kBytes}, "multiple of 32, got K = 48"},
        RefusalCase{"mxfp4 K=40", {Format::kMXFP4, 2, 40, kBytes, kBytes}, "multiple of 32, got K = 40"},
        RefusalCase{"bare e2m1", {Format::kE2M1, 2, 32, kBytes, nullptr}, "format e2m1"},
        RefusalCase{"bare e8m0", {Format::kE8M0, 2, 32, kBytes, nullptr}, "format e8m0"},
        RefusalCase{"mxfp8 no scales", {Format::kMXFP8, 2, 32, kBytes, nullptr}, "needs a scales plane"},
        RefusalCase{
            "fp8-b128 no scales", {Format::kFP8_B128, 2, 32, kBytes, nullptr}, "needs a scales plane"},
        RefusalCase{"negative rows", {Format::kBF16, -1, 32, kBytes, nullptr}, "negative dimension"}),
    [](const ::testing::TestParamInfo<RefusalCase>& info) { return "case" + std::to_string(info.index); });

// A NaN scale byte (0xFF) is not repaired by the op: exactly the outputs of that row become NaN.
TEST(CpuLinear, NanScaleByteReachesOnlyItsRow) {
  std::mt19937_64 rng(7);
  RandomWeight w = random_weight(Format::kMXFP8, 3, 64, false, rng);
  const_cast<uint8_t*>(w.view.scales)[1 * 2 + 1] = 0xFF;  // row 1, second block
  std::vector<float> x = test::random_floats(rng, 2 * 64), y(2 * 3);
  ASSERT_TRUE(linear(x.data(), 2, w.view, nullptr, y.data()));
  for (int i = 0; i < 2; ++i) {
    EXPECT_FALSE(std::isnan(y[i * 3 + 0]));
    EXPECT_TRUE(std::isnan(y[i * 3 + 1]));
    EXPECT_FALSE(std::isnan(y[i * 3 + 2]));
  }
}

// Decode throughput at M = 1, the bandwidth-bound decode shape, as weight bytes (values + scales) per
// second, beside the speed of light: a plain read of as many bytes. Times are per-thread CPU time on one
// thread (the build machine is shared, so wall time mostly measures the neighbours) and wall time on the
// default pool. Run with --gtest_also_run_disabled_tests --gtest_filter='CpuLinearBench*'.
double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <class Fn>
double best_of(int reps, double (*clock)(), Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = clock();
    fn();
    best = std::min(best, clock() - t0);
  }
  return best;
}

TEST(CpuLinearBench, DISABLED_DecodeWeightBandwidth) {
  const int64_t n = 4096, k = 4096;
  std::mt19937_64 rng(3);
  ThreadPool single(1);
  for (Format f : {Format::kBF16, Format::kMXFP8, Format::kMXFP4, Format::kFP8_B128}) {
    RandomWeight w = random_weight(f, n, k, false, rng);
    std::vector<float> x = test::random_floats(rng, k), y(n);
    const double bytes = static_cast<double>(values_bytes(f, n, k) + scales_bytes(f, n, k));
    uint64_t sink = 0;
    const double read = best_of(10, thread_seconds, [&] {
      uint64_t acc = 0;
      for (size_t i = 0; i + 8 <= w.values.size(); i += 8) {
        uint64_t v;
        std::memcpy(&v, &w.values[i], 8);
        acc += v;
      }
      sink += acc;
    });
    const double one =
        best_of(10, thread_seconds, [&] { (void)linear(x.data(), 1, w.view, nullptr, y.data(), single); });
    const double all =
        best_of(10, wall_seconds, [&] { (void)linear(x.data(), 1, w.view, nullptr, y.data()); });
    std::printf(
        "linear %-8s M=1 N=%lld K=%lld: 1 thread %6.2f GB/s (%3.0f%% of a %5.2f GB/s read), "
        "%d threads wall %6.2f GB/s  [%llu]\n",
        std::string(traits(f).name).c_str(), static_cast<long long>(n), static_cast<long long>(k),
        bytes / one / 1e9, 100.0 * (bytes / one) / (static_cast<double>(w.values.size()) / read),
        static_cast<double>(w.values.size()) / read / 1e9, default_pool().threads(), bytes / all / 1e9,
        static_cast<unsigned long long>(sink % 10));
    // the timed runs computed the same product as the reference path
    std::vector<float> y1(n);
    ASSERT_TRUE(linear(x.data(), 1, w.view, nullptr, y1.data(), single));
    EXPECT_EQ(y, y1);
  }
}

}  // namespace
}  // namespace mxq
