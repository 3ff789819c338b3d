// The persistent streaming GEMV (GemvKernel::kStream, gemv_mx_launch.h; not the default): the skeleton of
// gemv_mx_kernel.cuh (8 warps split K of a 16-row tile, mma.sync m16n8k16, the same decode policies and the
// same native layout, gemv_layout.h), but the weight and scale bytes go through a per-warp shared-memory ring
// filled by cp.async, and each block walks tiles blockIdx.x, blockIdx.x + gridDim.x, ... (grid = resident
// blocks).
//
// Layout of the ring, per warp: kStages stages of kU groups; slot [stage][u][row a | row b][lane] holds the
// 16 bytes lane (g, t) reads of group q (bytes q·64 + 16t of rows g and g+8), and a scale slot of the same
// shape holds the aligned 4-byte scale word that contains the group's kBlocks E8M0 bytes. Every lane reads
// back only the slots it wrote itself, so cp.async.wait_group is the only synchronisation inside a warp; the
// block meets once per tile (__syncthreads) to add the 8 warps' partial sums, in a double-buffered shared
// array so one barrier per tile is enough.
//
// Requirements (checked by the launcher, else the register kernel runs): K % 128 == 0 (no short group; the
// 4-byte scale word of a group is aligned and inside its row), values 16-byte and scales 4-byte aligned.
//
// note: why a ring: the register kernel keeps at most 2 steps per warp in flight and, at K = 4096, each warp
// has only 2 steps per tile, so every block issues its loads, waits a full DRAM latency, computes and exits.
// Here the loads of the next tile are issued before this one's reduction, and the bytes in flight cost no
// registers. Measured (bench/RESULTS.md, GEMV M <= 32): 1.3-1.7x slower than the register kernel at M <= 16
// (one 8-warp block per SM instead of two, ~20% more instructions per group for the ring), 8% faster in sum
// for MXFP8 at M = 32 (where the register kernel spills). So the limit is issue and latency in the compute
// body, not bytes in flight.
// note: why cp.async rather than cp.async.bulk (1-D TMA): a step is 16 rows x kU·64 bytes, 16 separate row
// segments of 128-256 bytes; bulk copies that small would need 16 issues per stage plus an mbarrier per
// stage, where 2 cp.async per lane per group cost about what the register loads did, and run on sm_80.
#pragma once

#include "cuda/gemv_mx_kernel.cuh"

