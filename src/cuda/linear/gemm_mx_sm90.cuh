// The sm_90a MX GEMM: wgmma with the weights as A from registers, activations as B from shared memory.
// Computes Y^T = W · X^T per tile: 128 weight rows (N) x kBM activation rows (M), K in 64-wide stages.
// Warp-specialised, 3 warpgroups, persistent without a K split (one block per SM walks the tiles; the
// rings run on across tiles, so the next tile's loads overlap this one's epilogue):
//   warpgroup 0, the producer: warp 0 lane 0 keeps the x ring full (TMA, 64 k x kBM rows of bf16, 128-byte
//   swizzle); warp 1 keeps the weight ring full: lane 0 copies the tile's 128 rows x 64 bytes of one layout
//   group (64 k of MXFP8, 128 k of MXFP4; the GEMV layout, gemv_layout.h) by TMA into a slot ([row][64 B],
//   no swizzle), and every lane stores 4 rows' scale bytes of the group (loaded 4 groups ahead) next to it;
//   warpgroups 1 and 2, the consumers, own 64 weight rows each: per stage every lane reads the bytes its A
//   fragments need in natural k order straight from the staged group (two 16-byte (MXFP8) or 8-byte (MXFP4)
//   shared loads per row, no quad shuffles), decodes them with the scale folded in (gemm_mx_kernel.cuh),
//   frees the weight slot and issues wgmma m64nBMk16 (f32 accumulators) from a ring of 3 A-register sets:
//   stage s+2 is decoded while stage s runs on the tensor cores (stage s+1's fragments are ready).
// note: the weight slot is freed as soon as its bytes are in registers (not when the wgmmas retire), so a
// slot lives ~1 stage and the ring can run 8 groups ahead for the price of 68 KB of shared memory.
// Epilogue (without a K split, n % 8 == 0, y 16-byte aligned): each consumer warp scales its 16 rows x kBM
// columns of f32 accumulators, packs them to bf16 and writes them transposed (stmatrix .trans: y is
// [m, n]) into its own 2 KB of shared memory, 64 activation rows at a time, then stores each row's 32 bytes
// with 16-byte stores (whole 32-byte sectors); elsewhere (split-K partials, odd n) 2-byte stores from
// registers.
#pragma once

#include <cuda.h>

#include <type_traits>
#include <utility>

#include "cuda/common/bf16_pack.cuh"
#include "cuda/linear/gemm_mx_kernel.cuh"

