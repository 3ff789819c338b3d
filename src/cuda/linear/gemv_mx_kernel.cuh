// The GEMV skeleton shared by gemv_mxfp8.cu and gemv_mxfp4.cu; each supplies a decode policy.
// Layout contract: gemv_layout.h. Tiles: a block of 8 warps owns 16 weight rows; its warps split K by
// groups and add up in shared memory. Per group a quad lane loads 16 B of row r and 16 B of row r+8,
// decodes them to bf16 pairs in registers and feeds mma.sync m16n8k16 (A = weights, B = x^T, one n-tile
// of 8 activation rows per 8 of M, up to 4 for M <= 32). The MMAs of one 32-element scale block accumulate
// from zero; the E8M0 scale multiplies that partial in f32.
// note: 1, 2 or 4 warps per tile with longer K slices measured slower on every Qwen3 shape, as did a
// ping-pong register pipeline (bench/history/RESULTS-log.md, "Variants measured", runs 3-4): 8 warps split
// one tile's K.
// Grid: one block per 16-row tile, or persistent (gemv_mx_persist_kernel: min(tiles, 2 per SM) blocks, each
// walking tiles b, b + grid, ..., its warps prefetching the next tile's first step while they compute the
// last of the current one), bitwise the same. note: persistence measured only 4% faster, on the multi-wave
// MXFP8 m = 1 shapes; at one tile per block and for MXFP4 it was slower (bench/history/RESULTS-log.md,
// "GEMV at M = 1: persistent blocks and the MXFP4 scale vote").
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "cuda/common/device_sms.h"
#include "cuda/common/pdl.cuh"
#include "cuda/linear/gemv_mx_launch.h"

namespace mxq::cuda::gemv {

inline constexpr int kWarps = 8;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kRowsPerTile = 16;
// note: 4 groups per step and one step prefetched: up to 8 x 2 x 16 B per lane in flight, 64 KiB per block;
// 2 groups at 3 blocks per SM (run 5) and no prefetch at 3 blocks per SM (run 1) measured slower in sum.
inline constexpr int kUnroll = 4;

// Streaming 16-byte weight load: read once, so keep it out of L1 (x lives there).
__device__ __forceinline__ uint4 load_stream16(const uint8_t* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// PTX prmt (default mode): unlike __byte_perm, which keeps only 3 bits of each selector nibble, selector
// nibbles 8-F replicate the sign bit of the selected byte into the whole byte.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

// Two E4M3 bytes (low 16 bits of `pair`) → bf16x2, exact: E4M3 pair → f16x2 (exact) → bf16 bits by moving
// the exponent field (value · 2^-112, a bf16 normal) → one bf16x2 multiply by 2^112 (exact). Shared by the
// MXFP8 "cvt" decode and the FP8-B128 GEMV.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t pair) {
  uint32_t h;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n .reg .b16 lo;\n cvt.u16.u32 lo, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(h) : "r"(pair));
#else
  // note: E4M3 bits placed as f16 bits are the value · 2^-8 (subnormals included); f16 handles the rest.
  const uint32_t u = __byte_perm(pair, 0, 0x7170);  // bytes: b0, 0, b1, 0
  h = ((u & 0x007F007Fu) << 7) | ((u & 0x00800080u) << 8);
  __half2 hv =
      __hmul2(*reinterpret_cast<__half2*>(&h), __half2(__ushort_as_half(0x5C00), __ushort_as_half(0x5C00)));
  h = *reinterpret_cast<uint32_t*>(&hv);
#endif
  const uint32_t raw = ((h >> 3) & 0x0FFF0FFFu) | (h & 0x80008000u);
  return bf16x2_mul(raw, 0x77807780u);  // note: bf16 0x7780 = 2^112
}

// E8M0 byte → 2^(b-127) as f32: 0 is the subnormal 2^-127, 255 is NaN.
__device__ __forceinline__ float e8m0_to_f32(uint32_t b) {
  if (b == 0xFF) return __uint_as_float(0x7FC00000u);
  return __uint_as_float(b == 0 ? 0x00400000u : b << 23);
}

