// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): the counter-based
// generator of batched sampling. Header-only and __host__ __device__, so cuda/sample and cpu/sampling compute
// the same bits for the same (seed, step) with no generator state to carry between steps or devices.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MXQ_HOST_DEVICE __host__ __device__
#else
#define MXQ_HOST_DEVICE
#endif

namespace mxq {

// 64 random bits for draw number `step` of a request seeded with `seed`: key = seed (two 32-bit words),
// counter = (step low, step high, 0, 0); the first two output words, low word first.
MXQ_HOST_DEVICE inline uint64_t philox_random_bits(uint64_t seed, uint64_t step) {
  uint32_t c0 = static_cast<uint32_t>(step), c1 = static_cast<uint32_t>(step >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0, p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return static_cast<uint64_t>(c1) << 32 | c0;
}

}  // namespace mxq
