// Block quantizers against golden bytes from vLLM's / compressed-tensors' / microxcaling's / DeepSeek's
// rules (tests/golden/make_format_golden.py), plus the spec's zero, tiny, huge, NaN and shape cases.
#include "format/quantize.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <vector>

#include "format/codec.h"
#include "golden_npy.h"

namespace mxq {
namespace {

using testing::load_npy;

// The golden script's block recipe: block i has amax bits a = i + 1 (every positive finite bf16) and
// element j = bf16 bits max(a - kDeltas[j], 0), negated for odd j.
constexpr int kDeltas[32] = {0,     1,     2,     3,     5,     8,     13,    21,    0x40,   0x41,  0x80,
                             0x81,  0xC0,  0x100, 0x180, 0x200, 0x280, 0x300, 0x380, 0x400,  0x480, 0x500,
                             0x600, 0x700, 0x800, 0x900, 0xA00, 0xB00, 0xC00, 0xE00, 0x1000, 0x7F7F};
constexpr int kAmaxCount = 0x7F7F;  // bf16 0x0001 .. 0x7F7F
constexpr int kSubsetStride = 37;

std::vector<uint16_t> amax_blocks() {
  std::vector<uint16_t> x(static_cast<size_t>(kAmaxCount) * 32);
  for (int i = 0; i < kAmaxCount; ++i)
    for (int j = 0; j < 32; ++j)
      x[i * 32 + j] = static_cast<uint16_t>(std::max(i + 1 - kDeltas[j], 0) | ((j % 2) << 15));
  return x;
}
bool in_element_subset(int a) { return a % kSubsetStride == 0 || a < 0x80 || a > 0x7F00; }

struct RuleCase {
  Format fmt;
  ScaleRule rule;
  const char* golden;  // amax_<golden>_scale / _elems, random_<golden>_*
};
void PrintTo(const RuleCase& c, std::ostream* os) { *os << c.golden; }

class AmaxSweep : public ::testing::TestWithParam<RuleCase> {};

// Every positive finite bf16 as a block amax: scale byte (all 32639) and element bytes (a subset: every
// 37th amax and the lowest / highest 127), byte-exact with the rule's reference implementation.
// covers N-07, N-08, N-11 (tiny amax at the bottom of the sweep, huge at the top)
TEST_P(AmaxSweep, MatchesReference) {
  const RuleCase& c = GetParam();
  const auto want_scale = load_npy(std::string("amax_") + c.golden + "_scale").as<uint8_t>();
  const auto want_elems = load_npy(std::string("amax_") + c.golden + "_elems");
  ASSERT_EQ(static_cast<int>(want_scale.size()), kAmaxCount);
  const std::vector<uint16_t> x = amax_blocks();
  const int64_t row_bytes = values_bytes(c.fmt, 1, 32);
  std::vector<uint8_t> values(values_bytes(c.fmt, kAmaxCount, 32)), scales(kAmaxCount);
  ASSERT_TRUE(quantize(c.fmt, c.rule, Format::kBF16, x.data(), kAmaxCount, 32, values.data(), scales.data(),
                       "sweep"));
  ASSERT_EQ(want_elems.shape[1], row_bytes);
  // note: compressed-tensors rounds amax >= 1.75·2^127 up to inf and its E8M0 cast of that is undefined;
  // formats.md computes b in integers instead: 127 + 127 - emax + 1 (247 for E4M3, 253 for E2M1).
  const int ct_overflow_b = c.fmt == Format::kMXFP4 ? 253 : 247;
  int ct_overflow = 0, subset = 0, bad = 0;
  for (int i = 0; i < kAmaxCount; ++i) {
    const int a = i + 1;
    const bool overflow = c.rule == ScaleRule::kCt && a >= 0x7F60;
    ct_overflow += overflow;
    const int want = overflow ? ct_overflow_b : want_scale[i];
    if (scales[i] != want && ++bad < 10)
      ADD_FAILURE() << "amax bf16 0x" << std::hex << a << ": scale " << +scales[i] << " want " << want;
    EXPECT_EQ(mx_scale_byte(c.fmt, c.rule, bf16_to_f32(static_cast<uint16_t>(a))), want)
        << "amax bf16 0x" << std::hex << a;
    if (!in_element_subset(a)) continue;
    const uint8_t* want_row = want_elems.data.data() + static_cast<size_t>(subset++) * row_bytes;
    if (overflow) continue;
    for (int k = 0; k < row_bytes; ++k)
      if (values[i * row_bytes + k] != want_row[k] && ++bad < 10)
        ADD_FAILURE() << "amax bf16 0x" << std::hex << a << " byte " << std::dec << k << ": 0x" << std::hex
                      << +values[i * row_bytes + k] << " want 0x" << +want_row[k];
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(subset, want_elems.shape[0]);
  EXPECT_EQ(ct_overflow, c.rule == ScaleRule::kCt ? 32 : 0);
}

// Random tensors: f32 input (row magnitudes 2^-40..2^40) for MXFP8, bf16 for MXFP4.
TEST_P(AmaxSweep, RandomTensorMatchesReference) {
  const RuleCase& c = GetParam();
  const bool fp4 = c.fmt == Format::kMXFP4;
  const auto in = load_npy(fp4 ? "random_bf16_in" : "random_f32_in");
  const int64_t rows = in.shape[0], cols = in.shape[1];
  std::vector<uint8_t> values(values_bytes(c.fmt, rows, cols)), scales(scales_bytes(c.fmt, rows, cols));
  ASSERT_TRUE(quantize(c.fmt, c.rule, fp4 ? Format::kBF16 : Format::kF32, in.data.data(), rows, cols,
                       values.data(), scales.data(), "random"));
  EXPECT_EQ(scales, load_npy(std::string("random_") + c.golden + "_scale").as<uint8_t>());
  EXPECT_EQ(values, load_npy(std::string("random_") + c.golden + "_elems").as<uint8_t>());
}

INSTANTIATE_TEST_SUITE_P(Quantize, AmaxSweep,
                         ::testing::Values(RuleCase{Format::kMXFP8, ScaleRule::kCeil, "mxfp8_ceil"},
                                           RuleCase{Format::kMXFP8, ScaleRule::kOcp, "mxfp8_ocp"},
                                           RuleCase{Format::kMXFP8, ScaleRule::kFloor, "mxfp8_floor"},
                                           RuleCase{Format::kMXFP8, ScaleRule::kCt, "mxfp8_ct"},
                                           RuleCase{Format::kMXFP4, ScaleRule::kCt, "mxfp4_ct"}),
                         [](const auto& info) { return std::string(info.param.golden); });

struct B128Case {
  const char* tag;  // b128_<tag>_{in,values,scales}
  Format src;
};
void PrintTo(const B128Case& c, std::ostream* os) { *os << c.tag; }

class B128Golden : public ::testing::TestWithParam<B128Case> {};

// DeepSeek per_block_cast_to_fp8 on ragged shapes (short final blocks, a zero and a tiny block), and on the
// multiplier edge cases of issue 22 (ties_*: the torch rule m = fl(fl(1/amax')*448) against fl(448/amax')).
// covers N-11 (zero / tiny blocks clamp amax at 1e-4), N-13 (odd block sizes)
TEST_P(B128Golden, MatchesDeepSeekCast) {
  const B128Case& c = GetParam();
  const auto in = load_npy(std::string("b128_") + c.tag + "_in");
  const int64_t rows = in.shape[0], cols = in.shape[1];
  std::vector<uint8_t> values(values_bytes(Format::kFP8_B128, rows, cols));
  std::vector<uint8_t> scales(scales_bytes(Format::kFP8_B128, rows, cols));
  ASSERT_TRUE(quantize(Format::kFP8_B128, ScaleRule::kCeil, c.src, in.data.data(), rows, cols, values.data(),
                       scales.data(), c.tag));
  const auto want = load_npy(std::string("b128_") + c.tag + "_values").as<uint8_t>();
  ASSERT_EQ(values.size(), want.size());
  size_t differ = 0, first = 0;
  for (size_t i = values.size(); i-- > 0;)
    if (values[i] != want[i]) ++differ, first = i;
  EXPECT_EQ(differ, 0u) << "value bytes differ from the golden; first at element " << first << ": 0x"
                        << std::hex << int{values[first]} << " (golden 0x" << int{want[first]} << ")";
  EXPECT_EQ(scales, load_npy(std::string("b128_") + c.tag + "_scales").as<uint8_t>());
}

INSTANTIATE_TEST_SUITE_P(
    Quantize, B128Golden,
    ::testing::Values(B128Case{"bf16_1x1", Format::kBF16}, B128Case{"bf16_3x300", Format::kBF16},
                      B128Case{"bf16_129x131", Format::kBF16}, B128Case{"bf16_130x7", Format::kBF16},
                      B128Case{"f32_40x140", Format::kF32},
                      // note: multiplier edge cases (make_b128_ties_golden.py): amaxes
                      // where fl(fl(1/a)*448) != fl(448/a), elements on E4M3 ties
                      B128Case{"ties_bf16_16x1448", Format::kBF16}, B128Case{"ties_f32_8x520", Format::kF32}),
    [](const auto& info) { return std::string(info.param.tag); });

// ---- hand cases from formats.md / reference_notes.md §1.6 ----------------------------------------------
struct BlockCase {
  const char* name;
  ScaleRule rule;
  std::vector<float> head;  // first elements; the rest of the 32 are +0
  int scale;
  std::vector<int> want;  // first element bytes
};
void PrintTo(const BlockCase& c, std::ostream* os) { *os << c.name; }

class Mxfp8Block : public ::testing::TestWithParam<BlockCase> {};

// covers N-11: zero block (b = 0, sign of zero kept), tiny block (b = 0, elements x·2^127), huge f32 block
TEST_P(Mxfp8Block, Quantizes) {
  const BlockCase& c = GetParam();
  std::vector<float> x(32, 0.0f);
  std::copy(c.head.begin(), c.head.end(), x.begin());
  std::vector<uint8_t> values(32);
  uint8_t scale = 0;
  ASSERT_TRUE(quantize(Format::kMXFP8, c.rule, Format::kF32, x.data(), 1, 32, values.data(), &scale, c.name));
  EXPECT_EQ(scale, c.scale);
  for (size_t i = 0; i < c.want.size(); ++i) EXPECT_EQ(values[i], c.want[i]) << "element " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Quantize, Mxfp8Block,
    ::testing::Values(
        // reference_notes.md §1.6 worked example: [500, 1, 0.0078125, -3, 0...]
        BlockCase{
            "worked_ceil", ScaleRule::kCeil, {500, 1, 0.0078125f, -3}, 128, {0x78, 0x30, 0x02, 0xBC, 0}},
        BlockCase{"worked_ocp", ScaleRule::kOcp, {500, 1, 0.0078125f, -3}, 127, {0x7E, 0x38, 0x04, 0xC4, 0}},
        BlockCase{
            "worked_floor", ScaleRule::kFloor, {500, 1, 0.0078125f, -3}, 135, {0x40, 0x02, 0x00, 0x86, 0}},
        BlockCase{"zero_ceil", ScaleRule::kCeil, {0.0f, -0.0f}, 0, {0x00, 0x80}},
        BlockCase{"zero_ct", ScaleRule::kCt, {0.0f, -0.0f}, 0, {0x00, 0x00}},
        BlockCase{"zero_floor", ScaleRule::kFloor, {0.0f, -0.0f}, 1, {0x00, 0x80}},
        // tiny: amax 2^-130 <= 448·2^-127 -> b 0, element 2^-130·2^127 = 2^-3 = 0x20; 2^-140·2^127 = 2^-13 ->
        // 0
        BlockCase{"tiny_ceil", ScaleRule::kCeil, {0x1p-130f, -0x1p-140f}, 0, {0x20, 0x80}},
        // huge: FLT_MAX / 448 = 1.9999999·2^119 -> ceil log2 = 120 -> b 247; FLT_MAX·2^-120 ~ 255.99 -> 256
        BlockCase{"huge_ceil", ScaleRule::kCeil, {3.4028235e38f, -1.0f}, 247, {0x78, 0x80}},
        // ct bumps only at m >= 1.75: 448 = 1.75·2^8 -> 2^9 -> b 128; ceil keeps 448 at b 127
        BlockCase{"ct_bump", ScaleRule::kCt, {448.0f}, 128, {0x76}},
        // ct: -0 -> +0 (compressed-tensors adds its zero zero-point), a negative rounding to zero keeps 0x80
        BlockCase{"ct_negative_zero", ScaleRule::kCt, {1.0f, -0.0f, -1e-20f}, 119, {0x78, 0x00, 0x80}},
        BlockCase{"ceil_448", ScaleRule::kCeil, {448.0f}, 127, {0x7E}},
        // issue 22, f32 max block (b 247, x · 2^-120): -2^-149 · 2^-120 underflows to -0 in f32; ct adds its
        // +0 zero point after that rounding (compressed-tensors: two torch ops), so 0x00, whatever the
        // compiler's FMA contraction; -2^-140 stays a nonzero f32 and rounds to -0 in E4M3: 0x80. ceil keeps
        // the sign of the underflowed product: 0x80.
        BlockCase{"ct_underflow_to_plus_zero",
                  ScaleRule::kCt,
                  {3.4028235e38f, -0x1p-149f, -0.0f, -0x1p-20f},
                  247,
                  {0x78, 0x00, 0x00, 0x80}},
        BlockCase{
            "ceil_underflow_keeps_sign", ScaleRule::kCeil, {3.4028235e38f, -0x1p-149f}, 247, {0x78, 0x80}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Quantize, Mxfp4HugeAndZeroBlocks) {
  // covers N-11: amax 1.9921875·2^127 (bf16 0x7F7F) -> b 253 (formats.md, computed in integers); 0 -> 0
  std::vector<uint16_t> x(64, 0);
  x[0] = 0x7F7F;
  x[1] = 0x8000;   // -0 -> code 0
  x[33] = 0xBC00;  // -2^-7: block 1 has amax 2^-7 -> b = 127 - 7 - 2
  std::vector<uint8_t> values(32), scales(2);
  ASSERT_TRUE(quantize(Format::kMXFP4, ScaleRule::kCt, Format::kBF16, x.data(), 1, 64, values.data(),
                       scales.data(), "w"));
  EXPECT_EQ(scales[0], 253);
  EXPECT_EQ(values[0], 0x06);  // 1.9921875·2^127 / 2^126 = 3.98 -> 4 (code 6); -0 -> code 0
  EXPECT_EQ(scales[1], 127 - 7 - 2);
  EXPECT_EQ(values[16], 0xE0);  // element 33 = -2^-7 / 2^-9 = -4 -> code 6 | 8 = 14 in the high nibble
}

// ---- refusals -------------------------------------------------------------------------------------------
struct BadCase {
  const char* name;
  Format fmt;
  ScaleRule rule;
  Format src;
  int64_t rows, cols;
  int poison;          // element index set to NaN (-1: none), -2: +inf
  const char* expect;  // substring of the one-line error
};
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class Refuses : public ::testing::TestWithParam<BadCase> {};

// covers N-10 (NaN/Inf blocks refused by tensor and block), N-13 (K % 32), unsupported pairs by name
TEST_P(Refuses, ByName) {
  const BadCase& c = GetParam();
  const int64_t n = std::max<int64_t>(c.rows * c.cols, 1);
  std::vector<float> x(n, 1.0f);
  if (c.poison >= 0) x[c.poison] = NAN;
  if (c.poison == -2) x[n - 1] = -INFINITY;
  std::vector<uint8_t> values(std::max<int64_t>(n, 1)), scales(std::max<int64_t>(4 * n, 4));
  const Status st =
      quantize(c.fmt, c.rule, c.src, x.data(), c.rows, c.cols, values.data(), scales.data(), "layers.0.w");
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("layers.0.w"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find(c.expect), std::string::npos) << st.error().message;
  EXPECT_EQ(st.error().message.find('\n'), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Quantize, Refuses,
    ::testing::Values(
        BadCase{"nan_mxfp8", Format::kMXFP8, ScaleRule::kCeil, Format::kF32, 2, 96, 32 * 4 + 5,
                "block (1, 1) holds NaN/Inf"},
        BadCase{"inf_mxfp4", Format::kMXFP4, ScaleRule::kCt, Format::kF32, 2, 64, -2,
                "block (1, 1) holds NaN/Inf"},
        BadCase{"nan_b128", Format::kFP8_B128, ScaleRule::kCeil, Format::kF32, 130, 200, 129 * 200 + 150,
                "block (1, 1) holds NaN/Inf"},
        BadCase{"k_not_32", Format::kMXFP8, ScaleRule::kCeil, Format::kF32, 2, 48, -1,
                "cols % 32 == 0 (got cols 48)"},
        BadCase{"mxfp4_k_not_32", Format::kMXFP4, ScaleRule::kCt, Format::kF32, 1, 16, -1, "cols % 32"},
        BadCase{"mxfp4_rule", Format::kMXFP4, ScaleRule::kCeil, Format::kF32, 1, 32, -1,
                "scale rule ct only"},
        BadCase{"to_e4m3", Format::kE4M3, ScaleRule::kCeil, Format::kF32, 1, 32, -1,
                "cannot quantize to e4m3"},
        BadCase{"from_e4m3", Format::kMXFP8, ScaleRule::kCeil, Format::kE4M3, 1, 32, -1, "from e4m3"},
        BadCase{"negative", Format::kMXFP8, ScaleRule::kCeil, Format::kF32, -1, 32, -1, "negative"}),
    [](const auto& info) { return std::string(info.param.name); });

// covers N-13: empty tensors are fine and write nothing
TEST(Quantize, EmptyTensors) {
  for (Format f : {Format::kMXFP8, Format::kMXFP4, Format::kFP8_B128}) {
    EXPECT_TRUE(quantize(f, default_scale_rule(f), Format::kBF16, nullptr, 0, 64, nullptr, nullptr, "e"));
    EXPECT_TRUE(quantize(f, default_scale_rule(f), Format::kBF16, nullptr, 5, 0, nullptr, nullptr, "e"));
  }
}

// The same values given as bf16, f16 and f32 (all exact in each) quantize to identical bytes.
TEST(Quantize, SourceDtypesAgree) {
  const int64_t rows = 130, cols = 160;
  std::vector<uint16_t> bf(rows * cols), h(rows * cols);
  std::vector<float> f(rows * cols);
  uint32_t s = 12345;
  for (int64_t i = 0; i < rows * cols; ++i) {
    s = s * 1664525u + 1013904223u;
    // note: 3 significant bits, exponents -20..+12: exact in bf16, f16 (incl. its subnormals) and f32
    const float v = std::ldexp(static_cast<float>(4 + (s >> 29)), static_cast<int>((s >> 8) % 33) - 22);
    f[i] = (s & 1) ? -v : v;
    bf[i] = f32_to_bf16(f[i]);
    h[i] = f32_to_f16(f[i]);
    ASSERT_EQ(f16_to_f32(h[i]), f[i]);
  }
  for (Format fmt : {Format::kMXFP8, Format::kMXFP4, Format::kFP8_B128}) {
    std::vector<uint8_t> v[3], sc[3];
    const void* srcs[3] = {bf.data(), h.data(), f.data()};
    const Format kinds[3] = {Format::kBF16, Format::kF16, Format::kF32};
    for (int k = 0; k < 3; ++k) {
      v[k].resize(values_bytes(fmt, rows, cols));
      sc[k].resize(scales_bytes(fmt, rows, cols));
      ASSERT_TRUE(quantize(fmt, default_scale_rule(fmt), kinds[k], srcs[k], rows, cols, v[k].data(),
                           sc[k].data(), "t"));
    }
    EXPECT_EQ(v[0], v[2]) << traits(fmt).name;
    EXPECT_EQ(v[1], v[2]) << traits(fmt).name;
    EXPECT_EQ(sc[0], sc[2]) << traits(fmt).name;
    EXPECT_EQ(sc[1], sc[2]) << traits(fmt).name;
  }
}

// Dequantize = torch's element decode table x the scale, also for a row range of the planes.
TEST(Dequantize, MatchesDecodeTimesScale) {
  const auto in = load_npy("random_f32_in");
  const auto decode = load_npy("decode_e4m3").as<uint32_t>();
  const int64_t rows = in.shape[0], cols = in.shape[1];
  std::vector<uint8_t> values(rows * cols), scales(rows * cols / 32);
  ASSERT_TRUE(quantize(Format::kMXFP8, ScaleRule::kCeil, Format::kF32, in.data.data(), rows, cols,
                       values.data(), scales.data(), "d"));
  std::vector<float> out(rows * cols), part(4 * cols);
  dequantize(Format::kMXFP8, values.data(), scales.data(), rows, cols, out.data());
  dequantize(Format::kMXFP8, values.data() + 5 * cols, scales.data() + 5 * cols / 32, 4, cols, part.data());
  const auto x = in.as<float>();
  for (int64_t i = 0; i < rows * cols; ++i) {
    const float want = std::ldexp(std::bit_cast<float>(decode[values[i]]), scales[i / 32] - 127);
    ASSERT_EQ(out[i], want) << i;
    EXPECT_LE(std::fabs(out[i] - x[i]),
              std::ldexp(std::fabs(x[i]), -4) + std::ldexp(1.0f, scales[i / 32] - 127 - 10));
  }
  for (int64_t i = 0; i < 4 * cols; ++i) EXPECT_EQ(part[i], out[5 * cols + i]);
}

TEST(Dequantize, Fp8B128AndMxfp4) {
  const auto in = load_npy("b128_bf16_129x131_in");
  const int64_t rows = in.shape[0], cols = in.shape[1];
  const auto values = load_npy("b128_bf16_129x131_values").as<uint8_t>();
  const auto scales = load_npy("b128_bf16_129x131_scales").as<float>();
  std::vector<float> out(rows * cols);
  dequantize(Format::kFP8_B128, values.data(), reinterpret_cast<const uint8_t*>(scales.data()), rows, cols,
             out.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(out[r * cols + c], e4m3_to_f32(values[r * cols + c]) * scales[(r / 128) * 2 + c / 128]);
  const auto q4 = load_npy("random_mxfp4_ct_elems").as<uint8_t>();
  const auto s4 = load_npy("random_mxfp4_ct_scale").as<uint8_t>();
  std::vector<float> o4(16 * 256);
  dequantize(Format::kMXFP4, q4.data(), s4.data(), 16, 256, o4.data());
  for (int i = 0; i < 16 * 256; ++i) {
    const uint8_t code = (i % 2) ? q4[i / 2] >> 4 : q4[i / 2] & 0xF;
    ASSERT_EQ(o4[i], std::ldexp(e2m1_to_f32(code), s4[i / 32] - 127)) << i;
  }
}

TEST(ScaleRule, ParseAndName) {
  for (ScaleRule r : {ScaleRule::kCeil, ScaleRule::kOcp, ScaleRule::kFloor, ScaleRule::kCt})
    EXPECT_EQ(parse_scale_rule(scale_rule_name(r)).value(), r);
  EXPECT_EQ(scale_rule_name(ScaleRule::kCt), "ct");
  const auto bad = parse_scale_rule("round");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("'round'"), std::string::npos);
  EXPECT_EQ(default_scale_rule(Format::kMXFP8), ScaleRule::kCeil);
  EXPECT_EQ(default_scale_rule(Format::kMXFP4), ScaleRule::kCt);
}


struct SplitCase {
  Format fmt;
  int64_t rows, cols, split;  // rows [0, split) and [split, rows) quantized by separate calls
};
void PrintTo(const SplitCase& c, std::ostream* os) {
  *os << traits(c.fmt).name << " " << c.rows << "x" << c.cols << " split at " << c.split;
}

class RowSplit : public ::testing::TestWithParam<SplitCase> {};

// Callers split rows across threads (FP8-B128 by 128-row stripes): two calls equal one call, byte for byte.
TEST_P(RowSplit, EqualsWholeTensor) {
  const SplitCase& c = GetParam();
  std::vector<float> x(c.rows * c.cols);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(static_cast<float>(i) * 0.37f) * std::ldexp(1.0f, static_cast<int>(i % 23) - 11);
  const ScaleRule rule = default_scale_rule(c.fmt);
  std::vector<uint8_t> v1(values_bytes(c.fmt, c.rows, c.cols)), s1(scales_bytes(c.fmt, c.rows, c.cols));
  std::vector<uint8_t> v2(v1.size()), s2(s1.size());
  ASSERT_TRUE(quantize(c.fmt, rule, Format::kF32, x.data(), c.rows, c.cols, v1.data(), s1.data(), "whole"));
  ASSERT_TRUE(quantize(c.fmt, rule, Format::kF32, x.data(), c.split, c.cols, v2.data(), s2.data(), "top"));
  ASSERT_TRUE(quantize(c.fmt, rule, Format::kF32, x.data() + c.split * c.cols, c.rows - c.split, c.cols,
                       v2.data() + values_bytes(c.fmt, c.split, c.cols),
                       s2.data() + scales_bytes(c.fmt, c.split, c.cols), "bottom"));
  EXPECT_EQ(v1, v2);
  EXPECT_EQ(s1, s2);
  std::vector<float> d1(x.size()), d2(x.size());
  dequantize(c.fmt, v1.data(), s1.data(), c.rows, c.cols, d1.data());
  dequantize(c.fmt, v1.data() + values_bytes(c.fmt, c.split, c.cols),
             s1.data() + scales_bytes(c.fmt, c.split, c.cols), c.rows - c.split, c.cols, d2.data());
  for (int64_t i = 0; i < (c.rows - c.split) * c.cols; ++i) ASSERT_EQ(d2[i], d1[c.split * c.cols + i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Quantize, RowSplit,
                         ::testing::Values(SplitCase{Format::kMXFP8, 7, 96, 3},
                                           SplitCase{Format::kMXFP4, 5, 64, 1},
                                           SplitCase{Format::kFP8_B128, 300, 200, 128},
                                           SplitCase{Format::kFP8_B128, 257, 129, 256}));


// covers N-10 for 16-bit sources: f16 inf (0x7C00) and a bf16 NaN payload are found by the integer amax
TEST(Quantize, RefusesNanInf16BitSources) {
  for (Format fmt : {Format::kMXFP8, Format::kMXFP4, Format::kFP8_B128}) {
    for (auto [src, bad] :
         {std::pair{Format::kF16, uint16_t{0x7C00}}, std::pair{Format::kBF16, uint16_t{0xFFC1}}}) {
      std::vector<uint16_t> x(3 * 64, 0x3C00);
      x[2 * 64 + 40] = bad;
      std::vector<uint8_t> values(3 * 64), scales(64);
      const Status st =
          quantize(fmt, default_scale_rule(fmt), src, x.data(), 3, 64, values.data(), scales.data(), "w");
      ASSERT_FALSE(st) << traits(fmt).name << " " << traits(src).name;
      const char* where = fmt == Format::kFP8_B128 ? "block (0, 0)" : "block (2, 1)";
      EXPECT_NE(st.error().message.find(where), std::string::npos) << st.error().message;
    }
  }
}

}  // namespace
}  // namespace mxq
