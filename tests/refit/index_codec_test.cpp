// Index encodings: round trips of every encoding over sets of every shape, bytes written out by hand from
// docs/refit-format.md, and the decoder's refusals (W-01 / W-02 / W-03 / W-04).
#include "refit/index_codec.h"

#include <gtest/gtest.h>

#include <random>

namespace mxq::refit {
namespace {

struct SetCase {
  std::string name;
  int64_t entries;
  std::vector<int64_t> indices;
};
void PrintTo(const SetCase& c, std::ostream* os) {
  *os << c.name << " (" << c.indices.size() << " of " << c.entries << ")";
}

std::vector<int64_t> random_set(int64_t entries, double p, bool clustered, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> out;
  std::bernoulli_distribution start(clustered ? p / 16 : p);
  for (int64_t i = 0; i < entries; ++i)
    if (start(rng)) {
      // note: clustered sets are runs of 16, like a changed row segment of one MX block.
      const int64_t len = clustered ? std::min<int64_t>(16, entries - i) : 1;
      for (int64_t k = 0; k < len; ++k) out.push_back(i + k);
      i += len - 1;
    }
  return out;
}

std::vector<SetCase> set_cases() {
  std::vector<SetCase> c = {
      {"empty", 100, {}},
      {"first", 100, {0}},
      {"last", 100, {99}},
      {"all", 37, {}},
      {"edges_of_byte", 17, {7, 8, 15, 16}},
      {"big_gap", int64_t{1} << 40, {0, (int64_t{1} << 40) - 1}},
  };
  for (int64_t i = 0; i < 37; ++i) c[3].indices.push_back(i);
  for (double p : {0.001, 0.01, 0.05, 0.2})
    for (bool clustered : {false, true})
      c.push_back({fmt::format("{}_{}", clustered ? "clustered" : "random", static_cast<int>(p * 1000)),
                   20011, random_set(20011, p, clustered, static_cast<uint32_t>(p * 1e4) + clustered)});
  return c;
}

class IndexRoundTrip : public ::testing::TestWithParam<SetCase> {};

TEST_P(IndexRoundTrip, EveryEncodingDecodesToTheSameSet) {
  const SetCase& c = GetParam();
  ASSERT_TRUE(check_indices(c.indices, c.entries));
  for (int e = 0; e < kIndexEncodingCount; ++e) {
    const auto enc = static_cast<IndexEncoding>(e);
    if (enc == IndexEncoding::kBitmap && c.entries > (int64_t{1} << 24)) continue;  // a 128 GiB bitmap
    std::vector<uint8_t> bytes = {0xAA};  // encode appends: a byte already there must stay
    encode_indices(enc, c.indices, c.entries, bytes);
    EXPECT_EQ(bytes[0], 0xAA);
    EXPECT_EQ(static_cast<int64_t>(bytes.size()) - 1, encoded_size(enc, c.indices, c.entries))
        << encoding_name(enc);
    auto back =
        decode_indices(enc, std::span(bytes).subspan(1), static_cast<int64_t>(c.indices.size()), c.entries);
    ASSERT_TRUE(back) << encoding_name(enc) << ": " << back.error().message;
    EXPECT_EQ(*back, c.indices) << encoding_name(enc);
  }
}

TEST_P(IndexRoundTrip, ChoiceIsTheSmallestLowestCode) {
  const SetCase& c = GetParam();
  const IndexEncoding chosen = choose_encoding(c.indices, c.entries);
  if (c.indices.empty()) {
    EXPECT_EQ(chosen, IndexEncoding::kGaps);
    return;
  }
  const int64_t mine = encoded_size(chosen, c.indices, c.entries);
  for (int e = 0; e < kIndexEncodingCount; ++e) {
    const int64_t other = encoded_size(static_cast<IndexEncoding>(e), c.indices, c.entries);
    EXPECT_TRUE(mine < other || (mine == other && static_cast<int>(chosen) <= e)) << encoding_name(chosen);
  }
}

INSTANTIATE_TEST_SUITE_P(Sets, IndexRoundTrip, ::testing::ValuesIn(set_cases()),
                         [](const auto& info) { return info.param.name; });

// Bytes worked out by hand from docs/refit-format.md for {0, 1, 2, 200} in 300 entries.
TEST(IndexBytes, SpecExample) {
  const std::vector<int64_t> idx = {0, 1, 2, 200};
  std::vector<uint8_t> gaps, runs, bitmap;
  encode_indices(IndexEncoding::kGaps, idx, 300, gaps);
  encode_indices(IndexEncoding::kRuns, idx, 300, runs);
  encode_indices(IndexEncoding::kBitmap, idx, 300, bitmap);
  EXPECT_EQ(gaps, (std::vector<uint8_t>{0x00, 0x01, 0x01, 0xC6, 0x01}));  // 0, +1, +1, +198
  EXPECT_EQ(runs, (std::vector<uint8_t>{0x00, 0x03, 0xC5, 0x01, 0x01}));  // skip 0 len 3, skip 197 len 1
  ASSERT_EQ(bitmap.size(), 38u);
  EXPECT_EQ(bitmap[0], 0x07);
  EXPECT_EQ(bitmap[25], 0x01);                                 // 200 = 25 * 8 + 0
  EXPECT_EQ(choose_encoding(idx, 300), IndexEncoding::kGaps);  // 5 bytes vs 38 and 5: tie goes to gaps
}

struct BadIndexCase {
  std::string name;
  IndexEncoding encoding;
  std::vector<uint8_t> data;
  int64_t count, entries;
  std::string expect;  // substring of the error
};
void PrintTo(const BadIndexCase& c, std::ostream* os) { *os << c.name; }

class IndexRefusal : public ::testing::TestWithParam<BadIndexCase> {};

TEST_P(IndexRefusal, NamesTheFault) {
  const BadIndexCase& c = GetParam();
  auto r = decode_indices(c.encoding, c.data, c.count, c.entries);
  ASSERT_FALSE(r) << c.name;
  EXPECT_NE(r.error().message.find(c.expect), std::string::npos) << r.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    Bad, IndexRefusal,
    ::testing::Values(
        // covers W-01
        BadIndexCase{"gap_past_end", IndexEncoding::kGaps, {0x05, 0x05}, 2, 10, "outside [0, 10)"},
        BadIndexCase{"first_past_end", IndexEncoding::kGaps, {0x0A}, 1, 10, "outside [0, 10)"},
        BadIndexCase{"bitmap_pad_bit", IndexEncoding::kBitmap, {0x00, 0x04}, 1, 10, "past entry 9"},
        BadIndexCase{"run_past_end", IndexEncoding::kRuns, {0x08, 0x03}, 3, 10, "passes the plane end"},
        BadIndexCase{"varint_over_63_bits",
                     IndexEncoding::kGaps,
                     {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01},
                     1,
                     10,
                     "2^63"},
        // covers W-02
        BadIndexCase{"zero_gap", IndexEncoding::kGaps, {0x03, 0x00}, 2, 10, "repeats"},
        BadIndexCase{"touching_runs", IndexEncoding::kRuns, {0x00, 0x02, 0x00, 0x02}, 4, 10, "touches"},
        // covers W-03
        BadIndexCase{"bitmap_count", IndexEncoding::kBitmap, {0x03, 0x00}, 3, 10, "sets 2 bits"},
        BadIndexCase{"bitmap_size", IndexEncoding::kBitmap, {0x03}, 2, 10, "expected 2"},
        BadIndexCase{"runs_short", IndexEncoding::kRuns, {0x00, 0x02}, 3, 10, "cover 2"},
        BadIndexCase{"runs_long", IndexEncoding::kRuns, {0x00, 0x05}, 3, 10, "more than the 3"},
        BadIndexCase{"gaps_left_over", IndexEncoding::kGaps, {0x01, 0x01, 0x01}, 2, 10, "left after"},
        BadIndexCase{"gaps_cut_off", IndexEncoding::kGaps, {0x01, 0x81}, 2, 10, "cut off"},
        BadIndexCase{"count_past_plane", IndexEncoding::kRuns, {}, 11, 10, "plane of 10"},
        BadIndexCase{"count_beyond_bytes", IndexEncoding::kGaps, {0x01}, 5, 10, "cannot fit"},
        // non-canonical spellings the writer never makes
        BadIndexCase{"non_minimal_varint", IndexEncoding::kGaps, {0x81, 0x00}, 1, 10, "non-minimal"},
        BadIndexCase{"empty_run", IndexEncoding::kRuns, {0x01, 0x00}, 0, 10, "empty run"}),
    [](const auto& info) { return info.param.name; });

struct CheckCase {
  std::string name;
  std::vector<int64_t> indices;
  std::string expect;
};
void PrintTo(const CheckCase& c, std::ostream* os) { *os << c.name; }
class IndexCheck : public ::testing::TestWithParam<CheckCase> {};
TEST_P(IndexCheck, Refuses) {
  auto s = check_indices(GetParam().indices, 10);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find(GetParam().expect), std::string::npos) << s.error().message;
}
INSTANTIATE_TEST_SUITE_P(Bad, IndexCheck,
                         ::testing::Values(CheckCase{"negative", {-1, 2}, "W-01"},     // covers W-01
                                           CheckCase{"equal_numel", {2, 10}, "W-01"},  // covers W-01
                                           CheckCase{"duplicate", {2, 2}, "W-02"},     // covers W-02
                                           CheckCase{"unsorted", {5, 2}, "W-04"}),     // covers W-04
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace mxq::refit
