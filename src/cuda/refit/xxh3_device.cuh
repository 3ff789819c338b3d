// XXH3-64 (seed 0, default secret) as __host__ __device__ pieces, bit-exact with libxxhash 0.8: the short
// paths (0..240 bytes) whole, and the long path (> 240 bytes) split so a GPU can run it in parallel:
//   long input = nb_blocks full 1024-byte blocks, then a tail of 1..1024 bytes.
//   acc_{n+1} = scramble(acc_n + block_sum(n))   for every full block n, 8 independent 64-bit lanes;
//   block_sum(n)[i] = sum over its 16 stripes s of  word(s, i^1) + lo32(k)·hi32(k), k = word(s, i) ^
//   secret(8s+8i)
// block_sum is a pure sum of its block's words, so every block's sums can be computed at once
// (xxh3_checksum.cu does, reading the bytes through each plane's layout); only the scramble chain is
// sequential (8 lanes). Then the tail's stripes and the last 64 input bytes accumulate without scrambling,
// and merge + avalanche. Plain C++ too (no CUDA types), so the host reference in the tests compiles it
// unchanged.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MXQ_XXH_HD __host__ __device__ __forceinline__
#else
#define MXQ_XXH_HD inline
#endif

namespace mxq::cuda::xxh3 {

inline constexpr uint64_t kPrime32_1 = 0x9E3779B1U, kPrime32_2 = 0x85EBCA77U, kPrime32_3 = 0xC2B2AE3DU;
inline constexpr uint64_t kPrime64_1 = 0x9E3779B185EBCA87ULL, kPrime64_2 = 0xC2B2AE3D27D4EB4FULL,
                          kPrime64_3 = 0x165667B19E3779F9ULL, kPrime64_4 = 0x85EBCA77C2B2AE63ULL,
                          kPrime64_5 = 0x27D4EB2F165667C5ULL;
inline constexpr int kSecretBytes = 192, kStripeBytes = 64, kStripesPerBlock = 16, kBlockBytes = 1024;
inline constexpr uint64_t kShortMax = 240;

// XXH3_kSecret (xxhash.h); a __constant__ copy for device code (one per translation unit, no RDC).
#define MXQ_XXH3_SECRET_BYTES                                                                               \
  0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde,     \
      0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, \
      0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, \
      0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, \
      0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, \
      0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, \
      0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, \
      0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, \
      0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, \
      0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, \
      0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, \
      0xca, 0xbb, 0x4b, 0x40, 0x7e
inline constexpr uint8_t kSecret[kSecretBytes] = {MXQ_XXH3_SECRET_BYTES};
#if defined(__CUDACC__)
static __constant__ uint8_t kSecretDevice[kSecretBytes] = {MXQ_XXH3_SECRET_BYTES};
#endif
MXQ_XXH_HD const uint8_t* secret() {
#if defined(__CUDA_ARCH__)
  return kSecretDevice;
#else
  return kSecret;
#endif
}

MXQ_XXH_HD constexpr uint64_t le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
MXQ_XXH_HD uint32_t le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
MXQ_XXH_HD uint64_t secret64(int offset) { return le64(secret() + offset); }

// Secret word j = the 8 bytes at offset 8j, for reads whose offset differs between lanes.
// note: __constant__ reads at lane-dependent addresses are serialised one address at a time (the ADU pipe);
// secret64 at such offsets made the batched refit kernel ADU-bound (ncu on the H200: ADU 80% busy, 7.6 ms
// for 7.16 GB). The words live in global memory instead and go through the L1 like any divergent load.
constexpr uint64_t secret_le64(int offset) { return le64(kSecret + offset); }
#if defined(__CUDACC__)
#define MXQ_XXH3_W(j) secret_le64(8 * (j))
static __device__ const uint64_t kSecretWordsDevice[kSecretBytes / 8] = {
    MXQ_XXH3_W(0),  MXQ_XXH3_W(1),  MXQ_XXH3_W(2),  MXQ_XXH3_W(3),  MXQ_XXH3_W(4),  MXQ_XXH3_W(5),
    MXQ_XXH3_W(6),  MXQ_XXH3_W(7),  MXQ_XXH3_W(8),  MXQ_XXH3_W(9),  MXQ_XXH3_W(10), MXQ_XXH3_W(11),
    MXQ_XXH3_W(12), MXQ_XXH3_W(13), MXQ_XXH3_W(14), MXQ_XXH3_W(15), MXQ_XXH3_W(16), MXQ_XXH3_W(17),
    MXQ_XXH3_W(18), MXQ_XXH3_W(19), MXQ_XXH3_W(20), MXQ_XXH3_W(21), MXQ_XXH3_W(22), MXQ_XXH3_W(23)};
#undef MXQ_XXH3_W
#endif
MXQ_XXH_HD uint64_t secret_word(int j) {
#if defined(__CUDA_ARCH__)
  return __ldg(&kSecretWordsDevice[j]);
#else
  return secret_le64(8 * j);
#endif
}
MXQ_XXH_HD uint64_t rotl64(uint64_t x, int r) { return x << r | x >> (64 - r); }
MXQ_XXH_HD uint64_t swap64(uint64_t x) {
  uint64_t r = 0;
  for (int i = 0; i < 8; ++i) r = r << 8 | (x >> (8 * i) & 0xFF);
  return r;
}
MXQ_XXH_HD uint32_t swap32(uint32_t x) { return x >> 24 | (x >> 8 & 0xFF00) | (x << 8 & 0xFF0000) | x << 24; }

MXQ_XXH_HD uint64_t mul128_fold64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return a * b ^ __umul64hi(a, b);
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
#endif
}
MXQ_XXH_HD uint64_t avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  return h ^ (h >> 32);
}
MXQ_XXH_HD uint64_t xxh64_avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kPrime64_2;
  h ^= h >> 29;
  h *= kPrime64_3;
  return h ^ (h >> 32);
}
MXQ_XXH_HD uint64_t rrmxmx(uint64_t h, uint64_t len) {
  h ^= rotl64(h, 49) ^ rotl64(h, 24);
  h *= 0x9FB21C651E98DF25ULL;
  h ^= (h >> 35) + len;
  h *= 0x9FB21C651E98DF25ULL;
  return h ^ (h >> 28);
}
MXQ_XXH_HD uint64_t mix16(const uint8_t* in, int secret_offset) {
  return mul128_fold64(le64(in) ^ secret64(secret_offset), le64(in + 8) ^ secret64(secret_offset + 8));
}