namespace mxq::cuda::gemv {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Dynamic shared memory of one block: per warp, kStages x kU x 2 rows x 32 lanes x (16 + 4) bytes.
template <int kStages, int kU>
inline constexpr int kStreamSmem = kWarps* kStages* kU * 2 * 32 * (16 + 4);

template <class Fmt, int kNTiles, int kStages, int kU, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    gemv_mx_stream_kernel(const __nv_bfloat16* __restrict__ x, int m, const uint8_t* __restrict__ wv,
                          const uint8_t* __restrict__ ws, __nv_bfloat16* __restrict__ y, int n, int k) {
  constexpr int kBlocks = Fmt::kGroupK / 32, kSlots = kStages * kU * 2 * 32;
  extern __shared__ uint4 ring_all[];
  __shared__ float red[2][kWarps][kNTiles * 4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  uint4* wring = ring_all + warp * (kSlots + kSlots / 4);
  uint32_t* sring = reinterpret_cast<uint32_t*>(wring + kSlots);
  const int64_t row_bytes = static_cast<int64_t>(k) * Fmt::kRowBytesNum / Fmt::kRowBytesDen;
  const int kb = k / 32, nfull = k / Fmt::kGroupK, tiles = (n + kRowsPerTile - 1) / kRowsPerTile;
  // Warp w's groups of a tile: step s holds q = (s·kWarps + w)·kU + u, u < kU, q < nfull.
  const int ns = nfull > warp * kU ? (nfull - warp * kU + kWarps * kU - 1) / (kWarps * kU) : 0;
  const int my_tiles = static_cast<int>(blockIdx.x) < tiles
                           ? (tiles - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) /
                                 static_cast<int>(gridDim.x)
                           : 0;
  const int total = my_tiles * ns;

  // Issue pointer: item ip = (tile index it, step is) of this warp's stream, kStages - 1 items ahead.
  int ip = 0, it = 0, is = 0;
  auto issue = [&] {
    if (ip < total) {
      const int row0 = (static_cast<int>(blockIdx.x) + it * static_cast<int>(gridDim.x)) * kRowsPerTile;
      // note: rows past n read row n-1 (valid memory) and are never stored.
      const int64_t ra = min(row0 + g, n - 1), rb = min(row0 + g + 8, n - 1);
      const int stage = ip % kStages;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int q = (is * kWarps + warp) * kU + u;
        if (q < nfull) {
          const int slot = ((stage * kU + u) * 2) * 32 + lane;
          cp_async16(smem_addr(wring + slot), wv + ra * row_bytes + q * 64 + 16 * t);
          cp_async16(smem_addr(wring + slot + 32), wv + rb * row_bytes + q * 64 + 16 * t);
          const int so = (q * kBlocks) & ~3;
          cp_async4(smem_addr(sring + slot), ws + ra * kb + so);
          cp_async4(smem_addr(sring + slot + 32), ws + rb * kb + so);
        }
      }
      if (++is == ns) is = 0, ++it;
      ++ip;
    }
    // note: committed even when empty, so that wait_group<kStages - 1> always means "item p has landed".
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue();

  const __nv_bfloat16* xr[kNTiles];
  bool xok[kNTiles];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    xok[nt] = nt * 8 + g < m;
    xr[nt] = x + static_cast<int64_t>(xok[nt] ? nt * 8 + g : 0) * k + 4 * t;
  }
  using Fold = FoldedScale<Fmt::kScaleFold>;
  int p = 0;
  for (int ti = 0; ti < my_tiles; ++ti) {
    float acc[kNTiles][4] = {};
    for (int s = 0; s < ns; ++s, ++p) {
      issue();
      cp_async_wait<kStages - 1>();
      const int stage = p % kStages;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int q = (s * kWarps + warp) * kU + u;
        if (q >= nfull) break;
        const int slot = ((stage * kU + u) * 2) * 32 + lane;
        const uint4 wa = wring[slot], wb = wring[slot + 32];
        const int sh = 8 * ((q * kBlocks) & 3);
        const uint32_t sca = sring[slot] >> sh, scb = sring[slot + 32] >> sh;
        uint32_t pa[kBlocks * 4], pb[kBlocks * 4];
        const uint32_t wa4[4] = {wa.x, wa.y, wa.z, wa.w}, wb4[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          Fmt::decode(wa4[i], pa + i * Fmt::kPairsPerWord);
          Fmt::decode(wb4[i], pb + i * Fmt::kPairsPerWord);
        }
        // note: for MXFP8 at even q the word's upper bytes are the next group's scales: they can only send
        // the vote to the large path, which is exact for every byte.
        const bool large = Fmt::kScaleFold != 0 && __any_sync(0xFFFFFFFFu, Fold::any_large(sca, scb));
        const int kx = q * Fmt::kGroupK;
#pragma unroll
        for (int b = 0; b < kBlocks; ++b) {
          const uint32_t ba = (sca >> (8 * b)) & 0xFF, bb = (scb >> (8 * b)) & 0xFF;
          float s_a, s_b, pre_a = 1.f, pre_b = 1.f;
          if constexpr (Fmt::kScaleFold == 0) {
            s_a = e8m0_to_f32(ba), s_b = e8m0_to_f32(bb);
          } else if (!large) {
            s_a = Fold::post_small(ba), s_b = Fold::post_small(bb);
          } else {
            pre_a = Fold::pre_large(ba), pre_b = Fold::pre_large(bb);
            s_a = Fold::post_large(ba), s_b = Fold::post_large(bb);
          }
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              uint2 bx = make_uint2(0, 0);
              if (xok[nt]) bx = __ldg(reinterpret_cast<const uint2*>(xr[nt] + kx + 32 * b + 16 * h));
              const uint32_t a[4] = {pa[4 * b + 2 * h], pb[4 * b + 2 * h], pa[4 * b + 2 * h + 1],
                                     pb[4 * b + 2 * h + 1]};
              mma_bf16_16816(d, a, bx.x, bx.y);
            }
            if (Fmt::kScaleFold != 0 && large) d[0] *= pre_a, d[1] *= pre_a, d[2] *= pre_b, d[3] *= pre_b;
            acc[nt][0] = fmaf(d[0], s_a, acc[nt][0]);
            acc[nt][1] = fmaf(d[1], s_a, acc[nt][1]);
            acc[nt][2] = fmaf(d[2], s_b, acc[nt][2]);
            acc[nt][3] = fmaf(d[3], s_b, acc[nt][3]);
          }
        }
      }
    }
    // Tile end: partial sums to red[ti & 1], one barrier, then warp ti % kWarps adds and stores. The buffer
    // written at tile ti + 2 was last read before every warp passed the barrier of tile ti + 1.
    const int buf = ti & 1;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[buf][warp][nt * 4 + c][lane] = acc[nt][c];
    __syncthreads();
    if (warp == ti % kWarps) {
      const int row0 = (static_cast<int>(blockIdx.x) + ti * static_cast<int>(gridDim.x)) * kRowsPerTile;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float sum = 0.f;
#pragma unroll
          for (int w = 0; w < kWarps; ++w) sum += red[buf][w][nt * 4 + c][lane];
          // c0, c1: row g, activations 2t, 2t+1; c2, c3: row g+8.
          const int row = row0 + g + (c >= 2 ? 8 : 0), mi = nt * 8 + 2 * t + (c & 1);
          if (row < n && mi < m) y[static_cast<int64_t>(mi) * n + row] = __float2bfloat16_rn(sum);
        }
    }
  }
  cp_async_wait<0>();  // note: nothing may still write this block's shared memory when it exits
}