// A scale factor split in two, pre (applied to the MMA partial) then post (the FMA into the accumulator):
// 2^(b-127+kFold) when a policy's decode leaves values 2^-kFold too small. One f32 cannot hold 2^(b-7) for
// b > 134, so large bytes move their excess into post; a warp whose group has none skips pre.
template <int kFold>
struct FoldedScale {
  // note: b <= kLimit keeps b + kFold <= 254, the largest finite f32 exponent field.
  static constexpr uint32_t kLimit = 254 - kFold;
  __device__ static float post_small(uint32_t b) { return __uint_as_float((b + kFold) << 23); }
  __device__ static float pre_large(uint32_t b) { return __uint_as_float((min(b, kLimit) + kFold) << 23); }
  __device__ static float post_large(uint32_t b) {
    if (b == 0xFF) return __uint_as_float(0x7FC00000u);
    return __uint_as_float((max(b, kLimit) - kLimit + 127) << 23);
  }
  // True when any byte of the packed scale words exceeds kLimit.
  __device__ static bool any_large(uint32_t a, uint32_t b) {
    return (__vcmpgtu4(a, kLimit * 0x01010101u) | __vcmpgtu4(b, kLimit * 0x01010101u)) != 0;
  }
};

// The largest |x| bits of 8 bf16 activations, as a 16-bit value.
__device__ __forceinline__ uint32_t max_abs_bf16x8(const uint4& v) {
  const uint32_t m = __vmaxu2(__vmaxu2(v.x & 0x7FFF7FFFu, v.y & 0x7FFF7FFFu),
                              __vmaxu2(v.z & 0x7FFF7FFFu, v.w & 0x7FFF7FFFu));
  return max(m & 0xFFFFu, m >> 16);
}

// Small activations. A folded decode (kScaleFold != 0) feeds the MMA values 2^-kScaleFold too small, so a
// product x · w with |x · code| < 2^-(126 - kScaleFold) leaves f32's normal range inside the tensor core and
// one below 2^-(149 - kScaleFold) is lost (activation rows of 2^-60 .. 2^-40 gave y = 0, GemvMx tests). A
// warp whose activation rows include one with max |x| < 2^-8 over the K it reads computes with the policy's
// exact decode (Fmt::Exact) instead: then every block of 32 holds a code of 2^8 or more where MX weights
// come from a quantizer, the largest products stay normal, and any product lost is below f32's rounding of
// the sum. Exact decodes (kScaleFold == 0) never need it.
inline constexpr uint32_t kSmallXBits = (127 - 8) << 7;  // bf16 bits of 2^-8

// True when some activation row r < m (at row_of(r), k elements) has max |x| < 2^-8 (kSmallXBits) over the
// K of this warp's groups (first, first + kStride, ... in steps of kUnroll groups, while < nfull) and, for
// the last warp, the short tail group: one 16-byte load a lane per step and row. Warp-uniform.
template <class Fmt, class RowOf>
__device__ __forceinline__ bool warp_rows_small(const RowOf& row_of, int m, int k, int first, int nfull,
                                                bool tail, int lane) {
  if constexpr (Fmt::kScaleFold == 0) {
    return false;
  } else {
    static_assert(Fmt::kGroupK * kUnroll == 256, "a step of kUnroll groups is 32 lanes x 8 elements");
    constexpr int kStride = kWarps * kUnroll;
    bool small = false;
    for (int r = 0; r < m; ++r) {
      const __nv_bfloat16* xr = row_of(r);
      uint32_t mx = 0;
      auto chunk = [&](int e) {  // note: 8 elements from e; k % 32 == 0 keeps a chunk wholly in or out
        if (e + 8 <= k) mx = max(mx, max_abs_bf16x8(__ldg(reinterpret_cast<const uint4*>(xr + e))));
      };
      for (int q0 = first; q0 < nfull; q0 += kStride) chunk(q0 * Fmt::kGroupK + 8 * lane);
      if (tail)
        for (int e = nfull * Fmt::kGroupK + 8 * lane; e < k; e += 256) chunk(e);
      const uint32_t row_max = __reduce_max_sync(0xFFFFFFFFu, mx);
      small = small || row_max < kSmallXBits;
    }
    return small;
  }
}

// Recomputes acc of this warp's K slice (groups first, first + kWarps·kUnroll, ... < nfull, and with `tail`
// the short last group) with the policy's exact decode, reading weight rows g / g + 8 at va / vb and their
// scales at sa / sb from global memory: the rare small-activation path (warp_rows_small); the fast paths
// keep their code.
template <class Fmt, int kNTiles>
__device__ void mx_exact_slice(float (&acc)[kNTiles][4], const __nv_bfloat16* const (&xr)[kNTiles],
                               const bool (&xok)[kNTiles], const uint8_t* va, const uint8_t* vb,
                               const uint8_t* sa, const uint8_t* sb, int first, int nfull, int k, bool tail,
                               int t);

