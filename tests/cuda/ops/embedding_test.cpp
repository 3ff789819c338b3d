// GPU embedding gather against cpu/embedding on fresh random bf16 tables: bitwise (f32 and bf16 outputs),
// ragged hidden sizes, a device token count below the capacity (rows past it stay poisoned), and
// out-of-range ids flagged on the device with a zero row and no out-of-bounds read.
#include "cuda/ops/embedding.h"

#include <climits>

#include "../op_test_util.h"
#include "cpu/embedding.h"

namespace mxq::cuda {
namespace {

struct EmbCase {
  int64_t vocab, hidden, tokens, capacity;
};
void PrintTo(const EmbCase& c, std::ostream* os) {
  *os << "vocab=" << c.vocab << " hidden=" << c.hidden << " tokens=" << c.tokens << "/" << c.capacity;
}

class Embedding : public ::testing::TestWithParam<EmbCase> {};

TEST_P(Embedding, BitwiseEqualsCpuTwin) {
  const EmbCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto table = test::normal_bf16(rng, static_cast<size_t>(c.vocab * c.hidden));
  std::uniform_int_distribution<int32_t> id_dist(0, static_cast<int32_t>(c.vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(c.capacity));
  for (auto& i : ids) i = id_dist(rng);
  std::vector<float> ref(static_cast<size_t>(c.tokens * c.hidden));
  const WeightView view{Format::kBF16, c.vocab, c.hidden, reinterpret_cast<const uint8_t*>(table.data()),
                        nullptr};
  ASSERT_TRUE(embedding(ids.data(), c.tokens, view, ref.data()));

  auto dt = test::must(test::upload(table));
  auto di = test::must(test::upload(ids));
  auto dn = test::must(test::upload(std::vector<int32_t>{static_cast<int32_t>(c.tokens)}));
  auto dbad = test::must(test::upload(std::vector<int32_t>{INT_MAX}));
  const size_t cap = static_cast<size_t>(c.capacity * c.hidden);
  auto of = test::must(test::poisoned<float>(cap));
  auto ob = test::must(test::poisoned<uint16_t>(cap));
  ASSERT_EQ(launch_embedding_f32(dt.as<uint16_t>(), c.vocab, c.hidden, di.as<int32_t>(), dn.as<int32_t>(),
                                 c.capacity, of.as<float>(), dbad.as<int32_t>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(launch_embedding_bf16(dt.as<uint16_t>(), c.vocab, c.hidden, di.as<int32_t>(), dn.as<int32_t>(),
                                  c.capacity, ob.as<uint16_t>(), dbad.as<int32_t>(), nullptr),
            cudaSuccess);
  const auto f = test::must(test::download<float>(of, cap));
  const auto b = test::must(test::download<uint16_t>(ob, cap));
  const auto bad = test::must(test::download<int32_t>(dbad, 1));
  EXPECT_EQ(bad[0], INT_MAX);
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(f[i]), std::bit_cast<uint32_t>(ref[i])) << "f32 element " << i;
    ASSERT_EQ(b[i], table[static_cast<size_t>(ids[i / c.hidden] * c.hidden + i % c.hidden)]) << "bf16 " << i;
  }
  for (size_t i = ref.size(); i < cap; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(f[i]), 0xFFFFFFFFu) << "row past num_tokens written at " << i;
    ASSERT_EQ(b[i], 0xFFFF) << "row past num_tokens written at " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Embedding,
                         ::testing::Values(EmbCase{1, 8, 1, 1}, EmbCase{4096, 384, 7, 9},
                                           EmbCase{5000, 1000, 33, 33}, EmbCase{151936, 4096, 5, 16},
                                           EmbCase{300, 2056, 130, 200}));

TEST(EmbeddingBadIds, FlaggedOnDeviceWithZeroRowsNotRead) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t vocab = 100, hidden = 64;
  const auto table = test::normal_bf16(rng, static_cast<size_t>(vocab * hidden));
  const std::vector<int32_t> ids = {3, 99, 100, -1, 5, INT_MAX};
  const WeightView view{Format::kBF16, vocab, hidden, reinterpret_cast<const uint8_t*>(table.data()),
                        nullptr};
  std::vector<float> ref(ids.size() * hidden);
  EXPECT_FALSE(
      embedding(ids.data(), static_cast<int64_t>(ids.size()), view, ref.data()));  // the twin refuses
  auto dt = test::must(test::upload(table));
  auto di = test::must(test::upload(ids));
  auto dbad = test::must(test::upload(std::vector<int32_t>{INT_MAX}));
  auto of = test::must(test::poisoned<float>(ids.size() * hidden));
  ASSERT_EQ(
      launch_embedding_f32(dt.as<uint16_t>(), vocab, hidden, di.as<int32_t>(), nullptr,
                           static_cast<int64_t>(ids.size()), of.as<float>(), dbad.as<int32_t>(), nullptr),
      cudaSuccess);
  const auto f = test::must(test::download<float>(of, ids.size() * hidden));
  EXPECT_EQ(test::must(test::download<int32_t>(dbad, 1))[0], 2);  // the first bad token
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t d = 0; d < hidden; ++d) {
      const bool ok = ids[t] >= 0 && ids[t] < vocab;
      const float want = ok ? bf16_to_f32(table[static_cast<size_t>(ids[t] * hidden + d)]) : 0.0f;
      ASSERT_EQ(f[t * hidden + d], want) << "token " << t << " dim " << d;
    }
  EXPECT_EQ(launch_embedding_f32(dt.as<uint16_t>(), vocab, 60, di.as<int32_t>(), nullptr, 1, of.as<float>(),
                                 dbad.as<int32_t>(), nullptr),
            cudaErrorInvalidValue);  // hidden not a multiple of 8
}

}  // namespace
}  // namespace mxq::cuda