// One (stages, groups per stage, blocks per SM) configuration; the grid is the resident block count.
template <class Fmt, int kNTiles, int kStages, int kU, int kMinBlocks>
cudaError_t launch_stream_nt(const __nv_bfloat16* x, int m, const uint8_t* values, const uint8_t* scales,
                             __nv_bfloat16* y, int n, int k, cudaStream_t stream) {
  constexpr int smem = kStreamSmem<kStages, kU>;
  auto* kernel = gemv_mx_stream_kernel<Fmt, kNTiles, kStages, kU, kMinBlocks>;
  // note: per instance, once: the dynamic shared-memory opt-in and the resident blocks per SM.
  static const int resident = [&] {
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem) != cudaSuccess)
      return 0;
    return sms * per_sm;
  }();
  if (resident == 0) return cudaErrorInvalidConfiguration;
  const int tiles = (n + kRowsPerTile - 1) / kRowsPerTile;
  kernel<<<static_cast<unsigned>(min(tiles, resident)), kThreads, smem, stream>>>(x, m, values, scales, y, n,
                                                                                  k);
  return cudaGetLastError();
}

template <class Fmt, int kStages, int kU, int kMinBlocks>
cudaError_t launch_stream_cfg(const uint16_t* x, int m, const uint8_t* values, const uint8_t* scales,
                              uint16_t* y, int n, int k, cudaStream_t stream) {
  const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
  auto* yb = reinterpret_cast<__nv_bfloat16*>(y);
  if (m <= 8)
    return launch_stream_nt<Fmt, 1, kStages, kU, kMinBlocks>(xb, m, values, scales, yb, n, k, stream);
  if (m <= 16)
    return launch_stream_nt<Fmt, 2, kStages, kU, kMinBlocks>(xb, m, values, scales, yb, n, k, stream);
  if (m <= 24)
    return launch_stream_nt<Fmt, 3, kStages, kU, kMinBlocks>(xb, m, values, scales, yb, n, k, stream);
  return launch_stream_nt<Fmt, 4, kStages, kU, kMinBlocks>(xb, m, values, scales, yb, n, k, stream);
}

// True when the streaming kernel takes this call (its requirements above).
inline bool stream_applies(const uint8_t* values, const uint8_t* scales, int k) {
  return k % 128 == 0 && reinterpret_cast<uintptr_t>(values) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(scales) % 4 == 0;
}

// Streaming GEMV: 4 stages of 4 groups per warp, 1 block (8 warps) per SM.
// note: 4 stages of 2 groups at 2 blocks per SM and 8 stages of 2 groups at 1 block were measured too
// (bench/RESULTS.md, GEMV M <= 32): neither was faster in sum at any M.
template <class Fmt>
cudaError_t launch_gemv_stream(const uint16_t* x, int m, const uint8_t* values, const uint8_t* scales,
                               uint16_t* y, int n, int k, cudaStream_t stream) {
  return launch_stream_cfg<Fmt, 4, 4, 1>(x, m, values, scales, y, n, k, stream);
}

}  // namespace mxq::cuda::gemv
