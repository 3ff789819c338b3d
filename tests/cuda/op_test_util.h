// Helpers shared by the GPU tests of the engine ops (embedding .. moe_route): bf16 test data, device upload
// of any vector, and a per-element tolerance check against the f32 CPU twin.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "format/codec.h"
#include "gpu_test_util.h"
#include "layout/probe.h"

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

// Random canonical weight planes of values_bytes / scales_bytes for format f: non-NaN codes; MX scales
// 2^-11..2^-4 and FP8-B128 scales (1 + u) · 2^e, e in [exp_lo, exp_lo + exp_count), so products stay normal.
inline HostPlanes random_planes(std::mt19937_64& rng, Format f, int64_t values_bytes, int64_t scales_bytes,
                                int exp_lo = -12, int exp_count = 6) {
  HostPlanes p{std::vector<uint8_t>(static_cast<size_t>(values_bytes)),
               std::vector<uint8_t>(static_cast<size_t>(scales_bytes))};
  if (f == Format::kBF16) {
    const auto w = random_bf16(rng, p.values.size() / 2);
    std::memcpy(p.values.data(), w.data(), p.values.size());
    return p;
  }
  for (auto& b : p.values) {
    do b = static_cast<uint8_t>(rng());
    while (f != Format::kMXFP4 && (b & 0x7F) == 0x7F);  // note: E4M3 NaN codes are not weights
  }
  if (f == Format::kFP8_B128) {
    for (size_t i = 0; i < p.scales.size(); i += 4) {
      const float s = std::ldexp(1.0f + static_cast<float>(rng() % 1024) / 1024.0f,
                                 exp_lo + static_cast<int>(rng() % static_cast<uint64_t>(exp_count)));
      std::memcpy(p.scales.data() + i, &s, 4);
    }
  } else {
    for (auto& b : p.scales) b = static_cast<uint8_t>(116 + rng() % 8);
  }
  return p;
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
