// The shared-memory ring form of the MX GEMV (m <= 8, one n-tile), shared by gemv_mxfp8.cu and
// gemv_mxfp4.cu. Same tiles, same K slices per warp, same per-group math (mx_group) and the same one-vote-
// per-step scale path as the register kernel's step body (gemv_mx_kernel.cuh, kStep), so its y is bitwise
// that kernel's; only where the weight bytes wait differs.
//   Each warp owns a ring of kStages slots in dynamic shared memory; a slot holds one step (kUnroll = 4
//   groups) of the warp's K slice for the tile's 16 rows: weights as [group u][row half h][lane] 16 B (lane
//   g,t's bytes of row g + 8h, exactly what it decodes), then the step's scale bytes as [row][kUnroll ·
//   kBlocks] (8 B per row for MXFP8, 16 B for MXFP4). Every lane fills its own 16-byte pieces with cp.async
//   (.cg: not cached in L1, where x lives) plus one 4- or 8-byte piece of the scales (row lane / 2), then
//   commits one cp.async group per step; the consumer waits for the oldest group (cp.async.wait_group
//   kStages - 1), one __syncwarp makes the other lanes' scale bytes visible, and a second one before each
//   issue keeps a slot from being refilled while a lane still reads it.
//   So the bytes in flight per warp (kStages - 1 steps of 4 KiB) no longer sit in registers: the register
//   kernel's two 64-byte-per-lane step buffers are gone and more warps fit per SM (kMinBlocks blocks of 8).
//   Persistent grids (grid < tiles: block b walks tiles b, b + grid, ...) let a warp's ring run on into its
//   next tile while it computes the last step of the current one.
//   Small activations (folded decodes): each step of the first tile also folds the warp's 8 x elements of a
//   lane into a running max; a warp whose rows are small recomputes its tiles exactly (mx_exact_slice).
//   kTrace (study): the block's timeline records (GemvTrace, gemv_mx_launch.h).
// Preconditions (gemv_ring_fits): m <= 8; K a multiple of kUnroll groups (every warp step is whole: MXFP8
// K % 256, MXFP4 K % 512); every part's values 16-byte and scales kScaleCopy-byte aligned.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "cuda/linear/gemv_mx_kernel.cuh"

