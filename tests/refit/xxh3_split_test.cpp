// The XXH3-64 identities the device refit kernels rely on, checked on the host against libxxhash with the
// same helpers (cuda/xxh3_device.cuh is plain C++): refit_batch.cu builds each 1 KiB block's lane sums from
// 16-byte units (lane l of half h: stripe 8h + l/4, word pair l % 4) in any order, and sum_delta.cu updates
// kept sums word by word with (new term - old term). The GPU tests check the kernels themselves bitwise.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <random>
#include <vector>

#include "cuda/xxh3_device.cuh"

namespace mxq::cuda::xxh3 {
namespace {

uint64_t word_at(const std::vector<uint8_t>& b, uint64_t p) {
  uint64_t w = 0;
  std::memcpy(&w, b.data() + p, 8);
  return w;
}

// Block sums the way refit_batch.cu forms them: per 16-byte unit, keys by (half, lane), summed per pair.
std::vector<uint64_t> unit_block_sums(const std::vector<uint8_t>& in) {
  const uint64_t blocks = full_blocks(in.size());
  std::vector<uint64_t> sums(blocks * 8, 0);
  for (uint64_t blk = 0; blk < blocks; ++blk)
    for (int lane = 31; lane >= 0; --lane)  // note: any order; the kernel's shuffle tree is another
      for (int h = 0; h < 2; ++h) {
        const int i = 2 * (lane & 3), s = 8 * h + lane / 4;
        const uint64_t q =
            blk * kBlockBytes + static_cast<uint64_t>(h) * 512 + 16 * static_cast<uint64_t>(lane);
        unit_terms(word_at(in, q), word_at(in, q + 8), secret64(8 * s + 8 * i), secret64(8 * s + 8 * i + 8),
                   sums[blk * 8 + static_cast<uint64_t>(i)], sums[blk * 8 + static_cast<uint64_t>(i) + 1]);
      }
  return sums;
}

// The chain, tail and merge over given block sums (refit_batch.cu's chain()).
uint64_t finish(const std::vector<uint8_t>& in, const std::vector<uint64_t>& sums) {
  const uint64_t len = in.size(), blocks = full_blocks(len);
  uint64_t acc[8];
  for (int i = 0; i < 8; ++i) {
    acc[i] = init_acc(i);
    for (uint64_t n = 0; n < blocks; ++n)
      acc[i] = scramble(acc[i] + sums[n * 8 + static_cast<uint64_t>(i)], scramble_key(i));
    const uint64_t tail = blocks * kBlockBytes;
    for (int st = 0; st < tail_stripes(len); ++st) {
      const uint64_t p = tail + static_cast<uint64_t>(st) * kStripeBytes;
      acc[i] += stripe_lane(word_at(in, p + 8 * static_cast<uint64_t>(i)),
                            word_at(in, p + 8 * static_cast<uint64_t>(i ^ 1)), i, 8 * st);
    }
    const uint64_t last = len - kStripeBytes;
    acc[i] += stripe_lane(word_at(in, last + 8 * static_cast<uint64_t>(i)),
                          word_at(in, last + 8 * static_cast<uint64_t>(i ^ 1)), i, kLastStripeSecret);
  }
  return merge(acc, len);
}

TEST(Xxh3Terms, UnitLanePairSumsGiveTheHash) {
  std::mt19937_64 rng(std::random_device{}());
  for (uint64_t len : {1040ull, 2048ull, 4096ull + 48, 65536ull, 131072ull + 1024 + 16}) {
    std::vector<uint8_t> in(len);
    for (auto& b : in) b = static_cast<uint8_t>(rng());
    EXPECT_EQ(finish(in, unit_block_sums(in)), XXH3_64bits(in.data(), len)) << len;
  }
}

TEST(Xxh3Terms, WordTermUpdatesKeepBlockSums) {
  std::mt19937_64 rng(std::random_device{}());
  const uint64_t len = 16 * 1024 + 48;
  std::vector<uint8_t> in(len);
  for (auto& b : in) b = static_cast<uint8_t>(rng());
  std::vector<uint64_t> kept = unit_block_sums(in);
  const uint64_t blocks = full_blocks(len);
  for (int round = 0; round < 2000; ++round) {
    const uint64_t word = rng() % (len / 8);
    const uint64_t old = word_at(in, word * 8);
    for (int b = 0; b < 8; ++b)
      if (rng() % 3 == 0) in[word * 8 + static_cast<uint64_t>(b)] = static_cast<uint8_t>(rng());
    const uint64_t now = word_at(in, word * 8);
    // sum_delta.cu: stripe and lane of the word, its two sums.
    const uint64_t block = word * 8 / kBlockBytes;
    if (block >= blocks) continue;
    const int s = static_cast<int>(word * 8 % kBlockBytes / kStripeBytes), i = static_cast<int>(word % 8);
    const uint64_t key = secret64(8 * s + 8 * i);
    kept[block * 8 + static_cast<uint64_t>(i ^ 1)] += now - old;
    kept[block * 8 + static_cast<uint64_t>(i)] += mul_term(now, key) - mul_term(old, key);
  }
  EXPECT_EQ(kept, unit_block_sums(in));
  EXPECT_EQ(finish(in, kept), XXH3_64bits(in.data(), len));
}

}  // namespace
}  // namespace mxq::cuda::xxh3
