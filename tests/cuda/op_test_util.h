// Helpers shared by the GPU tests of the engine ops (embedding .. moe_route): bf16 test data, device upload
// of any vector, and a per-element tolerance check against the f32 CPU twin.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "format/codec.h"
#include "gpu_test_util.h"

namespace mxq::cuda::test {

// Normal(0, stddev) values rounded to bf16 (never zero), as bits.
inline std::vector<uint16_t> normal_bf16(std::mt19937_64& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<uint16_t> v(n);
  for (auto& h : v) {
    do h = f32_to_bf16(dist(rng));
    while ((h & 0x7FFF) == 0);
  }
  return v;
}

inline std::vector<float> to_f32(const std::vector<uint16_t>& bf16) {
  std::vector<float> f(bf16.size());
  for (size_t i = 0; i < f.size(); ++i) f[i] = bf16_to_f32(bf16[i]);
  return f;
}

// Result or fail the test.
template <class T>
T must(Result<T> r) {
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
  if (!r) throw std::runtime_error("device helper failed");
  return std::move(*r);
}

// Every got[i] (bf16 bits) within rtol * |want[i]| + atol of the f32 reference; reports the first misses.
inline void expect_close_bf16(const std::vector<uint16_t>& got, const std::vector<float>& want, double rtol,
                              double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = bf16_to_f32(got[i]), w = want[i];
    if (!(std::abs(g - w) <= rtol * std::abs(w) + atol)) {
      if (++misses <= 5) ADD_FAILURE() << what << "[" << i << "]: got " << g << ", want " << w;
    }
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << got.size() << " outside tolerance";
}

inline double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return v.empty() ? 0.0 : std::sqrt(s / static_cast<double>(v.size()));
}

// A paged KV cache of random bf16 entries: sequence s gets ceil(seq_lens[s] / block_size) distinct blocks
// drawn at random from the pool (table entries past them point at block 0, as an engine leaves them).
struct PagedCache {
  int64_t num_blocks, block_size, max_blocks, kv_heads, head_dim;
  std::vector<uint16_t> k, v;
  std::vector<int32_t> tables;  // [sequences, max_blocks]
  std::vector<float> kf, vf;
};
inline PagedCache random_paged_cache(std::mt19937_64& rng, const std::vector<int32_t>& seq_lens,
                                     int64_t block_size, int64_t kv_heads, int64_t head_dim) {
  PagedCache c{0, block_size, 1, kv_heads, head_dim, {}, {}, {}, {}, {}};
  for (int32_t len : seq_lens) {
    const int64_t blocks = (len + block_size - 1) / block_size;
    c.num_blocks += blocks;
    c.max_blocks = std::max(c.max_blocks, blocks);
  }
  c.num_blocks += 3;  // note: spare blocks nobody owns, so the pool is not a partition of the tables
  c.max_blocks += 1;
  std::vector<int32_t> perm(static_cast<size_t>(c.num_blocks));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int32_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  c.tables.assign(seq_lens.size() * static_cast<size_t>(c.max_blocks), 0);
  size_t next = 0;
  for (size_t s = 0; s < seq_lens.size(); ++s)
    for (int64_t b = 0; b < (seq_lens[s] + block_size - 1) / block_size; ++b)
      c.tables[s * static_cast<size_t>(c.max_blocks) + static_cast<size_t>(b)] = perm[next++];
  const size_t n = static_cast<size_t>(c.num_blocks * block_size * kv_heads * head_dim);
  c.k = normal_bf16(rng, n);
  c.v = normal_bf16(rng, n);
  c.kf = to_f32(c.k);
  c.vf = to_f32(c.v);
  return c;
}

constexpr double kBf16Rtol = 1.0 / 128;  // two bf16 half-ulps: the output rounding plus f32 noise

}  // namespace mxq::cuda::test