namespace mxq::cuda::gemm {

inline constexpr int kSm90BlockN = 128, kSm90Threads = 384;
// A weight slot: 128 rows x 64 bytes of one layout group (both formats), then 128 u32 of scale bytes.
inline constexpr int kWGroupBytes = 64, kWSlotBytes = kSm90BlockN * kWGroupBytes;
// Pipeline shapes by activation tile: x stages and weight slots (8: 8 groups of weights in flight).
// note: the x ring of 256-row tiles (32 KB a stage) keeps 4 stages as before (5 stages with 6 weight slots
// measured the same, bench/history/RESULTS-log.md, "MX GEMM: weights staged through shared memory"); the
// smaller tiles' rings have room for more.
constexpr int sm90_x_stages(int bm) { return bm == 256 ? 4 : 6; }
// note: 7 slots measured 4-20% slower than 8 at M = 4096 (down_proj most; bench/history/RESULTS-log.md,
// "Session 10 (lead) — issue #4: the MX GEMM's epilogue").
inline constexpr int kSm90WSlots = 8;
constexpr int sm90_stage_bytes(int bm) { return bm * kStageK * 2; }
// A consumer warp's epilogue buffer: 64 activation rows of its 16 weight columns (32 bytes).
inline constexpr int kOutRows = 64, kOutWarpBytes = kOutRows * 32, kOutBytes = 8 * kOutWarpBytes;
// note: + 1024 so the x ring can start on a 1024-byte boundary (128-byte swizzle atoms), + barriers.
constexpr int sm90_smem_bytes(int bm) {
  return sm90_x_stages(bm) * sm90_stage_bytes(bm) + kOutBytes +
         kSm90WSlots * (kWSlotBytes + 4 * kSm90BlockN) + 1024 + 2 * (sm90_x_stages(bm) + kSm90WSlots) * 8;
}
static_assert(sm90_smem_bytes(256) <= 227 * 1024 && sm90_smem_bytes(128) <= 227 * 1024 &&
              sm90_smem_bytes(64) <= 227 * 1024);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// The bytes from shared pointer p to the next 1024-byte boundary (128-byte swizzle atoms). note: add them to
// the pointer: an offset keeps the result in the shared window, so reads and writes through it compile to LDS
// / STS; rounding through an integer made them generic loads (LD.E, long-scoreboard latency;
// bench/history/RESULTS-log.md,
// "Session 10 (lead) — issue #4: the MX GEMM's epilogue and shared-memory loads").
__device__ __forceinline__ uint32_t pad_to_1024(const void* p) {
  return (1024u - (smem_addr(p) & 1023u)) & 1023u;
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n wait_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra wait_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];" ::"r"(smem_addr(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}
// K-major operand, 128-byte swizzle: rows of 128 B, 8-row atoms 1024 B apart (SBO); LBO unused.
__device__ __forceinline__ uint64_t smem_desc(const void* p) {
  return static_cast<uint64_t>((smem_addr(p) & 0x3FFFF) >> 4) | (1ull << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Four 8x8 bf16 matrices (lane l: row l / 4, columns 2(l % 4), +1 of each) stored transposed: row r of
// matrix i (its column r) to the 16 bytes at lane 8i + r's address.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                                  uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// The accumulator operands of an m64nN wgmma: d[o] .. d[o + N/2 - 1] (d: a float array).
#define MXQ_WGMMA_D16(d, o)                                                                             \
  "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]),           \
      "+f"(d[o + 6]), "+f"(d[o + 7]), "+f"(d[o + 8]), "+f"(d[o + 9]), "+f"(d[o + 10]), "+f"(d[o + 11]), \
      "+f"(d[o + 12]), "+f"(d[o + 13]), "+f"(d[o + 14]), "+f"(d[o + 15])
#define MXQ_WGMMA_D32(d, o) MXQ_WGMMA_D16(d, o), MXQ_WGMMA_D16(d, o + 16)
#define MXQ_WGMMA_D64(d, o) MXQ_WGMMA_D32(d, o), MXQ_WGMMA_D32(d, o + 32)
#define MXQ_WGMMA_D128(d) MXQ_WGMMA_D64(d, 0), MXQ_WGMMA_D64(d, 64)

// d[128] += A (registers, 64 x 16 over the warpgroup) · B (shared, K-major 16 x 256).
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
      : MXQ_WGMMA_D128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
}

// d[64] += A (registers, 64 x 16 over the warpgroup) · B (shared, K-major 16 x 128).
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : MXQ_WGMMA_D64(d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
}

// d[32] += A (registers, 64 x 16 over the warpgroup) · B (shared, K-major 16 x 64).
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : MXQ_WGMMA_D32(d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
}

// d[16] += A (registers, 64 x 16 over the warpgroup) · B (shared, K-major 16 x 32).
__device__ __forceinline__ void wgmma_m64n32k16_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : MXQ_WGMMA_D16(d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
}
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// One row's A-fragment pairs for the 4 k-steps of a stage, read from the row's 64 staged bytes rp of the
// stage's layout group (GEMV layout: lane run t' holds canonical 16j + 4t' + e at 16t' + 4j + e for MXFP8,
// at byte 16t' + 2j + e/2 for MXFP4): lo[j] = canonical 16j + 2t, +1 (run t/2), hi[j] = 16j + 2t + 8, +9
// (run 2 + t/2), so the lane reads runs t/2 and 2 + t/2 and keeps half t&1 of each word (MXFP8) or byte
// t&1 of each half-word (MXFP4). sc: the stage's two scale bytes (bits 0-15); h: the stage's half of an
// MXFP4 group; gb: the group's bytes (64, or a tail group's 16..48: runs of gb/4 bytes at (gb/4)·t').
// Same values in the same fragment slots as the session-5 kernel's decode (16-byte global loads, then 4 quad
// shuffles for MXFP8, 2 for MXFP4): its outputs were bitwise equal on the GPU (bench/history/RESULTS-log.md,
// "MX GEMM: weights staged through shared memory").
// note: 16-byte reads of [row][64 B]: a quarter warp (2 rows) reads 128 contiguous bytes, conflict-free;
// the MXFP4 8-byte reads (a half warp, 4 rows) are 2-way conflicted (rows r and r+2 share banks).
template <class Fmt, bool kTail>
__device__ __forceinline__ void row_fragments_smem(const uint8_t* rp, uint32_t sc, uint32_t bref, int t,
                                                   int h, int gb, uint32_t (&lo)[4], uint32_t (&hi)[4]) {
  const uint32_t s0 = fold_scale(sc & 0xFF, bref, Fmt::kFoldBase);
  const uint32_t s1 = fold_scale((sc >> 8) & 0xFF, bref, Fmt::kFoldBase);
  const int tp = t >> 1, odd = t & 1;
  if constexpr (Fmt::kWords == 4) {
    uint32_t u0[4], u1[4];
    if (!kTail || gb == kWGroupBytes) {
      const uint4 a = *reinterpret_cast<const uint4*>(rp + 16 * tp);
      const uint4 b = *reinterpret_cast<const uint4*>(rp + 32 + 16 * tp);
      u0[0] = a.x, u0[1] = a.y, u0[2] = a.z, u0[3] = a.w, u1[0] = b.x, u1[1] = b.y, u1[2] = b.z, u1[3] = b.w;
    } else {  // a 32-wide tail group: runs of 8 bytes, k-steps 2 and 3 zero
      const uint2 a = *reinterpret_cast<const uint2*>(rp + 8 * tp);
      const uint2 b = *reinterpret_cast<const uint2*>(rp + 16 + 8 * tp);
      u0[0] = a.x, u0[1] = a.y, u0[2] = 0, u0[3] = 0, u1[0] = b.x, u1[1] = b.y, u1[2] = 0, u1[3] = 0;
    }
    // note: selector nibbles 8..B replicate a byte's sign into the byte above it (e4m3x4_to_bf16x4_scaled).
    const uint32_t sel = odd ? 0xB3A2u : 0x9180u;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t s = j < 2 ? s0 : s1;
      lo[j] = gemv::bf16x2_mul((gemv::prmt(u0[j], 0, sel) << 4) & 0x87F087F0u, s);
      hi[j] = gemv::bf16x2_mul((gemv::prmt(u1[j], 0, sel) << 4) & 0x87F087F0u, s);
    }
  } else {
    uint32_t u0[2], u1[2];
    if (!kTail || gb == kWGroupBytes) {
      const uint2 a = *reinterpret_cast<const uint2*>(rp + 16 * tp + 8 * h);
      const uint2 b = *reinterpret_cast<const uint2*>(rp + 32 + 16 * tp + 8 * h);
      u0[0] = a.x, u0[1] = a.y, u1[0] = b.x, u1[1] = b.y;
    } else {  // a tail group of gb/16 words a run (1..3): stage h uses words 2h, 2h+1 where they exist
      const int run = gb / 4, words = gb / 16;
      const uint32_t* ra = reinterpret_cast<const uint32_t*>(rp + run * tp);
      const uint32_t* rb = reinterpret_cast<const uint32_t*>(rp + run * (2 + tp));
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        u0[i] = 2 * h + i < words ? ra[2 * h + i] : 0u;
        u1[i] = 2 * h + i < words ? rb[2 * h + i] : 0u;
      }
    }
    // q = {lo, hi of k-step 2i, lo, hi of k-step 2i+1}: byte t&1 of each half-word of u0[i] and u1[i].
    const uint32_t sel = 0x6240u + (odd ? 0x1111u : 0u);
    uint32_t p[4];
    e2m1x8_to_bf16x8_scaled(gemv::prmt(u0[0], u1[0], sel), s0, s0, p);
    lo[0] = p[0], hi[0] = p[1], lo[1] = p[2], hi[1] = p[3];
    e2m1x8_to_bf16x8_scaled(gemv::prmt(u0[1], u1[1], sel), s1, s1, p);
    lo[2] = p[0], hi[2] = p[1], lo[3] = p[2], hi[3] = p[3];
  }
}