// The whole hash of 0..240 bytes (seed 0), from a contiguous copy of the input.
MXQ_XXH_HD uint64_t hash_short(const uint8_t* in, uint64_t len) {
  if (len == 0) return xxh64_avalanche(secret64(56) ^ secret64(64));
  if (len <= 3) {
    const uint32_t combined = uint32_t{in[0]} << 16 | uint32_t{in[len >> 1]} << 24 | uint32_t{in[len - 1]} |
                              static_cast<uint32_t>(len) << 8;
    const uint64_t bitflip = uint64_t{le32(secret()) ^ le32(secret() + 4)};
    return xxh64_avalanche(uint64_t{combined} ^ bitflip);
  }
  if (len <= 8) {
    const uint64_t bitflip = secret64(8) ^ secret64(16);
    const uint64_t input64 = uint64_t{le32(in + len - 4)} + (uint64_t{le32(in)} << 32);
    return rrmxmx(input64 ^ bitflip, len);
  }
  if (len <= 16) {
    const uint64_t lo = le64(in) ^ (secret64(24) ^ secret64(32));
    const uint64_t hi = le64(in + len - 8) ^ (secret64(40) ^ secret64(48));
    return avalanche(len + swap64(lo) + hi + mul128_fold64(lo, hi));
  }
  uint64_t acc = len * kPrime64_1;
  if (len <= 128) {
    if (len > 32) {
      if (len > 64) {
        if (len > 96) acc += mix16(in + 48, 96) + mix16(in + len - 64, 112);
        acc += mix16(in + 32, 64) + mix16(in + len - 48, 80);
      }
      acc += mix16(in + 16, 32) + mix16(in + len - 32, 48);
    }
    acc += mix16(in, 0) + mix16(in + len - 16, 16);
    return avalanche(acc);
  }
  for (int i = 0; i < 8; ++i) acc += mix16(in + 16 * i, 16 * i);
  acc = avalanche(acc);
  const int rounds = static_cast<int>(len / 16);
  for (int i = 8; i < rounds; ++i) acc += mix16(in + 16 * i, 16 * (i - 8) + 3);
  acc += mix16(in + len - 16, 136 - 17);
  return avalanche(acc);
}