// Nonzero when some byte of v is 0 (the classic bit trick: 3 integer ops for 4 bytes).
__device__ __forceinline__ uint32_t has_zero_byte(uint32_t v) { return (v - 0x01010101u) & ~v & 0x80808080u; }

// Scale bytes of kCount consecutive blocks (2 or 4) at p; one vector load when p is known aligned.
template <int kCount, bool kAligned>
__device__ __forceinline__ uint32_t load_scales(const uint8_t* p) {
  if constexpr (kAligned) {
    if constexpr (kCount == 4)
      return __ldg(reinterpret_cast<const uint32_t*>(p));
    else
      return __ldg(reinterpret_cast<const uint16_t*>(p));
  } else {
    uint32_t r = 0;
#pragma unroll
    for (int i = 0; i < kCount; ++i) r |= static_cast<uint32_t>(__ldg(p + i)) << (8 * i);
    return r;
  }
}

// The tile's epilogue, shared by the MX and FP8-B128 GEMVs: each warp's partial sums of its K slice, acc
// (mma.sync C fragments: c0, c1 row g, activations 2t, 2t+1; c2, c3 row g+8), are added across the block's
// warps in shared memory, and warp 0 stores y rows < m, columns < n as bf16. Every thread must call it.
// kBufs = 2 (persistent blocks, one call per tile, buf = tile parity): tile i + 2 writes the buffer tile i
// read only after the barrier of tile i + 1, which warp 0 passes after its reads of tile i, so one barrier
// per tile suffices.
template <int kNTiles, int kBufs = 1>
__device__ __forceinline__ void store_tile_sums(const float (&acc)[kNTiles][4], int warp, int lane, int row0,
                                                int m, __nv_bfloat16* __restrict__ y, int n, int buf = 0) {
  const int g = lane >> 2, t = lane & 3;
  __shared__ float red_all[kBufs][kWarps][kNTiles * 4][32];
  auto& red = red_all[kBufs == 1 ? 0 : buf];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) red[warp][nt * 4 + c][lane] = acc[nt][c];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += red[w][nt * 4 + c][lane];
      const int row = row0 + g + (c >= 2 ? 8 : 0), mi = nt * 8 + 2 * t + (c & 1);
      if (row < n && mi < m) y[static_cast<int64_t>(mi) * n + row] = __float2bfloat16_rn(s);
    }
}

// kVote: a warp-wide vote per group (per step with kStep) picks the scale path. Folded decodes: bytes past
// Fold::kLimit (FoldedScale). Exact decodes with Fmt::kScaleVote (one n-tile): bytes 0 (2^-127, an f32
// subnormal) and 255 (NaN) take e8m0_to_f32, all others 2^(b-127) as b << 23, 2 instructions instead of
// ~5 per scale (MXFP4 converts 8 scales per group per lane). Both paths are exact: same bits.
template <class Fmt, int kNTiles>
constexpr bool mx_scale_vote() {
  return Fmt::kScaleFold != 0 || (Fmt::kScaleVote && kNTiles == 1);
}
// True when the packed scale words a, b (one group, rows g and g + 8) need the exact ("large") path.
template <class Fmt>
__device__ __forceinline__ bool mx_needs_exact(uint32_t a, uint32_t b) {
  if constexpr (Fmt::kScaleFold != 0)
    return FoldedScale<Fmt::kScaleFold>::any_large(a, b);
  else
    return (has_zero_byte(a) | has_zero_byte(~a) | has_zero_byte(b) | has_zero_byte(~b)) != 0;
}

