// Shared device code of the MX GEMMs (gemm_mx_sm90.cuh: wgmma, gemm_mx_sm80.cuh: mma.sync): the E8M0 scale
// fold and the E4M3 / E2M1 decodes of both; for the mma.sync kernel, how a quad lane loads its share of a
// 64-k stage of one weight row in the GEMV layout (gemv_layout.h) and decodes it into A fragments in that
// layout's k order (the wgmma kernel stages the bytes in shared memory and reads them in natural k order).
//
// Scale folding: a row's blocks are decoded as code · 2^(b - bref) in bf16, bref = the row's largest scale
// byte, and the row's f32 accumulator is multiplied by 2^(bref - 127) at the end. The decoded value is then
// at most 448 (E4M3) or 6 (E2M1) and exact while code · 2^(b - bref) is a bf16 (normal, or a subnormal
// whose bits fit): any byte pattern is handled, and only blocks whose byte is more than 124 (E4M3) or 132
// (E2M1) below the row's largest lose bits (their terms are that many binades under the row's largest
// scale). Byte 255 (NaN) makes its row NaN.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/linear/gemv_mx_kernel.cuh"

namespace mxq::cuda::gemm {

inline constexpr int kStageK = 64;  // k per pipeline stage: 4 MMA k-steps of 16, 2 scale blocks

// The quad lane's raw bytes of one row for one 64-k stage (GEMV order) and the stage's 2 scale bytes.
template <int kWords>
struct RawStage {
  uint32_t w[kWords];
  uint32_t sc;  // byte 0: block 2s, byte 1: block 2s+1
};

// Scale bytes of blocks 2s, 2s+1 of a row of kb blocks (block 2s+1 may not exist: then 0).
template <bool kTail>
__device__ __forceinline__ uint32_t load_stage_scales(const uint8_t* row_s, int kb, int s) {
  const int b = 2 * s;
  if (!kTail || (kb & 1) == 0) return __ldg(reinterpret_cast<const uint16_t*>(row_s + b));
  uint32_t r = __ldg(row_s + b);
  if (b + 1 < kb) r |= static_cast<uint32_t>(__ldg(row_s + b + 1)) << 8;
  return r;
}

// MXFP8 policy: a 64-element layout group is one stage; lane t holds 16 B, word j = canonical elements
// 16j + 4t .. 16j + 4t + 3 (a 32-wide tail group: 8 B at 8t, words 2 and 3 zero).
struct Fp8 {
  static constexpr int kWords = 4, kGroupK = 64;
  static constexpr int kFoldBase = 120 + 127;  // decoded bits are the value · 2^-120
  template <bool kTail>
  __device__ static void load(const uint8_t* row_v, int k, int s, int t, uint32_t (&w)[kWords]) {
    const int k0 = s * kStageK;
    if (!kTail || k0 + kStageK <= k) {
      const uint4 v = gemv::load_stream16(row_v + k0 + 16 * t);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(row_v + k0 + 8 * t));
      w[0] = v.x, w[1] = v.y, w[2] = 0, w[3] = 0;
    }
  }
};

// MXFP4 policy: a 128-element layout group is two stages; lane t holds 16 B of nibbles, stage h of the group
// uses its words 2h, 2h+1 (word j/2 byte 2(j%2)+c = elements 16j + 4t + 2c, +1 of block j). A tail group of
// J = 2, 4 or 6 blocks has a 2J-byte run at 2J·t.
struct Fp4 {
  static constexpr int kWords = 2, kGroupK = 128;
  static constexpr int kFoldBase = 126 + 127;  // decoded bits are the value · 2^-126
  template <bool kTail>
  __device__ static void load(const uint8_t* row_v, int k, int s, int t, uint32_t (&w)[kWords]) {
    const int q = s >> 1, h = s & 1, rem = k - q * 128;
    if (!kTail || rem >= 128) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(row_v + q * 64 + 16 * t + 8 * h));
      w[0] = v.x, w[1] = v.y;
    } else {
      const int words = rem / 32;  // J / 2 words in the lane's run
      const uint32_t* run = reinterpret_cast<const uint32_t*>(row_v + q * 64 + (rem / 8) * t);
#pragma unroll
      for (int i = 0; i < 2; ++i) w[i] = 2 * h + i < words ? __ldg(run + 2 * h + i) : 0u;
    }
  }
};