// Lane i's share of one stripe: words w[i] and w[i^1] of the stripe, secret at `secret_offset` (8·s).
MXQ_XXH_HD uint64_t stripe_lane(uint64_t word_i, uint64_t word_pair, int lane, int secret_offset) {
  const uint64_t key = word_i ^ secret64(secret_offset + 8 * lane);
  return word_pair + (key & 0xFFFFFFFFULL) * (key >> 32);
}

// Block sums as sums of per-word terms (refit_batch.cu, sum_delta.cu): word w at stripe s, lane i of a
// block adds w to sum[i ^ 1] and mul_term(w, secret at 8s + 8i) to sum[i]; a block's sums are the totals,
// so they can be reduced in any order and updated word by word (mod 2^64).
MXQ_XXH_HD uint64_t mul_term(uint64_t word, uint64_t key) {
  const uint64_t k = word ^ key;
  return (k & 0xFFFFFFFFULL) * (k >> 32);
}
// The two sums a 16-byte unit (words i = 2·pair and i + 1 of one stripe) adds to: sum[i] += a,
// sum[i + 1] += b, with key_a, key_b the secret words at 8s + 8i and 8s + 8i + 8.
MXQ_XXH_HD void unit_terms(uint64_t w0, uint64_t w1, uint64_t key_a, uint64_t key_b, uint64_t& a,
                           uint64_t& b) {
  a += mul_term(w0, key_a) + w1;
  b += mul_term(w1, key_b) + w0;
}

MXQ_XXH_HD uint64_t init_acc(int lane) {
  const uint64_t init[8] = {kPrime32_3, kPrime64_1, kPrime64_2, kPrime64_3,
                            kPrime64_4, kPrime32_2, kPrime64_5, kPrime32_1};
  return init[lane];
}

