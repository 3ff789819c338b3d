#include "cpu/embedding.h"

#include <gtest/gtest.h>

#include <cstring>
#include <ostream>

#include "format/codec.h"
#include "test_util.h"

namespace mxq {
namespace {

struct EmbeddingCase {
  Format format;
  int64_t vocab, dim, count;
};
void PrintTo(const EmbeddingCase& c, std::ostream* os) {
  *os << traits(c.format).name << " vocab=" << c.vocab << " dim=" << c.dim << " ids=" << c.count;
}

class CpuEmbedding : public ::testing::TestWithParam<EmbeddingCase> {};

// A gather is exact: every output equals the decoded table entry bit for bit.
TEST_P(CpuEmbedding, GathersDecodedRowsExactly) {
  const EmbeddingCase& c = GetParam();
  std::mt19937_64 rng(c.vocab + c.dim);
  const int64_t elem_bytes = traits(c.format).element_bits / 8;
  std::vector<float> f = test::random_floats(rng, c.vocab * c.dim);
  std::vector<uint8_t> table(static_cast<size_t>(c.vocab * c.dim * elem_bytes));
  std::vector<float> decoded(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    if (c.format == Format::kBF16) {
      uint32_t bits;
      std::memcpy(&bits, &f[i], 4);
      const auto h = static_cast<uint16_t>(bits >> 16);
      std::memcpy(&table[2 * i], &h, 2);
      decoded[i] = bf16_to_f32(h);
    } else {
      std::memcpy(&table[4 * i], &f[i], 4);
      decoded[i] = f[i];
    }
  }
  std::vector<int32_t> ids(c.count);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % c.vocab);
  ids.back() = static_cast<int32_t>(c.vocab - 1);
  std::vector<float> out(c.count * c.dim);
  ASSERT_TRUE(embedding(ids.data(), c.count, WeightView{c.format, c.vocab, c.dim, table.data(), nullptr},
                        out.data()));
  for (int64_t i = 0; i < c.count; ++i)
    EXPECT_EQ(0, std::memcmp(&out[i * c.dim], &decoded[ids[i] * c.dim], c.dim * sizeof(float)))
        << "id " << ids[i];
}

INSTANTIATE_TEST_SUITE_P(CpuEmbedding, CpuEmbedding,
                         ::testing::Values(EmbeddingCase{Format::kBF16, 1000, 64, 1},
                                           EmbeddingCase{Format::kBF16, 37, 100, 17},
                                           EmbeddingCase{Format::kF32, 500, 96, 64},
                                           EmbeddingCase{Format::kF32, 3, 7, 5}),
                         [](const ::testing::TestParamInfo<EmbeddingCase>& i) {
                           return std::string(traits(i.param.format).name) + "_V" +
                                  std::to_string(i.param.vocab) + "_D" + std::to_string(i.param.dim) + "_n" +
                                  std::to_string(i.param.count);
                         });

// covers H-07 (token id >= vocab or < 0 reaching the model: refused, no out-of-bounds read)
TEST(CpuEmbedding, RefusesIdsOutsideTheVocabularyByPosition) {
  std::vector<uint8_t> table(10 * 4 * 2, 0x3F);
  std::vector<float> out(3 * 4);
  const WeightView view{Format::kBF16, 10, 4, table.data(), nullptr};
  const int32_t high[] = {1, 10, 2}, low[] = {-1, 0, 0};
  Status s = embedding(high, 3, view, out.data());
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("token id 10 at position 1"), std::string::npos) << s.error().message;
  EXPECT_FALSE(embedding(low, 3, view, out.data()));
}

}  // namespace
}  // namespace mxq
