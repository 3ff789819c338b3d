// Element codecs: exhaustive decode against torch's tables, encode∘decode identity, encode sweeps against
// torch / compressed-tensors, and the spec's saturation, tie, zero and NaN cases.
#include "format/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "golden_npy.h"

namespace mxq {
namespace {

using testing::load_npy;

bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

struct DecodeCase {
  const char* name;
  int codes;
  float (*decode)(uint8_t);
};
void PrintTo(const DecodeCase& c, std::ostream* os) { *os << c.name; }

class DecodeAll : public ::testing::TestWithParam<DecodeCase> {};

// covers N-01 (E4M3 / E5M2 / E2M1 codes) and N-03 (E8M0: 2^(c-127), 0xFF is NaN)
TEST_P(DecodeAll, MatchesTorchTable) {
  const DecodeCase& c = GetParam();
  const auto golden = load_npy(std::string("decode_") + c.name).as<uint32_t>();
  ASSERT_EQ(static_cast<int>(golden.size()), c.codes);
  for (int code = 0; code < c.codes; ++code)
    EXPECT_TRUE(same_float(c.decode(static_cast<uint8_t>(code)), std::bit_cast<float>(golden[code])))
        << c.name << " code 0x" << std::hex << code;
}

INSTANTIATE_TEST_SUITE_P(Codec, DecodeAll,
                         ::testing::Values(DecodeCase{"e4m3", 256, e4m3_to_f32},
                                           DecodeCase{"e5m2", 256, e5m2_to_f32},
                                           DecodeCase{"e2m1", 16, e2m1_to_f32},
                                           DecodeCase{"e8m0", 256, e8m0_to_f32}),
                         [](const auto& info) { return std::string(info.param.name); });

// covers N-01, N-02: NaN codes, and encode(decode(c)) == c for every other code
TEST(Codec, E4M3EncodeDecodeIdentity) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_f32(static_cast<uint8_t>(c));
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << c;
      EXPECT_EQ(f32_to_e4m3(v) & 0x7F, 0x7F) << c;  // note: the decoder drops NaN's sign; see E4M3Hand
    } else {
      EXPECT_EQ(f32_to_e4m3(v), c) << "code " << c << " value " << v;
    }
  }
}

// covers N-02 for E5M2 (inf codes saturate, so they are not identities; see Saturation)
TEST(Codec, E5M2EncodeDecodeIdentity) {
  for (int c = 0; c < 256; ++c) {
    const float v = e5m2_to_f32(static_cast<uint8_t>(c));
    if (std::isinf(v)) continue;
    if (std::isnan(v)) {
      EXPECT_EQ(f32_to_e5m2(v) & 0x7F, 0x7F) << c;
    } else {
      EXPECT_EQ(f32_to_e5m2(v), c) << "code " << c << " value " << v;
    }
  }
}

TEST(Codec, E2M1EncodeDecodeIdentity) {
  for (int c = 0; c < 16; ++c) {
    // note: code 8 (-0) decodes to -0.0, and an input of +-0 encodes as code 0 (compressed-tensors)
    EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(static_cast<uint8_t>(c))), c == 8 ? 0 : c) << c;
  }
}

// covers N-03, N-05: 2^(b-127) encodes back to b for all 256 bytes (0xFF: NaN)
TEST(Codec, E8M0EncodeDecodeIdentity) {
  for (int b = 0; b < 256; ++b) EXPECT_EQ(f32_to_e8m0(e8m0_to_f32(static_cast<uint8_t>(b))), b) << b;
  EXPECT_EQ(f32_to_e8m0(0.0f), 0);
  EXPECT_EQ(f32_to_e8m0(-0.0f), 0);
  EXPECT_EQ(f32_to_e8m0(1.0f), 127);
  EXPECT_EQ(f32_to_e8m0(std::nextafter(1.0f, 2.0f)), 128);  // rounds up
  EXPECT_EQ(f32_to_e8m0(-3.0f), 129);                       // sign ignored
  EXPECT_EQ(f32_to_e8m0(INFINITY), 254);
  EXPECT_EQ(f32_to_e8m0(std::bit_cast<float>(0x00400001u)), 1);  // just above 2^-127
  EXPECT_EQ(f32_to_e8m0(std::bit_cast<float>(1u)), 0);
}