// note: the key is a per-lane constant: device code loads it once into a register (constant memory reads
// of lane-dependent addresses serialize).
MXQ_XXH_HD uint64_t scramble_key(int lane) { return secret64(kSecretBytes - kStripeBytes + 8 * lane); }
MXQ_XXH_HD uint64_t scramble(uint64_t acc, uint64_t key) {
  acc ^= acc >> 47;
  acc ^= key;
  return acc * kPrime32_1;
}
// scramble(acc, key) + next (mod 2^64), for a chain acc_{n+1} = scramble(acc_n + sum_n) run as
// v_{n+1} = scramble_add(v_n, key, sum_{n+1}) with v_n = acc_n + sum_n. With u = acc ^ (acc >> 47) ^ key:
// (acc >> 47) only reaches the low half (hi >> 15), and u·P (P < 2^32) = lo32(u)·P + (hi32(u)·P << 32), so
// u·P + next = lo32(u)·P + {lo: lo32(next), hi: hi32(next) + hi32(u)·P}: one 32x32 -> 64 multiply-add on
// the dependent path (shift, xor, mad.wide) instead of a 64-bit multiply then a 64-bit add.
MXQ_XXH_HD uint64_t scramble_add(uint64_t acc, uint64_t key, uint64_t next) {
  const auto lo = static_cast<uint32_t>(acc), hi = static_cast<uint32_t>(acc >> 32);
  const uint32_t ulo = lo ^ (hi >> 15) ^ static_cast<uint32_t>(key);
  const uint32_t uhi = hi ^ static_cast<uint32_t>(key >> 32);
  const uint32_t add_hi = static_cast<uint32_t>(next >> 32) + uhi * static_cast<uint32_t>(kPrime32_1);
#if defined(__CUDA_ARCH__)
  // note: written as the low word's multiply-add with carry out and the high word's with carry in (one
  // asm: the carry flag lives between them), ptxas emits one IMAD.WIDE.U32 with the 64-bit addend, so a
  // chain step is SHF, LOP3, IMAD.WIDE on the dependent path; from mad.wide.u32 with that addend it emitted
  // a wide multiply then a 64-bit add (IMAD.WIDE, IADD3, IMAD.X: 5 dependent instructions a step).
  uint32_t rlo, rhi;
  asm("mad.lo.cc.u32 %0, %2, %3, %4;\n\tmadc.hi.u32 %1, %2, %3, %5;"
      : "=r"(rlo), "=r"(rhi)
      : "r"(ulo), "r"(static_cast<uint32_t>(kPrime32_1)), "r"(static_cast<uint32_t>(next)), "r"(add_hi));
  return uint64_t{rhi} << 32 | rlo;
#else
  return uint64_t{ulo} * kPrime32_1 + (uint64_t{add_hi} << 32 | static_cast<uint32_t>(next));
#endif
}

// Full blocks and stripes of the tail of a long input (len > 240): the tail holds `tail_stripes` stripes
// accumulated without a scramble, then the last stripe = the last 64 input bytes, secret at 192-64-7.
MXQ_XXH_HD uint64_t full_blocks(uint64_t len) { return (len - 1) / kBlockBytes; }
MXQ_XXH_HD int tail_stripes(uint64_t len) {
  return static_cast<int>(((len - 1) - kBlockBytes * full_blocks(len)) / kStripeBytes);
}
inline constexpr int kLastStripeSecret = kSecretBytes - kStripeBytes - 7;

// Merge of the 8 final lanes.
MXQ_XXH_HD uint64_t merge(const uint64_t acc[8], uint64_t len) {
  uint64_t r = len * kPrime64_1;
  for (int i = 0; i < 4; ++i)
    r += mul128_fold64(acc[2 * i] ^ secret64(11 + 16 * i), acc[2 * i + 1] ^ secret64(11 + 16 * i + 8));
  return avalanche(r);
}

// The long path on a contiguous host buffer, written with the pieces above: the reference the GPU's split
// computation is checked against (it must equal libxxhash too).
inline uint64_t hash_long_reference(const uint8_t* in, uint64_t len) {
  uint64_t acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = init_acc(i);
  auto stripe = [&](const uint8_t* p, int secret_offset) {
    uint64_t add[8];
    for (int i = 0; i < 8; ++i)
      add[i] = stripe_lane(le64(p + 8 * i), le64(p + 8 * (i ^ 1)), i, secret_offset);
    for (int i = 0; i < 8; ++i) acc[i] += add[i];
  };
  const uint64_t blocks = full_blocks(len);
  for (uint64_t n = 0; n < blocks; ++n) {
    for (int s = 0; s < kStripesPerBlock; ++s) stripe(in + n * kBlockBytes + s * kStripeBytes, 8 * s);
    for (int i = 0; i < 8; ++i) acc[i] = scramble(acc[i], scramble_key(i));
  }
  for (int s = 0; s < tail_stripes(len); ++s) stripe(in + blocks * kBlockBytes + s * kStripeBytes, 8 * s);
  stripe(in + len - kStripeBytes, kLastStripeSecret);
  return merge(acc, len);
}

}  // namespace mxq::cuda::xxh3