namespace mxq::cuda::gemv {

template <class Fmt, int kStages>
struct RingShape {
  static constexpr int kBlocks = Fmt::kGroupK / 32;
  static constexpr int kScaleBytes = kUnroll * kBlocks;  // per row per step: 8 (MXFP8) or 16 (MXFP4)
  static constexpr int kScaleCopy = kScaleBytes / 2;     // per lane per step: rows lane / 2
  static constexpr int kWeightBytes = kUnroll * 2 * 32 * 16;
  static constexpr int kStageBytes = kWeightBytes + kRowsPerTile * kScaleBytes;
  static constexpr int kSmemBytes = kWarps * kStages * kStageBytes;
};

__device__ __forceinline__ void cp_async16_cg(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
template <int kBytes>
__device__ __forceinline__ void cp_async_ca(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(dst), "l"(src), "n"(kBytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Grid: `tiles` 16-row tiles of p's parts; grid == tiles runs one tile per block, fewer makes the blocks
// persistent. Dynamic shared memory: RingShape::kSmemBytes. kTrace: the block records its timeline into
// `trace` (GemvTrace, gemv_mx_launch.h; study only).
template <class Fmt, int kStages, int kMinBlocks, bool kTrace>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    gemv_mx_ring_kernel(const __nv_bfloat16* __restrict__ x, int m, const GemvParts p, int k, int tiles,
                        const GemvTrace trace) {
  using S = RingShape<Fmt, kStages>;
  constexpr int kStride = kWarps * kUnroll;
  extern __shared__ __align__(16) uint8_t ring_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int b = static_cast<int>(blockIdx.x), grid = static_cast<int>(gridDim.x);
  const int count = (tiles - b + grid - 1) / grid;
  const int64_t row_bytes = static_cast<int64_t>(k) * Fmt::kRowBytesNum / Fmt::kRowBytesDen;
  const int kb = k / 32, nfull = k / Fmt::kGroupK, first = warp * kUnroll;
  // note: nfull is a multiple of kUnroll (gemv_ring_fits), so a warp's steps per tile are all whole.
  const int steps = first < nfull ? (nfull - first + kStride - 1) / kStride : 0;
  const int total = count * steps;
  uint8_t* const ring = ring_smem + warp * kStages * S::kStageBytes;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring));

  const bool xok[1] = {g < m};
  const __nv_bfloat16* const xr[1] = {x + static_cast<int64_t>(xok[0] ? g : 0) * k + 4 * t};

  // Producer: the next step to fetch (issued-th of the warp's sequence: tile it, step is of that tile).
  int issued = 0, it = 0, is = 0, fill = 0;
  const uint8_t *va = nullptr, *vb = nullptr, *vs = nullptr;
  auto issue = [&] {
    if (issued < total) {
      if (is == 0) {
        const GemvTile tl = gemv_parts_tile(p, b + it * grid);
        // note: rows past n read row n-1 (valid memory) and are never stored.
        const int64_t ra = min(tl.row0 + g, tl.n - 1), rb = min(tl.row0 + g + 8, tl.n - 1),
                      rs = min(tl.row0 + (lane >> 1), tl.n - 1);
        va = tl.wv + ra * row_bytes + 16 * t;
        vb = tl.wv + rb * row_bytes + 16 * t;
        vs = tl.ws + rs * kb + S::kScaleCopy * (lane & 1);
      }
      const int q0 = first + is * kStride;
      const uint32_t dst = ring_s + fill * S::kStageBytes;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        cp_async16_cg(dst + (2 * u) * 512 + 16 * lane, va + (q0 + u) * 64);  // note: a group is 64 bytes
        cp_async16_cg(dst + (2 * u + 1) * 512 + 16 * lane, vb + (q0 + u) * 64);
      }
      cp_async_ca<S::kScaleCopy>(
          dst + S::kWeightBytes + (lane >> 1) * S::kScaleBytes + S::kScaleCopy * (lane & 1),
          vs + q0 * S::kBlocks);
      if (++is == steps) is = 0, ++it;
      fill = fill + 1 == kStages ? 0 : fill + 1;
    }
    ++issued;
    cp_async_commit();  // note: empty groups past the end keep wait_group's count uniform
  };

  // kTrace: thread 0's globaltimer stamps and warp 0's clock64 marks (after the wait; steps 0 and 1 of tile
  // 0 before and after their cp.async wait; after tile 0's steps; after its sums are stored).
  unsigned long long t_start = 0, t_waited = 0, t_data = 0;
  long long ck[7] = {};
  unsigned int trace_slot = 0;
  if constexpr (kTrace) {
    if (threadIdx.x == 0) t_start = global_ns(), trace_slot = atomicAdd(trace.count, 1u);
  }
  // note: as in the register kernel, the first steps' weights are in flight before pdl::enter (x is not
  // read before it).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue();
  pdl::enter();
  if constexpr (kTrace)
    if (threadIdx.x == 0) t_waited = global_ns(), ck[0] = clock64();
  // Small activations (warp_rows_small, gemv_mx_kernel.cuh): at m = 1 each step of tile 0 also loads its 8
  // elements of the warp's x slice and folds |x| into xmax after its MMAs (off the step's critical path);
  // m > 1 checks every row up front. A warp whose rows are small recomputes each tile exactly
  // (mx_exact_slice); the fast paths keep their code.
  bool small = m > 1 && warp_rows_small<Fmt>([&](int r) { return x + static_cast<int64_t>(r) * k; }, m, k,
                                             first, nfull, false, lane);
  uint32_t xmax = 0;
  int slot = 0;
  for (int ti = 0; ti < count; ++ti) {
    float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
    for (int st = 0; st < steps; ++st) {
      __syncwarp();  // every lane is done reading the slot this issue refills (the one consumed last)
      if constexpr (kTrace)
        if (threadIdx.x == 0 && ti == 0 && st < 2) ck[1 + 2 * st] = clock64();
      issue();
      cp_async_wait<kStages - 1>();
      __syncwarp();  // the other lanes' scale pieces of this slot are visible
      if constexpr (kTrace)
        if (threadIdx.x == 0 && ti == 0 && st < 2) {
          ck[2 + 2 * st] = clock64();
          if (st == 0) t_data = global_ns();
        }
      const uint8_t* base = ring + slot * S::kStageBytes;
      uint32_t sca[kUnroll], scb[kUnroll];
      if constexpr (S::kBlocks == 2) {
        const uint2 ra = *reinterpret_cast<const uint2*>(base + S::kWeightBytes + g * S::kScaleBytes);
        const uint2 rb = *reinterpret_cast<const uint2*>(base + S::kWeightBytes + (g + 8) * S::kScaleBytes);
        // note: the register kernel's 16-bit scale loads, zero-extended: the same words, the same vote.
        sca[0] = ra.x & 0xFFFF, sca[1] = ra.x >> 16, sca[2] = ra.y & 0xFFFF, sca[3] = ra.y >> 16;
        scb[0] = rb.x & 0xFFFF, scb[1] = rb.x >> 16, scb[2] = rb.y & 0xFFFF, scb[3] = rb.y >> 16;
      } else {
        static_assert(S::kBlocks == 4 && kUnroll == 4, "MXFP4: one 32-bit scale word per group");
        const uint4 ra = *reinterpret_cast<const uint4*>(base + S::kWeightBytes + g * S::kScaleBytes);
        const uint4 rb = *reinterpret_cast<const uint4*>(base + S::kWeightBytes + (g + 8) * S::kScaleBytes);
        sca[0] = ra.x, sca[1] = ra.y, sca[2] = ra.z, sca[3] = ra.w;
        scb[0] = rb.x, scb[1] = rb.y, scb[2] = rb.z, scb[3] = rb.w;
      }
      bool large = false;
      if constexpr (mx_scale_vote<Fmt, 1>()) {
        bool any = false;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) any = any || mx_needs_exact<Fmt>(sca[u], scb[u]);
        large = __any_sync(0xFFFFFFFFu, any);
      }
      const int q0 = first + st * kStride;
      auto group = [&](int u, bool lg) {
        const uint4 wa = *reinterpret_cast<const uint4*>(base + (2 * u) * 512 + 16 * lane);
        const uint4 wb = *reinterpret_cast<const uint4*>(base + (2 * u + 1) * 512 + 16 * lane);
        mx_group<Fmt, 1>(acc, xr, xok, wa, wb, sca[u], scb[u], (q0 + u) * Fmt::kGroupK, lg);
      };
      uint4 xs = make_uint4(0, 0, 0, 0);
      if (Fmt::kScaleFold != 0 && m == 1 && ti == 0)
        xs = __ldg(reinterpret_cast<const uint4*>(x + q0 * Fmt::kGroupK + 8 * lane));
      // note: as the step body: a step without large bytes is one branch-free block.
      if (!large) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) group(u, false);
      } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) group(u, true);
      }
      xmax = max(xmax, max_abs_bf16x8(xs));
      slot = slot + 1 == kStages ? 0 : slot + 1;
    }
    if (Fmt::kScaleFold != 0 && m == 1 && ti == 0) small = __reduce_max_sync(0xFFFFFFFFu, xmax) < kSmallXBits;
    if (small) {
      const GemvTile tl = gemv_parts_tile(p, b + ti * grid);
      const int64_t ra = min(tl.row0 + g, tl.n - 1), rb = min(tl.row0 + g + 8, tl.n - 1);
      mx_exact_slice<Fmt, 1>(acc, xr, xok, tl.wv + ra * row_bytes, tl.wv + rb * row_bytes, tl.ws + ra * kb,
                             tl.ws + rb * kb, first, nfull, k, false, t);
    }
    // note: one buffer of shared sums (store_tile_sums): before tile ti > 0 writes it, a barrier waits for
    // warp 0's reads of tile ti - 1.
    if constexpr (kTrace)
      if (threadIdx.x == 0 && ti == 0) ck[5] = clock64();
    if (ti > 0) __syncthreads();
    const GemvTile tl = gemv_parts_tile(p, b + ti * grid);
    store_tile_sums<1, 1>(acc, warp, lane, tl.row0, m, tl.y, tl.n);
    if constexpr (kTrace)
      if (threadIdx.x == 0 && ti == 0) ck[6] = clock64();
  }
  if constexpr (kTrace)
    if (threadIdx.x == 0) {
      unsigned int sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      unsigned long long* r =
          trace.records + static_cast<int64_t>(trace_slot % trace.capacity) * kGemvTraceWords;
      r[0] = t_start, r[1] = t_waited, r[2] = t_data, r[3] = global_ns();
      r[4] = sm | static_cast<unsigned long long>(blockIdx.x) << 32;
      r[5] = gridDim.x | reinterpret_cast<uintptr_t>(p.values[0]) << 32;
#pragma unroll
      for (int i = 1; i < 7; ++i) r[5 + i] = static_cast<unsigned long long>(ck[i] - ck[0]);
    }
}