// One 16-k MMA-pair block: pa / pb = the lane's 4 bf16x2 words of rows g / g + 8 for MMAs (2b, 2b+1), kx =
// the block's first k; x row pointers xr (valid when xok). The MMAs accumulate from zero; the E8M0 scales
// (bytes sbyte_a / sbyte_b) multiply that partial into acc. large: some lane of the warp holds a scale byte
// that needs the exact path (warp-uniform; see mx_scale_vote).
template <class Fmt, int kNTiles>
__device__ __forceinline__ void mx_block_mma(float (&acc)[kNTiles][4],
                                             const __nv_bfloat16* const (&xr)[kNTiles],
                                             const bool (&xok)[kNTiles], const uint32_t* pa,
                                             const uint32_t* pb, int kx, uint32_t sbyte_a, uint32_t sbyte_b,
                                             bool large) {
  using Fold = FoldedScale<Fmt::kScaleFold>;
  constexpr bool kVote = mx_scale_vote<Fmt, kNTiles>();
  float s_a, s_b, pre_a = 1.f, pre_b = 1.f;
  if constexpr (Fmt::kScaleFold == 0) {
    if (kVote && !large)
      s_a = __uint_as_float(sbyte_a << 23), s_b = __uint_as_float(sbyte_b << 23);
    else
      s_a = e8m0_to_f32(sbyte_a), s_b = e8m0_to_f32(sbyte_b);
  } else if (!large) {
    s_a = Fold::post_small(sbyte_a), s_b = Fold::post_small(sbyte_b);
  } else {
    pre_a = Fold::pre_large(sbyte_a), pre_b = Fold::pre_large(sbyte_b);
    s_a = Fold::post_large(sbyte_a), s_b = Fold::post_large(sbyte_b);
  }
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint2 bx = make_uint2(0, 0);
      if (xok[nt]) bx = __ldg(reinterpret_cast<const uint2*>(xr[nt] + kx + 16 * h));
      const uint32_t a[4] = {pa[2 * h], pb[2 * h], pa[2 * h + 1], pb[2 * h + 1]};
      mma_bf16_16816(d, a, bx.x, bx.y);
    }
    if (Fmt::kScaleFold != 0 && large) d[0] *= pre_a, d[1] *= pre_a, d[2] *= pre_b, d[3] *= pre_b;
    acc[nt][0] = fmaf(d[0], s_a, acc[nt][0]);
    acc[nt][1] = fmaf(d[1], s_a, acc[nt][1]);
    acc[nt][2] = fmaf(d[2], s_b, acc[nt][2]);
    acc[nt][3] = fmaf(d[3], s_b, acc[nt][3]);
  }
}

// One whole group: the lane's 16 bytes of rows g (wa) and g + 8 (wb), their packed scale bytes sa / sb
// (kBlocks bytes each), kx = the group's first k.
template <class Fmt, int kNTiles>
__device__ __forceinline__ void mx_group(float (&acc)[kNTiles][4], const __nv_bfloat16* const (&xr)[kNTiles],
                                         const bool (&xok)[kNTiles], const uint4& wa, const uint4& wb,
                                         uint32_t sa, uint32_t sb, int kx, bool large) {
  constexpr int kMmas = Fmt::kGroupK / 16, kBlocks = Fmt::kGroupK / 32;
  uint32_t pa[kMmas * 2], pb[kMmas * 2];
  const uint32_t wa4[4] = {wa.x, wa.y, wa.z, wa.w}, wb4[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    Fmt::decode(wa4[i], pa + i * Fmt::kPairsPerWord);
    Fmt::decode(wb4[i], pb + i * Fmt::kPairsPerWord);
  }
#pragma unroll
  for (int b = 0; b < kBlocks; ++b)
    mx_block_mma<Fmt, kNTiles>(acc, xr, xok, pa + 4 * b, pb + 4 * b, kx + 32 * b, (sa >> (8 * b)) & 0xFF,
                               (sb >> (8 * b)) & 0xFF, large);
}

// The short last group's MMA block b (J = tail_mmas MMAs, read per MMA; lane t's run starts at 4J·t): rows
// g / g + 8 at va / vb (elements from k0) decoded by Dec into the A fragments pa / pb.
template <class Fmt, class Dec>
__device__ __forceinline__ void mx_tail_fragments(const uint8_t* va, const uint8_t* vb, int k0, int tail_mmas,
                                                  int b, int t, uint32_t (&pa)[4], uint32_t (&pb)[4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t elem = k0 + 4 * tail_mmas * t + 4 * (2 * b + h);
    const int64_t byte = elem * Fmt::kRowBytesNum / Fmt::kRowBytesDen;
    uint32_t tmp[Fmt::kPairsPerWord];
    Dec::decode(Fmt::load_tail(va + byte), tmp);
    pa[2 * h] = tmp[0], pa[2 * h + 1] = tmp[1];
    Dec::decode(Fmt::load_tail(vb + byte), tmp);
    pb[2 * h] = tmp[0], pb[2 * h + 1] = tmp[1];
  }
}