// The scale bytes of layout group q of a row (bits 0-15: MXFP8 blocks 2q, 2q+1; MXFP4 blocks 4q..4q+3 in
// bits 0-31), missing tail blocks 0.
template <class Fmt, bool kTail>
__device__ __forceinline__ uint32_t group_scales(const uint8_t* row_s, int kb, int q) {
  if constexpr (Fmt::kWords == 4) {
    return load_stage_scales<kTail>(row_s, kb, q);
  } else {
    const uint32_t lo = load_stage_scales<kTail>(row_s, kb, 2 * q);
    return !kTail || 4 * q + 2 < kb ? lo | load_stage_scales<kTail>(row_s, kb, 2 * q + 1) << 16 : lo;
  }
}

// The block's two rings in shared memory: x stages, weight slots (values, then one scale word a row), and
// their full / empty barriers.
struct Sm90Rings {
  uint8_t* x;
  uint8_t* wvals;
  uint32_t* wscales;
  uint64_t *xfull, *xempty, *wfull, *wempty;
};
// A block's K range (one split): x stages s0 .. s0 + stages - 1 over layout groups g0 .. g0 + groups - 1.
struct Sm90KRange {
  int s0, stages, g0, groups;
};

// The producer warpgroup's loops, shared by the sm_90a MX GEMMs: warp 0 lane 0 keeps the x ring full
// (TMA, 64 k x kBM rows a stage), warp 1 the weight ring (lane 0: TMA of a layout group's 128 rows x 64 B;
// every lane: 4 rows' scale bytes of the group, loaded kAhead groups ahead). The block's tiles are
// tile_at(ti, n0, m0), ti < count; x stage G = ti·stages + s covers stages s0 + s, weight group
// Q = ti·groups + q covers layout group g0 + q, so both rings run on across tiles.
template <class Fmt, bool kTail, int kX, int kW, int kStageBytes, class TileAt>
__device__ __forceinline__ void sm90_produce(int warp, int lane, const TileAt& tile_at, int count,
                                             const CUtensorMap* xmap, const CUtensorMap* wmap,
                                             const Sm90Rings& r, const Sm90KRange& kr,
                                             const uint8_t* __restrict__ ws, int n, int kb) {
  if (warp == 0 && lane == 0) {
    for (int ti = 0; ti < count; ++ti) {
      int n0, m0;
      tile_at(ti, n0, m0);
      for (int s = 0; s < kr.stages; ++s) {
        const int G = ti * kr.stages + s, slot = G % kX;
        if (G >= kX) mbar_wait(r.xempty + slot, ((G / kX) - 1) & 1);
        mbar_expect_tx(r.xfull + slot, kStageBytes);
        tma_load_2d(r.x + slot * kStageBytes, xmap, (kr.s0 + s) * kStageK, m0, r.xfull + slot);
      }
    }
  } else if (warp == 1) {
    for (int ti = 0; ti < count; ++ti) {
      int n0, m0;
      tile_at(ti, n0, m0);
      // note: rows past n read row n-1's scales (valid memory); their values are TMA zero fill.
      auto load = [&](int q, uint32_t(&out)[4]) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
          out[i] = group_scales<Fmt, kTail>(ws + static_cast<int64_t>(min(n0 + lane + 32 * i, n - 1)) * kb,
                                            kb, kr.g0 + q);
      };
      constexpr int kAhead = 4;  // groups of scale loads in flight
      uint32_t sc[kAhead][4];
#pragma unroll
      for (int d = 0; d < kAhead; ++d)
        if (d < kr.groups) load(d, sc[d]);
      for (int q0 = 0; q0 < kr.groups; q0 += kAhead) {
#pragma unroll
        for (int d = 0; d < kAhead; ++d) {
          const int q = q0 + d, Q = ti * kr.groups + q, slot = Q % kW;
          if (q < kr.groups) {
            if (Q >= kW) mbar_wait(r.wempty + slot, ((Q / kW) - 1) & 1);
            if (lane == 0) {
              mbar_expect_tx(r.wfull + slot, kWSlotBytes);
              tma_load_2d(r.wvals + slot * kWSlotBytes, wmap, (kr.g0 + q) * kWGroupBytes, n0, r.wfull + slot);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) r.wscales[slot * kSm90BlockN + lane + 32 * i] = sc[d][i];
            mbar_arrive(r.wfull + slot);
            if (q + kAhead < kr.groups) load(q + kAhead, sc[d]);
          }
        }
      }
    }
  }
}
#endif

