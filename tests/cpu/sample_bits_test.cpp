// The counter-based draw of batched sampling: Philox4x32-10 against the Random123 known answer, and
// sample(..., random_bits) equal to sample(..., rng) fed the same 64 bits (the twin cuda/sample follows).
#include <gtest/gtest.h>

#include <random>

#include "cpu/philox.h"
#include "cpu/sampling.h"
#include "test_util.h"

namespace mxq {
namespace {

TEST(Philox, KnownAnswerAndCounterDependence) {
  // Random123 kat_vectors: philox4x32_10, counter 0, key 0 → 6627e8d5 e169c58d bc57ac4c 9b00dbd8
  EXPECT_EQ(philox_random_bits(0, 0), 0xe169c58d6627e8d5ull);
  EXPECT_NE(philox_random_bits(1, 0), philox_random_bits(0, 0));
  EXPECT_NE(philox_random_bits(0, 1), philox_random_bits(0, 0));
  EXPECT_NE(philox_random_bits(0, 1ull << 32), philox_random_bits(0, 1));
}

TEST(SampleWithBits, EqualsTheGeneratorPathOnTheSameDraw) {
  std::mt19937_64 rng(41);
  const int64_t vocab = 3000;
  for (int i = 0; i < 40; ++i) {
    const auto logits = test::random_floats(rng, static_cast<size_t>(vocab), 2.0f);
    const SamplingParams p{i % 4 == 0 ? 0.0f : 0.9f, i % 3 == 0 ? 30 : 0, i % 5 == 0 ? 0.8f : 1.0f,
                           i % 7 == 0 ? 0.05f : 0.0f, 0};
    std::mt19937_64 gen(static_cast<uint64_t>(1000 + i)), copy = gen;
    const auto a = sample(logits.data(), vocab, p, gen);
    const auto b = sample(logits.data(), vocab, p, p.temperature < 1e-5f ? uint64_t{0} : copy());
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->id, b->id) << i;
    EXPECT_EQ(a->logprob, b->logprob) << i;
    if (p.temperature < 1e-5f) {
      EXPECT_EQ(gen, copy) << "greedy must not draw";
    }
  }
}

}  // namespace
}  // namespace mxq