template <class Fmt, int kNTiles>
__device__ void mx_exact_slice(float (&acc)[kNTiles][4], const __nv_bfloat16* const (&xr)[kNTiles],
                               const bool (&xok)[kNTiles], const uint8_t* va, const uint8_t* vb,
                               const uint8_t* sa, const uint8_t* sb, int first, int nfull, int k, bool tail,
                               int t) {
  using E = typename Fmt::Exact;
  constexpr int kBlocks = Fmt::kGroupK / 32;
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
  for (int q0 = first; q0 < nfull; q0 += kWarps * kUnroll)
    for (int q = q0; q < q0 + kUnroll && q < nfull; ++q)
      mx_group<E, kNTiles>(acc, xr, xok, load_stream16(va + q * 64 + 16 * t),
                           load_stream16(vb + q * 64 + 16 * t), load_scales<kBlocks, false>(sa + q * kBlocks),
                           load_scales<kBlocks, false>(sb + q * kBlocks), q * Fmt::kGroupK, true);
  if (!tail) return;
  const int k0 = nfull * Fmt::kGroupK, tail_blocks = (k - k0) / 32;
  for (int b = 0; b < tail_blocks; ++b) {
    uint32_t pa[4], pb[4];
    mx_tail_fragments<Fmt, E>(va, vb, k0, 2 * tail_blocks, b, t, pa, pb);
    mx_block_mma<E, kNTiles>(acc, xr, xok, pa, pb, k0 + 32 * b, __ldg(sa + k0 / 32 + b),
                             __ldg(sb + k0 / 32 + b), true);
  }
}