// covers N-04: every f32 biased exponent (0..255) x the 8 guard / round / sticky patterns of the mantissa
// (G = bit 22, R = bit 21, S = any of bits 20..0), both signs, against the ceil rule computed from its
// definition (formats.md: b = ceil(log2 |x|) + 127, clamped to [0, 254]; NaN -> 0xFF) in double, where log2
// is exact on powers of two and ceil never lands on the wrong integer. Includes 254's round-up (exponent 254
// with any mantissa bit saturates, never 255) and exponent 255 (inf saturates to 254, NaN is 0xFF).
TEST(Codec, E8M0EncodeEveryExponentAndGrsPattern) {
  int checked = 0;
  for (uint32_t e = 0; e < 256; ++e)
    for (uint32_t grs = 0; grs < 8; ++grs)
      for (uint32_t sign : {0u, 0x80000000u}) {
        const uint32_t man =
            ((grs & 4) ? 0x400000u : 0) | ((grs & 2) ? 0x200000u : 0) | ((grs & 1) ? 0x1u : 0);
        const float x = std::bit_cast<float>(sign | (e << 23) | man);
        int want;
        if (std::isnan(x)) {
          want = 0xFF;
        } else if (x == 0.0f) {
          want = 0;  // no zero in E8M0: the smallest scale, 2^-127
        } else {
          const double b = std::ceil(std::log2(std::fabs(static_cast<double>(x)))) + 127.0;
          want = static_cast<int>(std::clamp(b, 0.0, 254.0));
        }
        EXPECT_EQ(f32_to_e8m0(x), want) << "f32 0x" << std::hex << std::bit_cast<uint32_t>(x);
        ++checked;
      }
  EXPECT_EQ(checked, 256 * 8 * 2);
  EXPECT_EQ(f32_to_e8m0(std::bit_cast<float>(0x7F400000u)), 254);  // 1.5 * 2^127: the round-up saturates
  EXPECT_EQ(f32_to_e8m0(std::bit_cast<float>(0x7F000000u)), 254);  // 2^127 exactly
  EXPECT_EQ(f32_to_e8m0(std::bit_cast<float>(0x7EC00000u)), 254);  // 1.5 * 2^126 rounds up to 2^127
}

struct SweepCase {
  const char* name;
  const char* input;
  const char* output;
  int out_bytes;
  uint32_t (*encode)(float);
};
void PrintTo(const SweepCase& c, std::ostream* os) { *os << c.name; }

class EncodeSweep : public ::testing::TestWithParam<SweepCase> {};

// covers N-07 (ties), N-08 (subnormals, f32 denormals), N-09 (midpoints +- 1 ulp: no double rounding)
TEST_P(EncodeSweep, MatchesTorch) {
  const SweepCase& c = GetParam();
  const auto in = load_npy(c.input).as<uint32_t>();
  const auto out = load_npy(c.output);
  ASSERT_EQ(static_cast<int64_t>(in.size()), out.count());
  int bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    uint32_t want = 0;
    std::memcpy(&want, out.data.data() + i * c.out_bytes, c.out_bytes);
    const uint32_t got = c.encode(std::bit_cast<float>(in[i]));
    if (got != want && ++bad < 10)
      ADD_FAILURE() << c.name << ": f32 0x" << std::hex << in[i] << " (" << std::bit_cast<float>(in[i])
                    << ") -> 0x" << got << ", torch 0x" << want;
  }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Codec, EncodeSweep,
                         ::testing::Values(SweepCase{"e4m3", "encode_e4m3_in", "encode_e4m3_out", 1,
                                                     [](float x) -> uint32_t { return f32_to_e4m3(x); }},
                                           SweepCase{"e5m2", "encode_e5m2_in", "encode_e5m2_out", 1,
                                                     [](float x) -> uint32_t { return f32_to_e5m2(x); }},
                                           SweepCase{"bf16", "encode_16_in", "encode_bf16_out", 2,
                                                     [](float x) -> uint32_t { return f32_to_bf16(x); }},
                                           SweepCase{"f16", "encode_16_in", "encode_f16_out", 2,
                                                     [](float x) -> uint32_t { return f32_to_f16(x); }}),
                         [](const auto& info) { return std::string(info.param.name); });

