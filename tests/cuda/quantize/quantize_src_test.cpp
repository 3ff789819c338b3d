// GPU quantize from bf16, f16 and f32 sources with every MXFP8 scale rule (cuda::quantize, quantize_src.cu)
// against the CPU quantize (format/quantize.h), bitwise, on inputs drawn per 32-run from regimes: ordinary,
// huge, tiny (subnormals of the source type), signed zeros, and few mantissa bits (encoder ties).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../gpu_test_util.h"
#include "cuda/quantize/quantize.h"
#include "format/quantize.h"

namespace mxq::cuda {
namespace {

struct SrcCase {
  Format format;
  ScaleRule rule;
  Format src;
  int64_t rows, cols;
};
void PrintTo(const SrcCase& c, std::ostream* os) {
  *os << traits(c.format).name << " " << scale_rule_name(c.rule) << " from " << traits(c.src).name << " ["
      << c.rows << ", " << c.cols << "]";
}

// Raw source bytes: per 32-run one regime over the source's exponent field (ebits wide, mbits mantissa).
std::vector<uint8_t> regime_source(std::mt19937_64& rng, Format src, size_t count) {
  const int bytes = src == Format::kF32 ? 4 : 2;
  const int ebits = src == Format::kF32 ? 8 : src == Format::kF16 ? 5 : 8;
  const int mbits = src == Format::kF32 ? 23 : src == Format::kF16 ? 10 : 7;
  const uint32_t emax = (1u << ebits) - 2, bias = (1u << (ebits - 1)) - 1;
  std::vector<uint8_t> out(count * static_cast<size_t>(bytes));
  for (size_t run = 0; run < count; run += 32) {
    const int regime = static_cast<int>(rng() % 10);
    uint32_t lo = bias - 8, hi = bias + 8;
    if (regime == 7) lo = emax - emax / 5, hi = emax;  // huge
    if (regime == 8) lo = 0, hi = 2;                   // tiny: subnormals of the source
    for (size_t i = run; i < std::min(count, run + 32); ++i) {
      const uint32_t sign = static_cast<uint32_t>(rng() & 1);
      uint32_t man = static_cast<uint32_t>(rng()) & ((1u << mbits) - 1);
      if (regime == 6) man &= 7u << (mbits - 3);  // note: few mantissa bits land on encoder ties
      const uint32_t e = lo + static_cast<uint32_t>(rng() % (hi - lo + 1));
      const uint32_t bits =
          regime == 9 ? sign << (ebits + mbits) : sign << (ebits + mbits) | e << mbits | man;
      std::memcpy(out.data() + i * static_cast<size_t>(bytes), &bits, static_cast<size_t>(bytes));
    }
  }
  return out;
}

class QuantizeSrc : public ::testing::TestWithParam<SrcCase> {};

TEST_P(QuantizeSrc, BitwiseEqualsCpuQuantize) {
  const SrcCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<uint8_t> x = regime_source(rng, c.src, static_cast<size_t>(c.rows * c.cols));
  const size_t vbytes = static_cast<size_t>(values_bytes(c.format, c.rows, c.cols));
  const size_t sbytes = static_cast<size_t>(scales_bytes(c.format, c.rows, c.cols));
  std::vector<uint8_t> want_v(vbytes), want_s(sbytes);
  ASSERT_TRUE(quantize(c.format, c.rule, c.src, x.data(), c.rows, c.cols, want_v.data(), want_s.data(), "x"));
  auto dx = test::upload(x);
  auto dv = test::poisoned<uint8_t>(vbytes);
  auto ds = test::poisoned<uint8_t>(sbytes);
  ASSERT_TRUE(dx && dv && ds);
  const Status st = cuda::quantize(c.format, c.rule, c.src, dx->as(), c.rows, c.cols, dv->as<uint8_t>(),
                                   ds->as(), "x", nullptr);
  ASSERT_TRUE(st) << st.error().message;
  auto v = test::download<uint8_t>(*dv, vbytes);
  auto s = test::download<uint8_t>(*ds, sbytes);
  ASSERT_TRUE(v && s);
  for (size_t i = 0; i < sbytes; ++i) ASSERT_EQ((*s)[i], want_s[i]) << "scale byte " << i;
  for (size_t i = 0; i < vbytes; ++i) ASSERT_EQ((*v)[i], want_v[i]) << "value byte " << i;
}

std::vector<SrcCase> src_cases() {
  std::vector<SrcCase> cases;
  for (Format src : {Format::kBF16, Format::kF16, Format::kF32}) {
    for (ScaleRule rule : {ScaleRule::kCeil, ScaleRule::kOcp, ScaleRule::kFloor, ScaleRule::kCt})
      cases.push_back({Format::kMXFP8, rule, src, 37, 320});
    cases.push_back({Format::kMXFP4, ScaleRule::kCt, src, 37, 320});
    cases.push_back(
        {Format::kFP8_B128, ScaleRule::kCeil, src, 130, 300});  // note: cols % 8 != 0: scalar loads
    cases.push_back({Format::kFP8_B128, ScaleRule::kCeil, src, 129, 264});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, QuantizeSrc, ::testing::ValuesIn(src_cases()), [](const auto& info) {
  const SrcCase& c = info.param;
  std::string name = std::string(traits(c.format).name) + "_" + std::string(scale_rule_name(c.rule)) + "_" +
                     std::string(traits(c.src).name) + "_" + std::to_string(c.rows) + "x" +
                     std::to_string(c.cols);
  for (char& ch : name)
    if (ch == '-') ch = '_';
  return name;
});

TEST(QuantizeSrcRefuses, RuleAndSourceByName) {
  uint8_t dummy = 0;
  Status st = cuda::quantize(Format::kMXFP4, ScaleRule::kOcp, Format::kF32, &dummy, 1, 32, &dummy, &dummy,
                             "w", nullptr);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("ct only"), std::string::npos) << st.error().message;
  st = cuda::quantize(Format::kMXFP8, ScaleRule::kCeil, Format::kE4M3, &dummy, 1, 32, &dummy, &dummy, "w",
                      nullptr);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("from e4m3"), std::string::npos) << st.error().message;
}

}  // namespace
}  // namespace mxq::cuda