// Policy (Fmt): kGroupK elements per group; kPairsPerWord bf16x2 pairs decoded from one 32-bit word, in MMA
// slot order (MMA j: pair 2j feeds slots 2t..2t+1, pair 2j+1 feeds 2t+8..2t+9); kRowBytesNum/Den: row bytes
// per element; load_tail(p) reads the 4 elements a lane owns of one MMA in a short group; kScaleFold: decoded
// values are the true ones times 2^-kScaleFold (0: exact values), undone in the scale multiply; kScaleVote
// (exact decodes): the cheap scale path behind a vote (see kVote).
// kStep (1 n-tile only): a whole step of kUnroll groups as one branch-free block (see the loop).
// One tile: weight rows row0..row0+15 of the [n, k] matrix at wv / ws, output y [m, n].
struct GemvTile {
  const uint8_t* wv;
  const uint8_t* ws;
  __nv_bfloat16* y;
  int n, row0;
};
// The tile body of one block, run for tiles get(0) .. get(count - 1) in turn, against activation rows
// 0..m-1 (x row i at x + i·k, or with kGather at x + (x_rows[i] / x_div)·k: the grouped MoE entry,
// gemv_grouped.cuh). kPersist (count > 1: persistent blocks): each warp's register pipeline runs on across
// tiles, the last step of tile i prefetching tile i + 1's first step, so a warp's loads never wait for its
// block's epilogue or for a new block to start; the epilogue double-buffers its shared sums. Each tile's
// result is bitwise that of a one-tile run (same K slices per warp, same order of sums).
template <class Fmt, int kNTiles, bool kHasTail, bool kStep, bool kGather, bool kPersist, class Get>
__device__ __forceinline__ void gemv_mx_tiles(const __nv_bfloat16* __restrict__ x, int m,
                                              const int32_t* __restrict__ x_rows, int x_div, int k, int count,
                                              const Get& get) {
  constexpr int kBlocks = Fmt::kGroupK / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t row_bytes = static_cast<int64_t>(k) * Fmt::kRowBytesNum / Fmt::kRowBytesDen;
  const int kb = k / 32;
  // The lane's two weight rows (g, g + 8) of a tile: values and scales.
  struct Rows {
    const uint8_t *va, *vb, *sa, *sb;
  };
  auto rows_of = [&](const GemvTile& tl) {
    // note: rows past n read row n-1 (valid memory) and are never stored.
    const int64_t ra = min(tl.row0 + g, tl.n - 1), rb = min(tl.row0 + g + 8, tl.n - 1);
    return Rows{tl.wv + ra * row_bytes, tl.wv + rb * row_bytes, tl.ws + ra * kb, tl.ws + rb * kb};
  };
  const __nv_bfloat16* xr[kNTiles];
  bool xok[kNTiles];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    xok[nt] = nt * 8 + g < m;
    const int xi = xok[nt] ? nt * 8 + g : 0;
    xr[nt] = x + static_cast<int64_t>(kGather ? x_rows[xi] / x_div : xi) * k + 4 * t;
  }
  float acc[kNTiles][4];

  // One 16-k MMA-pair block and the scale vote: mx_block_mma / mx_needs_exact (above), shared with the
  // shared-memory ring kernel (gemv_mx_ring.cuh).
  using Fold = FoldedScale<Fmt::kScaleFold>;
  constexpr bool kVote = mx_scale_vote<Fmt, kNTiles>();
  auto needs_exact = [](uint32_t a, uint32_t b) { return mx_needs_exact<Fmt>(a, b); };
  auto block_mma = [&](const uint32_t* pa, const uint32_t* pb, int kx, uint32_t sbyte_a, uint32_t sbyte_b,
                       bool large) {
    mx_block_mma<Fmt, kNTiles>(acc, xr, xok, pa, pb, kx, sbyte_a, sbyte_b, large);
  };

  // Main loop, software-pipelined: the next kUnroll groups are in flight while the current ones compute.
  const int nfull = k / Fmt::kGroupK;
  constexpr int kStride = kWarps * kUnroll;
  uint4 wa[kUnroll], wb[kUnroll], na[kUnroll], nb[kUnroll];
  uint32_t sca[kUnroll], scb[kUnroll], nsa[kUnroll], nsb[kUnroll];
  auto load = [&](const Rows& r, int q0, uint4(&la)[kUnroll], uint4(&lb)[kUnroll], uint32_t(&ls)[kUnroll],
                  uint32_t(&lt)[kUnroll]) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (q0 + u >= nfull) break;
      const int q = q0 + u;
      la[u] = load_stream16(r.va + q * 64 + 16 * t);  // note: a group is 64 bytes in both formats
      lb[u] = load_stream16(r.vb + q * 64 + 16 * t);
      ls[u] = load_scales<kBlocks, !kHasTail>(r.sa + q * kBlocks);
      lt[u] = load_scales<kBlocks, !kHasTail>(r.sb + q * kBlocks);
    }
  };
  const int first = warp * kUnroll;
  // note: one-tile runs (kPersist false) read their tile once, here: the loop body then compiles to the
  // one-tile kernel's code (the tile's pointers computed once, not per use).
  const GemvTile tile0 = get(0);
  const Rows rows0 = rows_of(tile0);
  if (count > 0 && first < nfull) load(rows0, first, wa, wb, sca, scb);
  // note: under PDL (pdl.h) the first step's weights are in flight while the kernel before this one still
  // writes x; nothing the step writes is touched before this point. A bulk L2 prefetch of each tile's first
  // 4 KiB per row here, and a per-lane L2 prefetch of the next step, measured no faster in the 36-layer
  // Qwen3-8B decode (bench/history/RESULTS-log.md, "Session 4 — Qwen3-8B shapes at all 36 layers") and were
  // dropped.
  pdl::enter();
  // note: x is read only past the wait; its rows are the same for every tile of this call.
  const bool small = warp_rows_small<Fmt>(
      [&](int r) { return x + static_cast<int64_t>(kGather ? x_rows[r] / x_div : r) * k; }, m, k, first,
      nfull, kHasTail && warp == kWarps - 1, lane);
  for (int ti = 0; ti < count; ++ti) {
    const Rows cur = kPersist ? rows_of(get(ti)) : rows0;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    // One group u of the current step.
    auto group = [&](int u, int q0, bool large) {
      mx_group<Fmt, kNTiles>(acc, xr, xok, wa[u], wb[u], sca[u], scb[u], (q0 + u) * Fmt::kGroupK, large);
    };
    for (int q0 = first; q0 < nfull; q0 += kStride) {
      if (q0 + kStride < nfull)
        load(cur, q0 + kStride, na, nb, nsa, nsb);
      else if (kPersist && ti + 1 < count)
        load(rows_of(get(ti + 1)), first, na, nb, nsa, nsb);
      if constexpr (kStep) {
        const int valid = min(kUnroll, nfull - q0);
        // note: one "large" vote per step instead of per group (the large path is exact for every byte), so
        // a whole step without large bytes runs as one branch-free block: the compiler can overlap one
        // group's decode with another's MMAs and x loads (per-group votes and bounds checks split it in 4,
        // SASS). Only for one n-tile: with more, the merged block spills (ptxas, sm_90a: 64-96 B more at 2
        // n-tiles); at one n-tile it costs 0 (MXFP8), 8 (MXFP4) spill bytes. kStep = false: the per-group
        // loop.
        bool large = false;
        if constexpr (kVote) {
          bool any = false;
#pragma unroll
          for (int u = 0; u < kUnroll; ++u)
            if (u < valid) any = any || needs_exact(sca[u], scb[u]);
          large = __any_sync(0xFFFFFFFFu, any);
        }
        if (valid == kUnroll && !large) {
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) group(u, q0, false);
        } else {
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            if (u >= valid) break;
            group(u, q0, large);
          }
        }
      } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (q0 + u >= nfull) break;
          group(u, q0, kVote && __any_sync(0xFFFFFFFFu, needs_exact(sca[u], scb[u])));
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) wa[u] = na[u], wb[u] = nb[u], sca[u] = nsa[u], scb[u] = nsb[u];
    }

    if constexpr (kHasTail) {
      // note: the short last group (J = 2, 4 or 6 MMAs) is read per MMA; lane t's run starts at 4J·t.
      const int k0 = nfull * Fmt::kGroupK, tail_blocks = (k - k0) / 32, tail_mmas = 2 * tail_blocks;
      if (warp == kWarps - 1) {
        for (int b = 0; b < tail_blocks; ++b) {
          uint32_t pa[4], pb[4];
          mx_tail_fragments<Fmt, Fmt>(cur.va, cur.vb, k0, tail_mmas, b, t, pa, pb);
          const uint32_t tsa = __ldg(cur.sa + k0 / 32 + b), tsb = __ldg(cur.sb + k0 / 32 + b);
          // note: exact decodes take e8m0_to_f32 in the short group (large = true).
          const bool large = Fmt::kScaleFold == 0 || __any_sync(0xFFFFFFFFu, Fold::any_large(tsa, tsb));
          block_mma(pa, pb, k0 + 32 * b, tsa, tsb, large);
        }
      }
    }

    if (small)
      mx_exact_slice<Fmt, kNTiles>(acc, xr, xok, cur.va, cur.vb, cur.sa, cur.sb, first, nfull, k,
                                   kHasTail && warp == kWarps - 1, t);
    // note: the persistent kernel recomputes its tile here rather than keep it live across the loop.
    const GemvTile tl = kPersist ? get(ti) : tile0;
    store_tile_sums<kNTiles, kPersist ? 2 : 1>(acc, warp, lane, tl.row0, m, tl.y, tl.n, ti & 1);
  }
}