// Grid: x = up to cdiv(n, 128) * cdiv(m, kBM) tiles (tile_of), y = K splits; 384 threads,
// sm90_smem_bytes(kBM) of dynamic shared memory. Split-K (gridDim.y > 1, small grids): split z runs
// stages [z·c, z·c + c) of the cdiv(K, 64) (c = cdiv(stages, splits)) and stores its f32 partial tile, row
// scale applied, to ws[z][m][n]; splitk_reduce sums the splits in order into y (deterministic). ws is null
// without a split. wmap: the values plane as a 2D uint8 tensor [n rows, row bytes] (make_w_map), zero fill
// past its edges (rows past n and the bytes past a short last group read 0). kTail: K has a short last
// layout group (K % 64 for MXFP8, K % 128 for MXFP4); without one the scale loads need no bounds and are
// aligned. Persistent without a split: gridDim.x <= tiles blocks walk tiles b, b + gridDim.x, ... (with a
// split gridDim.x == tiles, one tile a block); both rings run on across a block's tiles, so the next tile's
// loads overlap this one's last stages and epilogue.
// note: two stages queued per consumer (4 A-register sets, wait_group 2, 5 x stages and 6 weight slots)
// measured 1-2% slower at M = 4096, decoding stage s+2 into a 4th set before waiting for stage s-1 4% slower
// (MXFP8; MXFP4 equal), and a kernel whose decoding moved to 2 warps of the producer warpgroup (bf16 A tiles
// in shared memory, SS wgmma in the consumers) 1.5x slower (bench/history/RESULTS-log.md,
// "Session 9 (lead) — issue #4: MX GEMM persistent grid; studies that did not win").
template <class Fmt, bool kTail, int kBM>
__global__ void __launch_bounds__(kSm90Threads, 1)
    gemm_mx_sm90(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap, int m,
                 const uint8_t* __restrict__ ws, __nv_bfloat16* __restrict__ y, int n, int k,
                 float* __restrict__ partial, int staged_store) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kStageBytes = sm90_stage_bytes(kBM), kX = sm90_x_stages(kBM), kW = kSm90WSlots;
  constexpr int kSpg = Fmt::kGroupK / kStageK;  // stages per layout group
  extern __shared__ uint8_t smem_raw[];
  uint8_t* ring = smem_raw + pad_to_1024(smem_raw);
  uint8_t* outbuf = ring + kX * kStageBytes;  // kOutBytes: the consumer warps' epilogue buffers
  uint8_t* wvals = outbuf + kOutBytes;
  uint32_t* wscales = reinterpret_cast<uint32_t*>(wvals + kW * kWSlotBytes);
  uint64_t* xfull = reinterpret_cast<uint64_t*>(wscales + kW * kSm90BlockN);
  uint64_t *xempty = xfull + kX, *wfull = xempty + kX, *wempty = wfull + kW;
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32, all_stages = (k + kStageK - 1) / kStageK;
  const int chunk = (all_stages + static_cast<int>(gridDim.y) - 1) / static_cast<int>(gridDim.y);
  const int s0 = static_cast<int>(blockIdx.y) * chunk, stages = min(chunk, all_stages - s0);
  const int g0 = s0 / kSpg, groups = (s0 + stages - 1) / kSpg - g0 + 1;  // the split's layout groups
  const int kb = k / 32;
  const int tiles_m = (m + kBM - 1) / kBM, tiles_n = (n + kSm90BlockN - 1) / kSm90BlockN;
  const int tiles = tiles_m * tiles_n;
  const int count =
      (tiles - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x);
  // Tile ti of this block (0 <= ti < count): its first weight row and activation row.
  auto tile_at = [&](int ti, int& n0, int& m0) {
    int tile_n, tile_m;
    tile_of(static_cast<int>(blockIdx.x) + ti * static_cast<int>(gridDim.x), tiles_m, tiles_n, tile_n,
            tile_m);
    n0 = tile_n * kSm90BlockN, m0 = tile_m * kBM;
  };
  if (threadIdx.x == 0) {
    for (int i = 0; i < kX; ++i) mbar_init(xfull + i, 1), mbar_init(xempty + i, 8);
    // wfull: warp 1's lane 0 (expect_tx) + its 32 lanes' scale stores; wempty: the 8 consumer warps.
    for (int i = 0; i < kW; ++i) mbar_init(wfull + i, 33), mbar_init(wempty + i, 8);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;");
    const Sm90Rings rings{ring, wvals, wscales, xfull, xempty, wfull, wempty};
    sm90_produce<Fmt, kTail, kX, kW, kStageBytes>(threadIdx.x / 32, lane, tile_at, count, &xmap, &wmap, rings,
                                                  Sm90KRange{s0, stages, g0, groups}, ws, n, kb);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;");
    const int warp = (threadIdx.x / 32) % 4, g = lane / 4, t = lane % 4;
    const int lr_a = 64 * (wg - 1) + 16 * warp + g, lr_b = lr_a + 8;  // rows in the tile
    const int row_bytes = Fmt::kWords == 4 ? k : k / 2;
    for (int ti = 0; ti < count; ++ti) {
      int n0, m0;
      tile_at(ti, n0, m0);
      const int row_a = n0 + lr_a, row_b = row_a + 8;
      // note: rows past n read row n-1's scales (valid memory) and are never stored.
      const int64_t ra = min(row_a, n - 1), rb = min(row_b, n - 1);
      const uint32_t bref_a = row_max_scale(ws + ra * kb, kb, t), bref_b = row_max_scale(ws + rb * kb, kb, t);

      float acc[kBM / 2];
#pragma unroll
      for (int i = 0; i < kBM / 2; ++i) acc[i] = 0.f;
      uint32_t frag[3][4][4];  // [stage % 3][k-step][register]
      // Stage s's A fragments from its weight slot; the slot is freed after its group's last stage here.
      auto decode = [&](int s, uint32_t(&a)[4][4]) {
        const int as = s0 + s, q = as / kSpg - g0, Q = ti * groups + q, slot = Q % kW,
                  h = kSpg == 2 ? (as & 1) : 0;
        mbar_wait(wfull + slot, (Q / kW) & 1);
        const uint8_t* vals = wvals + slot * kWSlotBytes;
        const uint32_t* scl = wscales + slot * kSm90BlockN;
        const int gb = kTail ? min(kWGroupBytes, row_bytes - (as / kSpg) * kWGroupBytes) : kWGroupBytes;
        uint32_t lo_a[4], hi_a[4], lo_b[4], hi_b[4];
        row_fragments_smem<Fmt, kTail>(vals + lr_a * kWGroupBytes, scl[lr_a] >> (16 * h), bref_a, t, h, gb,
                                       lo_a, hi_a);
        row_fragments_smem<Fmt, kTail>(vals + lr_b * kWGroupBytes, scl[lr_b] >> (16 * h), bref_b, t, h, gb,
                                       lo_b, hi_b);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          a[j][0] = lo_a[j], a[j][1] = lo_b[j], a[j][2] = hi_a[j], a[j][3] = hi_b[j];
        if (kSpg == 1 || h == 1 || s + 1 == stages) {
          __syncwarp();
          if (lane == 0) mbar_arrive(wempty + slot);
        }
      };
      decode(0, frag[0]);
      if (stages > 1) decode(1, frag[1]);
      // One stage s (fragments in frag[F = s % 3]): wait for its x tile, issue 4 wgmmas, retire stage s-1
      // (wait_group 1) and free its x slot, then decode stage s+2 into the fragments stage s-1 used: stage
      // s stays queued on the tensor cores (beside the other warpgroup's) while s+2 is decoded.
      // note: fragments are written 2 stages ahead, never while the wgmma they feed has an older wgmma in
      // flight that was issued after the write: ptxas then keeps the wgmmas asynchronous (writing them one
      // stage ahead with wait_group 1 triggers C7513 serialisation).
      auto stage = [&](int s, auto fi) {
        constexpr int F = decltype(fi)::value;
        const int G = ti * stages + s, slot = G % kX;
        mbar_wait(xfull + slot, (G / kX) & 1);
        const uint8_t* tile = ring + slot * kStageBytes;
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if constexpr (kBM == 256)
            wgmma_m64n256k16_rs(acc, frag[F][j], smem_desc(tile + 32 * j));
          else if constexpr (kBM == 128)
            wgmma_m64n128k16_rs(acc, frag[F][j], smem_desc(tile + 32 * j));
          else if constexpr (kBM == 64)
            wgmma_m64n64k16_rs(acc, frag[F][j], smem_desc(tile + 32 * j));
          else
            wgmma_m64n32k16_rs(acc, frag[F][j], smem_desc(tile + 32 * j));
        }
        wgmma_commit();
        wgmma_wait<1>();
        if (s > 0 && lane == 0) mbar_arrive(xempty + (G + kX - 1) % kX);
        if (s + 2 < stages) decode(s + 2, frag[(F + 2) % 3]);
      };
      // note: the register indices must be compile-time: the loop body is 3 stages, each with its own F;
      // the fold stops at the last stage.
      for (int s = 0; s < stages; s += 3) {
        [&]<int... O>(std::integer_sequence<int, O...>) {
          (void)((s + O < stages ? (stage(s + O, std::integral_constant<int, O>{}), true) : false) && ...);
        }
        (std::make_integer_sequence<int, 3>{});
      }
      wgmma_wait<0>();
      // note: the last stage's x slot (retired only now) goes back to the producer for the next tile.
      if (count > 1 && lane == 0) mbar_arrive(xempty + (ti * stages + stages - 1) % kX);

      // Epilogue: acc[4j + c] holds row (c < 2 ? g : g+8), activation column 8j + 2t + (c & 1).
      const float post_a = post_scale(bref_a), post_b = post_scale(bref_b);
      if (staged_store) {
        // Rounds of kOutRows activation rows: the warp's buffer row mr holds its 16 weight columns as 2
        // chunks of 16 bytes, chunk h at h ^ ((mr / 4) % 2) (8 rows of one stmatrix block hit 32 banks).
        // stmatrix x4 stores the transposed 8x8 blocks (k-steps j, j+1) x (rows g, g+8): lane l addresses
        // row l % 8 of block l / 8, i.e. buffer row 8 (j + l / 16) + l % 8, chunk (l / 8) % 2. Then lane l
        // stores chunk l % 2 of rows l / 2, l / 2 + 16, ...: 16 B each, a row's 32 bytes by 2 lanes.
        constexpr int kRows = kBM < kOutRows ? kBM : kOutRows, kRounds = kBM / kRows;
        uint8_t* out = outbuf + (4 * (wg - 1) + warp) * kOutWarpBytes;
        const uint32_t out_s = smem_addr(out);
        const int blk = lane >> 3, half = blk & 1, col0 = n0 + 64 * (wg - 1) + 16 * warp;
#pragma unroll
        for (int rd = 0; rd < kRounds; ++rd) {
#pragma unroll
          for (int jj = 0; jj < kRows / 8; jj += 2) {
            const int j = rd * (kRows / 8) + jj, mr = 8 * (jj + (blk >> 1)) + (lane & 7);
            stmatrix_x4_trans(out_s + mr * 32 + ((half ^ ((mr >> 2) & 1)) << 4),
                              pack_bf16x2(acc[4 * j] * post_a, acc[4 * j + 1] * post_a),
                              pack_bf16x2(acc[4 * j + 2] * post_b, acc[4 * j + 3] * post_b),
                              pack_bf16x2(acc[4 * j + 4] * post_a, acc[4 * j + 5] * post_a),
                              pack_bf16x2(acc[4 * j + 6] * post_b, acc[4 * j + 7] * post_b));
          }
          __syncwarp();
          const int h = lane & 1, col = col0 + 8 * h;
#pragma unroll
          for (int i = 0; i < kRows / 16; ++i) {
            const int mr = lane / 2 + 16 * i, row = m0 + rd * kRows + mr;
            const uint4 v = *reinterpret_cast<const uint4*>(out + mr * 32 + ((h ^ ((mr >> 2) & 1)) << 4));
            if (row < m && col < n) *reinterpret_cast<uint4*>(y + static_cast<int64_t>(row) * n + col) = v;
          }
          __syncwarp();
        }
        continue;
      }
      float* part = partial ? partial + static_cast<int64_t>(blockIdx.y) * m * n : nullptr;
#pragma unroll
      for (int j = 0; j < kBM / 8; ++j) {
        const int col = m0 + 8 * j + 2 * t;
        if (part) {
          store_pair(part, m, n, row_a, col, acc[4 * j] * post_a, acc[4 * j + 1] * post_a);
          store_pair(part, m, n, row_b, col, acc[4 * j + 2] * post_b, acc[4 * j + 3] * post_b);
        } else {
          store_pair(y, m, n, row_a, col, acc[4 * j] * post_a, acc[4 * j + 1] * post_a);
          store_pair(y, m, n, row_b, col, acc[4 * j + 2] * post_b, acc[4 * j + 3] * post_b);
        }
      }
    }
  }
#endif
}

// y [m, n] bf16 = the sum over z of ws[z][m][n] (f32), z in order: 4 elements a thread. note: internal
// linkage, one copy per format's translation unit.
namespace {
__global__ void splitk_reduce(const float* __restrict__ ws, int splits, int64_t count, __nv_bfloat16* y) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i >= count) return;
  if (i + 4 <= count && count % 4 == 0) {
    float4 acc = *reinterpret_cast<const float4*>(ws + i);
    for (int z = 1; z < splits; ++z) {
      const float4 v = *reinterpret_cast<const float4*>(ws + z * count + i);
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(y + i);
    out[0] = __floats2bfloat162_rn(acc.x, acc.y);
    out[1] = __floats2bfloat162_rn(acc.z, acc.w);
    return;
  }
  for (int64_t e = i; e < min(count, i + 4); ++e) {
    float acc = ws[e];
    for (int z = 1; z < splits; ++z) acc += ws[z * count + e];
    y[e] = __float2bfloat16_rn(acc);
  }
}
}  // namespace

}  // namespace mxq::cuda::gemm
