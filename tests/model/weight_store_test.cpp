#include "model/weight_store.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>

namespace mxq {
namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

struct StoreCase {
  Format format;
  std::vector<int64_t> shape;
  int64_t values, scales;
};
void PrintTo(const StoreCase& c, std::ostream* os) {
  *os << traits(c.format).name << " [" << fmt::format("{}", fmt::join(c.shape, ",")) << "]";
}

class WeightStorePlanes : public ::testing::TestWithParam<StoreCase> {};

TEST_P(WeightStorePlanes, ApplyWritesInPlaceAndChecksumsCanonicalBytes) {
  const StoreCase& c = GetParam();
  WeightStore ws;
  ASSERT_TRUE(ws.add("w", c.format, c.shape));
  const QTensor& t = ws.at("w");
  ASSERT_EQ(static_cast<int64_t>(t.values.size()), c.values);
  ASSERT_EQ(static_cast<int64_t>(t.scales.size()), c.scales);
  const uint8_t* before = t.values.data();
  for (uint32_t round = 0; round < 3; ++round) {
    auto v = random_bytes(c.values, 2 * round), s = random_bytes(c.scales, 2 * round + 1);
    ASSERT_TRUE(ws.apply_tensor("w", v, s));
    EXPECT_EQ(t.values.data(), before) << "buffers never move";
    EXPECT_TRUE(std::equal(v.begin(), v.end(), t.values.begin()));
    std::vector<uint8_t> cat(v);
    cat.insert(cat.end(), s.begin(), s.end());
    EXPECT_EQ(t.checksum, XXH3_64bits(cat.data(), cat.size()));  // one-shot vs the store's streaming hash
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, WeightStorePlanes,
                         ::testing::Values(StoreCase{Format::kBF16, {3, 5}, 30, 0},
                                           StoreCase{Format::kF32, {7}, 28, 0},
                                           StoreCase{Format::kMXFP8, {4, 64}, 256, 8},
                                           StoreCase{Format::kMXFP4, {4, 64}, 128, 8},
                                           StoreCase{Format::kMXFP4, {2, 4, 64}, 256, 16},
                                           StoreCase{Format::kFP8_B128, {130, 300}, 39000, 2 * 3 * 4}));

// covers W-08: a full update of the wrong size is refused and writes nothing.
TEST(WeightStore, RefusesWrongSizeAndUnknownNames) {
  WeightStore ws;
  ASSERT_TRUE(ws.add("w", Format::kMXFP8, {2, 32}));
  const uint64_t before = ws.at("w").checksum;
  std::vector<uint8_t> v(63), s(2);
  auto st = ws.apply_tensor("w", v, s);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("expected 64 and 2"), std::string::npos) << st.error().message;
  EXPECT_EQ(ws.at("w").checksum, before);
  EXPECT_FALSE(ws.apply_tensor("nope", v, s));
  EXPECT_FALSE(ws.add("w", Format::kBF16, {1}));
  EXPECT_FALSE(ws.add("k", Format::kMXFP8, {2, 33}));  // K not a multiple of 32
  EXPECT_FALSE(ws.add("z", Format::kMXFP8, {0, int64_t{1} << 62}));  // a zero dim must not hide a huge one
}

TEST(WeightStore, ScatterSparseWritesOnlyItsOwnLivePlanes) {
  // refit's device path writes through the store (its one writer), which refuses a span it does not own
  WeightStore ws;
  ASSERT_TRUE(ws.add("w", Format::kMXFP8, {2, 32}));
  std::vector<uint8_t> elsewhere(64, 1), bytes{9}, undo(1);
  SparsePlaneJob j;
  j.what = "w values";
  j.native = elsewhere;
  j.count = 1;
  j.entries = 64;
  j.bytes = bytes;
  j.undo = undo;
  const std::vector<uint8_t> positions(4, 0);
  auto st = ws.scatter_sparse({&j, 1}, positions);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().message, "w values: the plane to scatter into is not a live plane of this store");
  EXPECT_EQ(elsewhere, std::vector<uint8_t>(64, 1));
}

}  // namespace
}  // namespace mxq
