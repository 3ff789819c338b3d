// The GEMV skeleton shared by gemv_mxfp8.cu and gemv_mxfp4.cu; each supplies a decode policy.
// Layout contract: gemv_layout.h. Tiles: a block of 8 warps owns 16 weight rows; its warps split K by
// groups and add up in shared memory. Per group a quad lane loads 16 B of row r and 16 B of row r+8,
// decodes them to bf16 pairs in registers and feeds mma.sync m16n8k16 (A = weights, B = x^T, one n-tile
// of 8 activation rows per 8 of M, up to 4 for M <= 32). The MMAs of one 32-element scale block accumulate
// from zero; the E8M0 scale multiplies that partial in f32.
// note: 1, 2 or 4 warps per tile with longer K slices measured slower on every Qwen3 shape, as did a
// ping-pong register pipeline (bench/RESULTS.md, runs 3-4): 8 warps split one tile's K.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/gemv_mx_launch.h"

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
template <int kNTiles>
__device__ __forceinline__ void store_tile_sums(const float (&acc)[kNTiles][4], int warp, int lane, int row0,
                                                int m, __nv_bfloat16* __restrict__ y, int n) {
  const int g = lane >> 2, t = lane & 3;
  __shared__ float red[kWarps][kNTiles * 4][32];
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

// Policy (Fmt): kGroupK elements per group; kPairsPerWord bf16x2 pairs decoded from one 32-bit word, in MMA
// slot order (MMA j: pair 2j feeds slots 2t..2t+1, pair 2j+1 feeds 2t+8..2t+9); kRowBytesNum/Den: row bytes
// per element; load_tail(p) reads the 4 elements a lane owns of one MMA in a short group; kScaleFold: decoded
// values are the true ones times 2^-kScaleFold (0: exact values), undone in the scale multiply.
// kStep (1 n-tile only): a whole step of kUnroll groups as one branch-free block (see the loop).
// The tile body of one block: weight rows row0..row0+15 against activation rows 0..m-1 (x row i at
// x + i·k, or with kGather at x + (x_rows[i] / x_div)·k: the grouped MoE entry, gemv_grouped.cuh).
template <class Fmt, int kNTiles, bool kHasTail, bool kStep, bool kGather = false>
__device__ __forceinline__ void gemv_mx_tile(const __nv_bfloat16* __restrict__ x, int m,
                                             const int32_t* __restrict__ x_rows, int x_div,
                                             const uint8_t* __restrict__ wv, const uint8_t* __restrict__ ws,
                                             __nv_bfloat16* __restrict__ y, int n, int k, int row0) {
  constexpr int kMmas = Fmt::kGroupK / 16, kBlocks = Fmt::kGroupK / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  // note: rows past n read row n-1 (valid memory) and are never stored.
  const int64_t ra = min(row0 + g, n - 1), rb = min(row0 + g + 8, n - 1);
  const int64_t row_bytes = static_cast<int64_t>(k) * Fmt::kRowBytesNum / Fmt::kRowBytesDen;
  const uint8_t* va = wv + ra * row_bytes;
  const uint8_t* vb = wv + rb * row_bytes;
  const int kb = k / 32;
  const uint8_t* sa = ws + ra * kb;
  const uint8_t* sb = ws + rb * kb;
  const __nv_bfloat16* xr[kNTiles];
  bool xok[kNTiles];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    xok[nt] = nt * 8 + g < m;
    const int xi = xok[nt] ? nt * 8 + g : 0;
    xr[nt] = x + static_cast<int64_t>(kGather ? x_rows[xi] / x_div : xi) * k + 4 * t;
  }
  float acc[kNTiles][4] = {};

  // One 16-k MMA-pair block: pairs = the lane's 4 bf16x2 words for MMAs (2b, 2b+1), kx = group start + 32b.
  // large: some lane of the warp holds a scale byte past FoldedScale::kLimit in this group (warp-uniform).
  using Fold = FoldedScale<Fmt::kScaleFold>;
  auto block_mma = [&](const uint32_t* pa, const uint32_t* pb, int kx, uint32_t sbyte_a, uint32_t sbyte_b,
                       bool large) {
    float s_a, s_b, pre_a = 1.f, pre_b = 1.f;
    if constexpr (Fmt::kScaleFold == 0) {
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
  };

  // Main loop, software-pipelined: the next kUnroll groups are in flight while the current ones compute.
  const int nfull = k / Fmt::kGroupK;
  constexpr int kStride = kWarps * kUnroll;
  uint4 wa[kUnroll], wb[kUnroll], na[kUnroll], nb[kUnroll];
  uint32_t sca[kUnroll], scb[kUnroll], nsa[kUnroll], nsb[kUnroll];
  auto load = [&](int q0, uint4(&la)[kUnroll], uint4(&lb)[kUnroll], uint32_t(&ls)[kUnroll],
                  uint32_t(&lt)[kUnroll]) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (q0 + u >= nfull) break;
      const int q = q0 + u;
      la[u] = load_stream16(va + q * 64 + 16 * t);  // note: a group is 64 bytes in both formats
      lb[u] = load_stream16(vb + q * 64 + 16 * t);
      ls[u] = load_scales<kBlocks, !kHasTail>(sa + q * kBlocks);
      lt[u] = load_scales<kBlocks, !kHasTail>(sb + q * kBlocks);
    }
  };
  int q0 = warp * kUnroll;
  if (q0 < nfull) load(q0, wa, wb, sca, scb);
  // One group u of the current step.
  auto group = [&](int u, int q0, bool large) {
    uint32_t pa[kMmas * 2], pb[kMmas * 2];
    const uint32_t wa4[4] = {wa[u].x, wa[u].y, wa[u].z, wa[u].w},
                   wb4[4] = {wb[u].x, wb[u].y, wb[u].z, wb[u].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      Fmt::decode(wa4[i], pa + i * Fmt::kPairsPerWord);
      Fmt::decode(wb4[i], pb + i * Fmt::kPairsPerWord);
    }
    const int kx = (q0 + u) * Fmt::kGroupK;
#pragma unroll
    for (int b = 0; b < kBlocks; ++b)
      block_mma(pa + 4 * b, pb + 4 * b, kx + 32 * b, (sca[u] >> (8 * b)) & 0xFF, (scb[u] >> (8 * b)) & 0xFF,
                large);
  };
  for (; q0 < nfull; q0 += kStride) {
    if (q0 + kStride < nfull) load(q0 + kStride, na, nb, nsa, nsb);
    if constexpr (kStep) {
      const int valid = min(kUnroll, nfull - q0);
      // note: one "large" vote per step instead of per group (the large path is exact for every byte), so
      // a whole step without large bytes runs as one branch-free block: the compiler can overlap one group's
      // decode with another's MMAs and x loads (per-group votes and bounds checks split it in 4, SASS).
      // Only for one n-tile: with more, the merged block spills (ptxas, sm_90a: 64-96 B more at 2 n-tiles);
      // at one n-tile it costs 0 (MXFP8), 8 (MXFP4) spill bytes. kStep = false: the per-group loop.
      bool large = false;
      if constexpr (Fmt::kScaleFold != 0) {
        bool any = false;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (u < valid) any = any || Fold::any_large(sca[u], scb[u]);
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
        group(u, q0, Fmt::kScaleFold != 0 && __any_sync(0xFFFFFFFFu, Fold::any_large(sca[u], scb[u])));
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
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t elem = k0 + 4 * tail_mmas * t + 4 * (2 * b + h);
          const int64_t byte = elem * Fmt::kRowBytesNum / Fmt::kRowBytesDen;
          uint32_t tmp[Fmt::kPairsPerWord];
          Fmt::decode(Fmt::load_tail(va + byte), tmp);
          pa[2 * h] = tmp[0], pa[2 * h + 1] = tmp[1];
          Fmt::decode(Fmt::load_tail(vb + byte), tmp);
          pb[2 * h] = tmp[0], pb[2 * h + 1] = tmp[1];
        }
        const uint32_t tsa = __ldg(sa + k0 / 32 + b), tsb = __ldg(sb + k0 / 32 + b);
        const bool large = Fmt::kScaleFold != 0 && __any_sync(0xFFFFFFFFu, Fold::any_large(tsa, tsb));
        block_mma(pa, pb, k0 + 32 * b, tsa, tsb, large);
      }
    }
  }

  store_tile_sums<kNTiles>(acc, warp, lane, row0, m, y, n);
}