// covers N-07, N-08: compressed-tensors' cast_to_fp4 + pack_fp4_to_uint8 on the E2M1 sweep
TEST(Codec, E2M1SweepMatchesCompressedTensors) {
  const auto in = load_npy("encode_e2m1_in").as<uint32_t>();
  const auto packed = load_npy("encode_e2m1_packed").as<uint8_t>();
  ASSERT_EQ(in.size(), packed.size() * 2);
  for (size_t j = 0; j < packed.size(); ++j) {
    const float lo = std::bit_cast<float>(in[2 * j]), hi = std::bit_cast<float>(in[2 * j + 1]);
    EXPECT_EQ(f32_to_e2m1(lo) | (f32_to_e2m1(hi) << 4), packed[j]) << "pair " << lo << ", " << hi;
  }
}

struct HandCase {
  float x;
  int want;
};
void PrintTo(const HandCase& c, std::ostream* os) { *os << c.x << " -> 0x" << std::hex << c.want; }

class E4M3Hand : public ::testing::TestWithParam<HandCase> {};
// covers N-06 (overflow saturates, formats.md), N-07 (400 at exp 8, subnormal midpoints), N-09
TEST_P(E4M3Hand, Encodes) { EXPECT_EQ(f32_to_e4m3(GetParam().x), GetParam().want); }
INSTANTIATE_TEST_SUITE_P(Codec, E4M3Hand,
                         ::testing::Values(HandCase{449.0f, 0x7E}, HandCase{464.0f, 0x7E},
                                           HandCase{465.0f, 0x7E}, HandCase{485.0f, 0x7E},
                                           HandCase{1e6f, 0x7E}, HandCase{INFINITY, 0x7E},
                                           HandCase{-INFINITY, 0xFE}, HandCase{-1e6f, 0xFE},
                                           HandCase{NAN, 0x7F}, HandCase{-NAN, 0xFF}, HandCase{-0.0f, 0x80},
                                           HandCase{-1e-9f, 0x80}, HandCase{400.0f, 0x7C},
                                           HandCase{0x1p-10f, 0x00}, HandCase{0x3p-10f, 0x02},
                                           HandCase{0x1p-149f, 0x00}, HandCase{0x1.1p0f, 0x38},
                                           HandCase{0x1.100002p0f, 0x39}, HandCase{0x1.10001p0f, 0x39}));

class E5M2Hand : public ::testing::TestWithParam<HandCase> {};
// covers N-06 for E5M2: RNE saturating at 57344 (formats.md), NaN keeps its sign
TEST_P(E5M2Hand, Encodes) { EXPECT_EQ(f32_to_e5m2(GetParam().x), GetParam().want); }
INSTANTIATE_TEST_SUITE_P(Codec, E5M2Hand,
                         ::testing::Values(HandCase{57344.0f, 0x7B}, HandCase{61440.0f, 0x7B},
                                           HandCase{1e9f, 0x7B}, HandCase{INFINITY, 0x7B},
                                           HandCase{-INFINITY, 0xFB}, HandCase{NAN, 0x7F},
                                           HandCase{-0.0f, 0x80}, HandCase{0x1p-17f, 0x00},
                                           HandCase{0x3p-17f, 0x02}));

class E2M1Hand : public ::testing::TestWithParam<HandCase> {};
// covers N-07 (ties to the even code), N-06 (saturation at 6), the -0 rule of formats.md
TEST_P(E2M1Hand, Encodes) { EXPECT_EQ(f32_to_e2m1(GetParam().x), GetParam().want); }
INSTANTIATE_TEST_SUITE_P(Codec, E2M1Hand,
                         ::testing::Values(HandCase{0.25f, 0}, HandCase{0.75f, 2}, HandCase{1.25f, 2},
                                           HandCase{1.75f, 4}, HandCase{2.5f, 4}, HandCase{3.5f, 6},
                                           HandCase{5.0f, 6}, HandCase{5.0001f, 7}, HandCase{100.0f, 7},
                                           HandCase{INFINITY, 7}, HandCase{0.0f, 0}, HandCase{-0.0f, 0},
                                           HandCase{-0.1f, 8}, HandCase{-0.25f, 8}, HandCase{-0.3f, 9},
                                           HandCase{-6.0f, 15}, HandCase{0x1p-149f, 0},
                                           HandCase{-0x1p-149f, 8}));

}  // namespace
}  // namespace mxq