// One tile (the grouped MoE entry, gemv_grouped.cuh): weight rows row0..row0+15 of wv / ws into y.
template <class Fmt, int kNTiles, bool kHasTail, bool kStep, bool kGather = false>
__device__ __forceinline__ void gemv_mx_tile(const __nv_bfloat16* __restrict__ x, int m,
                                             const int32_t* __restrict__ x_rows, int x_div,
                                             const uint8_t* __restrict__ wv, const uint8_t* __restrict__ ws,
                                             __nv_bfloat16* __restrict__ y, int n, int k, int row0) {
  const GemvTile tile{wv, ws, y, n, row0};
  gemv_mx_tiles<Fmt, kNTiles, kHasTail, kStep, kGather, false>(x, m, x_rows, x_div, k, 1,
                                                               [&](int) { return tile; });
}

// Which GEMV part grid block b serves and its first weight row: parts are laid out one after another on the
// grid, each in ceil(n_p / 16) row tiles. Returns the part index.
__device__ __forceinline__ int gemv_part_of_block(const GemvParts& p, int b, int& row0) {
  int q = 0;
#pragma unroll
  for (int i = 0; i < kMaxGemvParts - 1; ++i) {
    const int tiles = (p.n[q] + kRowsPerTile - 1) / kRowsPerTile;
    if (q + 1 < p.count && b >= tiles) b -= tiles, ++q;
  }
  row0 = b * kRowsPerTile;
  return q;
}

// Tile b of the grid's flat tile list over the parts of p.
__device__ __forceinline__ GemvTile gemv_parts_tile(const GemvParts& p, int b) {
  int row0;
  const int q = gemv_part_of_block(p, b, row0);
  return {p.values[q], p.scales[q], reinterpret_cast<__nv_bfloat16*>(p.y[q]), p.n[q], row0};
}

// One launch for every part of p (one projection, or q/k/v or gate/up of the same x): each block runs the
// tile body on its part's weights, so each part's y equals its own launch's bit for bit.
template <class Fmt, int kNTiles, bool kHasTail, bool kStep>
__global__ void __launch_bounds__(kThreads, 2)
    gemv_mx_kernel(const __nv_bfloat16* __restrict__ x, int m, const GemvParts p, int k) {
  gemv_mx_tiles<Fmt, kNTiles, kHasTail, kStep, false, false>(
      x, m, nullptr, 1, k, 1, [&](int) { return gemv_parts_tile(p, static_cast<int>(blockIdx.x)); });
}