template <class Fmt, int kNTiles, bool kHasTail, bool kStep>
__global__ void __launch_bounds__(kThreads, 2)
    gemv_mx_kernel(const __nv_bfloat16* __restrict__ x, int m, const uint8_t* __restrict__ wv,
                   const uint8_t* __restrict__ ws, __nv_bfloat16* __restrict__ y, int n, int k) {
  gemv_mx_tile<Fmt, kNTiles, kHasTail, kStep>(x, m, nullptr, 1, wv, ws, y, n, k, blockIdx.x * kRowsPerTile);
}

// Template dispatch on (n-tiles, tail); arguments were checked by gemv_mx.cpp. `step`: the branch-free step
// body at one n-tile (m <= 8). kMaxNTiles: the largest n-tile count instantiated (the caller keeps
// m <= 8 · kMaxNTiles).
template <class Fmt, int kMaxNTiles = 4>
cudaError_t launch_gemv(const uint16_t* x, int m, const uint8_t* values, const uint8_t* scales, uint16_t* y,
                        int n, int k, bool step, cudaStream_t stream) {
  const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
  auto* yb = reinterpret_cast<__nv_bfloat16*>(y);
  const dim3 grid(static_cast<unsigned>((n + kRowsPerTile - 1) / kRowsPerTile));
  const bool tail = k % Fmt::kGroupK != 0;
#define MXQ_GEMV_LAUNCH(NT, STEP)                                                                           \
  do {                                                                                                      \
    if (tail)                                                                                               \
      gemv_mx_kernel<Fmt, NT, true, STEP><<<grid, kThreads, 0, stream>>>(xb, m, values, scales, yb, n, k);  \
    else                                                                                                    \
      gemv_mx_kernel<Fmt, NT, false, STEP><<<grid, kThreads, 0, stream>>>(xb, m, values, scales, yb, n, k); \
  } while (0)
  // note: 3 and 4 n-tiles (M 17..32) spill 130-230 bytes here (ptxas, sm_90a) and still measured as fast as
  // the streaming kernel at M = 24 (bench/RESULTS.md, GEMV M <= 32).
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
  return cudaGetLastError();
}

}  // namespace mxq::cuda::gemv