// True when the ring kernel takes these parts (preconditions above); else the caller runs the register
// kernel.
template <class Fmt>
bool gemv_ring_fits(int m, const GemvParts& p, int k) {
  constexpr int kScaleCopy = RingShape<Fmt, 2>::kScaleCopy;
  if (m > 8 || k % (kUnroll * Fmt::kGroupK) != 0) return false;
  for (int q = 0; q < p.count; ++q)
    if (reinterpret_cast<uintptr_t>(p.values[q]) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(p.scales[q]) % kScaleCopy != 0)
      return false;
  return true;
}

// One launch of the ring kernel over p: one tile per block, or (persist) min(tiles, kMinBlocks per SM)
// persistent blocks. The caller checked gemv_ring_fits.
template <class Fmt, int kStages, int kMinBlocks, bool kTrace>
cudaError_t launch_gemv_ring(const uint16_t* x, int m, const GemvParts& p, int k, bool persist,
                             const GemvTrace& trace, cudaStream_t stream) {
  constexpr int kSmem = RingShape<Fmt, kStages>::kSmemBytes;
  auto* kernel = gemv_mx_ring_kernel<Fmt, kStages, kMinBlocks, kTrace>;
  // note: the attribute is per function and device; set once per device (slot 16: devices past 15, every
  // time).
  static std::atomic<bool> set_on[17] = {};
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  std::atomic<bool>& set = set_on[dev >= 0 && dev < 16 ? dev : 16];
  if (!set.load(std::memory_order_relaxed)) {
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
        e != cudaSuccess)
      return e;
    if (dev >= 0 && dev < 16) set.store(true, std::memory_order_relaxed);
  }
  const int tiles = gemv_parts_tiles(p);
  const int grid = persist ? std::min(tiles, kMinBlocks * gemv_sms()) : tiles;
  return launch_pdl(kernel, dim3(static_cast<unsigned>(grid)), dim3(kThreads), kSmem, stream,
                    reinterpret_cast<const __nv_bfloat16*>(x), m, p, k, tiles, trace);
}

// The same, with the traced kernel while a GemvTrace is set (study).
template <class Fmt, int kStages, int kMinBlocks>
cudaError_t launch_gemv_ring(const uint16_t* x, int m, const GemvParts& p, int k, bool persist,
                             cudaStream_t stream) {
  const GemvTrace trace = gemv_trace();
  if (trace.records)
    return launch_gemv_ring<Fmt, kStages, kMinBlocks, true>(x, m, p, k, persist, trace, stream);
  return launch_gemv_ring<Fmt, kStages, kMinBlocks, false>(x, m, p, k, persist, trace, stream);
}

// The ring variant v (gemv_mx_launch.h) over p.
template <class Fmt>
cudaError_t launch_gemv_ring_variant(GemvKernel v, const uint16_t* x, int m, const GemvParts& p, int k,
                                     cudaStream_t stream) {
  if (v == GemvKernel::kRingDeep) return launch_gemv_ring<Fmt, 3, 2>(x, m, p, k, true, stream);
  return launch_gemv_ring<Fmt, 2, 3>(x, m, p, k, v == GemvKernel::kRingPersist, stream);
}

}  // namespace mxq::cuda::gemv