// The same with persistent blocks (grid = min(tiles, 2 per SM)): block b runs tiles b, b + grid, ... with
// its warps' register pipelines running on from tile to tile (gemv_mx_tiles, kPersist); y is bitwise the
// one-tile-per-block kernel's.
template <class Fmt, int kNTiles, bool kHasTail, bool kStep>
__global__ void __launch_bounds__(kThreads, 2)
    gemv_mx_persist_kernel(const __nv_bfloat16* __restrict__ x, int m, const GemvParts p, int k, int tiles) {
  const int b = static_cast<int>(blockIdx.x), grid = static_cast<int>(gridDim.x);
  gemv_mx_tiles<Fmt, kNTiles, kHasTail, kStep, false, true>(
      x, m, nullptr, 1, k, (tiles - b + grid - 1) / grid,
      [&](int i) { return gemv_parts_tile(p, b + i * grid); });
}

// Row tiles of all parts of p (the one-tile-per-block grid).
inline int gemv_parts_tiles(const GemvParts& p) {
  int tiles = 0;
  for (int q = 0; q < p.count; ++q) tiles += (p.n[q] + kRowsPerTile - 1) / kRowsPerTile;
  return tiles;
}

// The SM count of the current device (at least 1: a grid of one block per SM still launches).
inline int gemv_sms() { return std::max(1, device_sms()); }

// The persistent grid: 2 blocks per SM. note: __launch_bounds__(kThreads, 2) caps the kernel at 128
// registers, so exactly 2 blocks of 256 threads fit an SM (64 K registers); the double-buffered sums take
// 8 KiB of shared memory per block at one n-tile.
inline int gemv_persist_blocks() { return 2 * gemv_sms(); }

// Template dispatch on (n-tiles, tail); arguments were checked by gemv_mx.cpp / linear.cpp. `step`: the
// branch-free step body at one n-tile (m <= 8). `persist`: persistent blocks at one n-tile (m <= 8; above,
// the one-tile-per-block kernel). kMaxNTiles: the largest n-tile count instantiated (the caller keeps
// m <= 8 · kMaxNTiles).
template <class Fmt, int kMaxNTiles = 4>
cudaError_t launch_gemv(const uint16_t* x, int m, const GemvParts& p, int k, bool step, bool persist,
                        cudaStream_t stream) {
  const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
  const int tiles = gemv_parts_tiles(p);
  const dim3 grid(static_cast<unsigned>(tiles));
  const bool tail = k % Fmt::kGroupK != 0;
#define MXQ_GEMV_LAUNCH(NT, STEP)                                                                            \
  return launch_pdl(tail ? gemv_mx_kernel<Fmt, NT, true, STEP> : gemv_mx_kernel<Fmt, NT, false, STEP>, grid, \
                    dim3(kThreads), 0, stream, xb, m, p, k)
#define MXQ_GEMV_PERSIST(STEP)                                                                               \
  return launch_pdl(                                                                                         \
      tail ? gemv_mx_persist_kernel<Fmt, 1, true, STEP> : gemv_mx_persist_kernel<Fmt, 1, false, STEP>,       \
      dim3(static_cast<unsigned>(std::min(tiles, gemv_persist_blocks()))), dim3(kThreads), 0, stream, xb, m, \
      p, k, tiles)
  if (m <= 8 && persist) {
    if (step)
      MXQ_GEMV_PERSIST(true);
    else
      MXQ_GEMV_PERSIST(false);
  }
  // note: 3 and 4 n-tiles (M 17..32) spill 130-230 bytes here (ptxas, sm_90a) and still measured as fast as
  // the streaming kernel at M = 24 (bench/history/RESULTS-log.md, "GEMV at M <= 32: read-only ceiling").
  if (m <= 8) {
    if (step)
      MXQ_GEMV_LAUNCH(1, true);
    else
      MXQ_GEMV_LAUNCH(1, false);
  } else if constexpr (kMaxNTiles > 1) {
    if (m <= 16)
      MXQ_GEMV_LAUNCH(2, false);
    else if (m <= 24)
      MXQ_GEMV_LAUNCH(3, false);
    else
      MXQ_GEMV_LAUNCH(4, false);
  }
#undef MXQ_GEMV_LAUNCH
#undef MXQ_GEMV_PERSIST
  return cudaErrorInvalidValue;  // m > 8 · kMaxNTiles: a caller's bug
}

}  // namespace mxq::cuda::gemv