// kTail false: the caller guarantees K is a whole number of layout groups (no bounds, aligned scales).
template <class Fmt, bool kTail>
__device__ __forceinline__ void load_raw(const uint8_t* row_v, const uint8_t* row_s, int k, int s, int t,
                                         RawStage<Fmt::kWords>& r) {
  Fmt::template load<kTail>(row_v, k, s, t, r.w);
  r.sc = load_stage_scales<kTail>(row_s, k / 32, s);
}

// The largest scale byte of a row of kb blocks, reduced over the quad (every lane of the warp must call).
__device__ __forceinline__ uint32_t row_max_scale(const uint8_t* row_s, int kb, int t) {
  uint32_t mx = 0;
  if ((kb & 3) == 0) {
    const uint32_t* p = reinterpret_cast<const uint32_t*>(row_s);
    for (int i = t; i < kb / 4; i += 4) mx = __vmaxu4(mx, __ldg(p + i));
    mx = max(max(mx & 0xFF, (mx >> 8) & 0xFF), max((mx >> 16) & 0xFF, mx >> 24));
  } else {
    for (int i = t; i < kb; i += 4) mx = max(mx, static_cast<uint32_t>(__ldg(row_s + i)));
  }
  mx = max(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
  return max(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
}

// bf16x2 multiplier 2^(base + b - bref - 127) in both halves (0 when it would be below bf16's range).
__device__ __forceinline__ uint32_t fold_scale(uint32_t b, uint32_t bref, int base) {
  return static_cast<uint32_t>(max(base + static_cast<int>(b) - static_cast<int>(bref), 0)) * 0x00800080u;
}

// f32 2^(bref - 127): byte 0 is the subnormal 2^-127, 255 is NaN.
__device__ __forceinline__ float post_scale(uint32_t bref) {
  if (bref == 0xFF) return __uint_as_float(0x7FC00000u);
  return __uint_as_float(bref == 0 ? 0x00400000u : bref << 23);
}

// E4M3 bytes b0..b3 → bf16x2 pairs (b0, b1), (b2, b3) with the fold multiplier s: each byte s.eeee.mmm
// placed as the bf16 bits s at 15, eeee.mmm at 10..4 is the value · 2^-120 exactly (codes 1..7 land on bf16
// subnormals, which the bf16x2 multiply keeps).
__device__ __forceinline__ void e4m3x4_to_bf16x4_scaled(uint32_t word, uint32_t s, uint32_t& lo,
                                                        uint32_t& hi) {
  // note: as in gemv_mxfp8.cu: selector nibbles 8..B replicate a byte's sign into the byte above it.
  lo = gemv::bf16x2_mul((gemv::prmt(word, 0, 0x9180) << 4) & 0x87F087F0u, s);
  hi = gemv::bf16x2_mul((gemv::prmt(word, 0, 0xB3A2) << 4) & 0x87F087F0u, s);
}

// E2M1 nibbles: byte p of `word` (elements 2p, 2p+1) → pairs[p] = the values · 2^-126 · 2^(fold exponent).
__device__ __forceinline__ void e2m1x8_to_bf16x8_scaled(uint32_t word, uint32_t s01, uint32_t s23,
                                                        uint32_t (&pairs)[4]) {
  const uint32_t even = word & 0x0F0F0F0Fu, odd = (word >> 4) & 0x0F0F0F0Fu;
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    // note: as in gemv_mxfp4.cu: nibble bits placed as bf16 bits (code << 6, sign << 12) = value · 2^-126.
    const uint32_t q = gemv::prmt(even, odd, 0x8080u | p | ((4u + p) << 8));
    pairs[p] = gemv::bf16x2_mul((q * 4160u) & 0x81C081C0u, p < 2 ? s01 : s23);
  }
}

// One row's A-fragment pairs for the 4 k-steps of a stage, in the GEMV's k order: lo[j] feeds MMA slots 2t,
// 2t+1 (elements 16j + 4t, +1), hi[j] slots 2t+8, 2t+9 (16j + 4t + 2, +3), which the mma.sync kernel matches
// by reading x in the same order. (The wgmma kernel, whose x is in natural order in shared memory, reads its
// fragments from staged weight bytes instead: row_fragments_smem in gemm_mx_sm90.cuh.)
template <class Fmt>
__device__ __forceinline__ void row_fragments(const RawStage<Fmt::kWords>& r, uint32_t bref,
                                              uint32_t (&lo)[4], uint32_t (&hi)[4]) {
  const uint32_t s0 = fold_scale(r.sc & 0xFF, bref, Fmt::kFoldBase);
  const uint32_t s1 = fold_scale((r.sc >> 8) & 0xFF, bref, Fmt::kFoldBase);
  if constexpr (Fmt::kWords == 4) {
#pragma unroll
    for (int j = 0; j < 4; ++j) e4m3x4_to_bf16x4_scaled(r.w[j], j < 2 ? s0 : s1, lo[j], hi[j]);
  } else {
    uint32_t p[4];
    e2m1x8_to_bf16x8_scaled(r.w[0], s0, s0, p);
    lo[0] = p[0], hi[0] = p[1], lo[1] = p[2], hi[1] = p[3];
    e2m1x8_to_bf16x8_scaled(r.w[1], s1, s1, p);
    lo[2] = p[0], hi[2] = p[1], lo[3] = p[2], hi[3] = p[3];
  }
}

// A fragments of a 16-row slab (rows g and g+8 of the lane) for the 4 k-steps of a stage, in mma register
// order: {row g slots 2t.., row g+8 slots 2t.., row g slots 2t+8.., row g+8 slots 2t+8..}.
template <class Fmt>
__device__ __forceinline__ void stage_fragments(const RawStage<Fmt::kWords>& ra,
                                                const RawStage<Fmt::kWords>& rb, uint32_t bref_a,
                                                uint32_t bref_b, uint32_t (&a)[4][4]) {
  uint32_t lo_a[4], hi_a[4], lo_b[4], hi_b[4];
  row_fragments<Fmt>(ra, bref_a, lo_a, hi_a);
  row_fragments<Fmt>(rb, bref_b, lo_b, hi_b);
#pragma unroll
  for (int j = 0; j < 4; ++j) a[j][0] = lo_a[j], a[j][1] = lo_b[j], a[j][2] = hi_a[j], a[j][3] = hi_b[j];
}

// Tile order: a 1D grid walks groups of kGroupM activation tiles; inside a group the activation tile moves
// fastest, then the weight tile. note: a resident wave then covers ~132 / kGroupM weight tiles x kGroupM x
// tiles, so both stay in L2 and each weight tile is read from memory once per group instead of once per
// activation tile (plain row-major order streams all of W once per activation tile).
inline constexpr int kGroupM = 8;
__device__ __forceinline__ void tile_of(int bid, int tiles_m, int tiles_n, int& tile_n, int& tile_m) {
  const int group = bid / (kGroupM * tiles_n), first = group * kGroupM;
  const int in_group = min(kGroupM, tiles_m - first), r = bid - first * tiles_n;
  tile_n = r / in_group;
  tile_m = first + r % in_group;
}

// Stores one accumulator pair row of the lane: y[col][row] and y[col+1][row] (y is [m, n] row-major), bf16
// (the output) or f32 (a split-K partial).
__device__ __forceinline__ void store_one(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_one(float* p, float v) { *p = v; }
template <class T>
__device__ __forceinline__ void store_pair(T* y, int m, int n, int row, int col, float v0, float v1) {
  if (row >= n) return;
  if (col < m) store_one(y + static_cast<int64_t>(col) * n + row, v0);
  if (col + 1 < m) store_one(y + static_cast<int64_t>(col + 1) * n + row, v1);
}

}  // namespace mxq::cuda::gemm
