// The XXH3-64 identities the device refit kernels rely on, checked on the host against libxxhash with the
// same helpers (cuda/refit/xxh3_device.cuh is plain C++): refit_batch.cu builds each 1 KiB block's lane sums
// from whole stripes (lane h of a pair: stripes 2k + h, keys picked by a parity mask), the pair's two partial
// sums added; its chain folds each block's sum into the previous scramble (scramble_add); sum_delta.cu
// updates kept sums word by word with (new term - old term). The GPU tests check the kernels themselves
// bitwise.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <random>
#include <vector>

#include "cuda/refit/xxh3_device.cuh"

namespace mxq::cuda::xxh3 {
namespace {

uint64_t word_at(const std::vector<uint8_t>& b, uint64_t p) {
  uint64_t w = 0;
  std::memcpy(&w, b.data() + p, 8);
  return w;
}

// Block sums the way refit_batch.cu forms them: per lane of a pair, its stripes 2k + h with keys
// word(j) ^ (mask & (word(j) ^ word(j + 1))), j = 2k + i; the two lanes' sums added.
std::vector<uint64_t> unit_block_sums(const std::vector<uint8_t>& in) {
  const uint64_t blocks = full_blocks(in.size());
  std::vector<uint64_t> sums(blocks * 8, 0);
  for (uint64_t blk = 0; blk < blocks; ++blk)
    for (int h = 1; h >= 0; --h) {  // note: any order
      const uint64_t hm = 0ull - static_cast<uint64_t>(h);
      uint64_t acc[8] = {};
      for (int k = 0; k < 8; ++k)
        for (int u = 0; u < 4; ++u) {
          const uint64_t q = blk * kBlockBytes + static_cast<uint64_t>(2 * k + h) * kStripeBytes + 16 * u;
          const int j = 2 * k + 2 * u;
          const uint64_t ka = secret64(8 * j) ^ (hm & (secret64(8 * j) ^ secret64(8 * j + 8)));
          const uint64_t kb = secret64(8 * j + 8) ^ (hm & (secret64(8 * j + 8) ^ secret64(8 * j + 16)));
          unit_terms(word_at(in, q), word_at(in, q + 8), ka, kb, acc[2 * u], acc[2 * u + 1]);
        }
      for (int i = 0; i < 8; ++i) sums[blk * 8 + static_cast<uint64_t>(i)] += acc[i];
    }
  return sums;
}

// The chain, tail and merge over given block sums (refit_batch.cu's chain()).
uint64_t finish(const std::vector<uint8_t>& in, const std::vector<uint64_t>& sums) {
  const uint64_t len = in.size(), blocks = full_blocks(len);
  uint64_t acc[8];
  for (int i = 0; i < 8; ++i) {
    acc[i] = init_acc(i);
    // note: the kernel's form: v = acc + sum_0, v = scramble_add(v, key, sum_n) per later block, then
    // scramble_add(v, key, 0); restarted at every ring stage (acc = ..., v = acc + sum).
    uint64_t v = 0;
    for (uint64_t n = 0; n < blocks; ++n) {
      const uint64_t s = sums[n * 8 + static_cast<uint64_t>(i)];
      v = n % 64 == 0 ? acc[i] + s : scramble_add(v, scramble_key(i), s);
      if (n % 64 == 63 || n + 1 == blocks) acc[i] = scramble_add(v, scramble_key(i), 0);
    }
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

TEST(Xxh3Terms, PairStripeSumsGiveTheHash) {
  std::mt19937_64 rng(std::random_device{}());
  for (uint64_t len : {1040ull, 2048ull, 4096ull + 48, 65536ull, 131072ull + 1024 + 16}) {
    std::vector<uint8_t> in(len);
    for (auto& b : in) b = static_cast<uint8_t>(rng());
    EXPECT_EQ(finish(in, unit_block_sums(in)), XXH3_64bits(in.data(), len)) << len;
  }
}

// Block sums the way refit_stream.cu forms them: lane l of a warp holds bytes 16l..16l+15 of each 512-byte
// half of a block (stripe s = 8·half + l / 4, its words 2u and 2u + 1, u = l % 4, keys secret words s + 2u
// and s + 2u + 1); sum 2u (2u + 1) of the block is the sum over the halves and the 8 lanes of equal u.
std::vector<uint64_t> lane_block_sums(const std::vector<uint8_t>& in) {
  const uint64_t blocks = full_blocks(in.size());
  std::vector<uint64_t> sums(blocks * 8, 0);
  for (uint64_t blk = 0; blk < blocks; ++blk)
    for (int lane = 31; lane >= 0; --lane) {  // note: any order
      const int u = lane % 4;
      uint64_t a0 = 0, a1 = 0;
      for (int half = 0; half < 2; ++half) {
        const uint64_t q =
            blk * kBlockBytes + 512 * static_cast<uint64_t>(half) + 16 * static_cast<uint64_t>(lane);
        const int j = 8 * half + lane / 4 + 2 * u;
        unit_terms(word_at(in, q), word_at(in, q + 8), secret_word(j), secret_word(j + 1), a0, a1);
      }
      sums[blk * 8 + static_cast<uint64_t>(2 * u)] += a0;
      sums[blk * 8 + static_cast<uint64_t>(2 * u + 1)] += a1;
    }
  return sums;
}

TEST(Xxh3Terms, LaneSumsOfTheStreamingWriteGiveTheHash) {
  std::mt19937_64 rng(std::random_device{}());
  for (uint64_t len : {1040ull, 2048ull, 4096ull + 48, 65536ull, 131072ull + 1024 + 16}) {
    std::vector<uint8_t> in(len);
    for (auto& b : in) b = static_cast<uint8_t>(rng());
    EXPECT_EQ(lane_block_sums(in), unit_block_sums(in)) << len;
    EXPECT_EQ(finish(in, lane_block_sums(in)), XXH3_64bits(in.data(), len)) << len;
  }
}

TEST(Xxh3Terms, ScrambleAddIsScramblePlusNext) {
  std::mt19937_64 rng(std::random_device{}());
  for (int n = 0; n < 100000; ++n) {
    const uint64_t acc = rng(), next = n % 7 == 0 ? 0 : rng();
    const int lane = static_cast<int>(rng() % 8);
    ASSERT_EQ(scramble_add(acc, scramble_key(lane), next), scramble(acc, scramble_key(lane)) + next)
        << std::hex << acc << " " << next << " lane " << lane;
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
