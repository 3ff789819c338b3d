// The sm_90a MX GEMM with a dequantizing warpgroup: the weights are decoded once into bf16 tiles in shared
// memory, and the consumers run wgmma with both operands from shared memory, as a bf16 GEMM does.
// Computes Y^T = W · X^T per tile: 128 weight rows (N) x 256 activation rows (M), K in 64-wide stages; the
// native weight layout, the scale fold and the tile order are those of gemm_mx_sm90.cuh, and so are the
// values: the decoder writes the same bf16 (code · 2^(b - bref), gemm_mx_kernel.cuh) that the register
// kernel feeds the tensor cores, in natural k order.
// Warp-specialised, 3 warpgroups (384 threads), persistent (gridDim.x <= tiles blocks walk tiles b,
// b + gridDim.x, ...; every ring runs on across a block's tiles):
//   warpgroup 0: warps 0 and 1 produce (sm90_produce): the x ring (TMA, 64 k x 256 rows of bf16, 128-byte
//   swizzle) and the weight ring (TMA of one layout group's 128 rows x 64 B, plus the rows' scale bytes);
//   warps 2 and 3 decode: lane l of warp 2 + w owns tile rows 32w + l and 64 + 32w + l; per stage it reads
//   each row's bytes of the staged group, decodes them with the scale folded in and stores the 64 bf16
//   into an A slot (128 rows x 128 B, the 128-byte swizzle wgmma reads: 16-byte chunk c of row r at chunk
//   c ^ (r % 8));
//   warpgroups 1 and 2, the consumers, own 64 weight rows each: per stage 4 wgmma m64n256k16 from the A
//   slot and the x stage, one stage queued on the tensor cores (wait_group 1), then the slots go back.
// note: the register kernel (gemm_mx_sm90.cuh) decodes in the consumers, between its wgmmas; here the
// consumers only issue wgmmas, at the price of 16 KB of shared-memory writes and reads per stage. Four
// warpgroups (a whole one to decode) would cap every thread at 128 registers, fewer than an m64n256
// accumulator needs (ptxas compiles the kernel under the launch bound, setmaxnreg or not).
// Shapes: no K tail (K % 64 for MXFP8, % 128 for MXFP4) and no split; the launcher keeps the register
// kernel for the others.
#pragma once

#include "cuda/gemm_mx_sm90.cuh"

namespace mxq::cuda::gemm {

inline constexpr int kDqThreads = 384, kDqBM = 256;
inline constexpr int kDqX = 4, kDqW = 4, kDqA = 3;  // x stages, weight slots, decoded A slots
inline constexpr int kDqABytes = kSm90BlockN * kStageK * 2;  // 128 rows x 64 k of bf16
// note: + 1024 so the x ring can start on a 1024-byte boundary, + the rows' bref (two tiles), + barriers.
constexpr int dq_smem_bytes() {
  return kDqX * sm90_stage_bytes(kDqBM) + kDqA * kDqABytes + kDqW * (kWSlotBytes + 4 * kSm90BlockN) +
         2 * kSm90BlockN * 4 + 1024 + 2 * (kDqX + kDqW + kDqA) * 8;
}
static_assert(dq_smem_bytes() <= 227 * 1024);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void st_shared_v2(uint32_t addr, uint32_t a, uint32_t b) {
  asm volatile("st.shared.v2.b32 [%0], {%1, %2};" ::"r"(addr), "r"(a), "r"(b) : "memory");
}
// Makes this thread's shared-memory stores visible to the async proxy (wgmma operand reads).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// The largest scale byte of a row of kb blocks (one thread).
__device__ __forceinline__ uint32_t row_max_scale_one(const uint8_t* row_s, int kb) {
  uint32_t mx = 0;
  if ((kb & 3) == 0) {
    const uint32_t* p = reinterpret_cast<const uint32_t*>(row_s);
#pragma unroll 8
    for (int i = 0; i < kb / 4; ++i) mx = __vmaxu4(mx, __ldg(p + i));
    return max(max(mx & 0xFF, (mx >> 8) & 0xFF), max((mx >> 16) & 0xFF, mx >> 24));
  }
  for (int i = 0; i < kb; ++i) mx = max(mx, static_cast<uint32_t>(__ldg(row_s + i)));
  return mx;
}
#endif

// Grid: min(tiles, SMs) blocks, tiles = cdiv(n, 128) · cdiv(m, 256) (tile_of); 384 threads, dq_smem_bytes()
// of dynamic shared memory. xmap / wmap as for gemm_mx_sm90.
template <class Fmt>
__global__ void __launch_bounds__(kDqThreads, 1)
    gemm_mx_sm90_dq(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap, int m,
                    const uint8_t* __restrict__ ws, __nv_bfloat16* __restrict__ y, int n, int k) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kStageBytes = sm90_stage_bytes(kDqBM);
  constexpr int kSpg = Fmt::kGroupK / kStageK;  // stages per layout group
  extern __shared__ uint8_t smem_raw[];
  uint8_t* ring =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* abuf = ring + kDqX * kStageBytes;  // note: 1024-byte aligned, as the swizzle needs
  uint8_t* wvals = abuf + kDqA * kDqABytes;
  uint32_t* wscales = reinterpret_cast<uint32_t*>(wvals + kDqW * kWSlotBytes);
  uint32_t* brefs = wscales + kDqW * kSm90BlockN;  // [tile parity][row]
  uint64_t* xfull = reinterpret_cast<uint64_t*>(brefs + 2 * kSm90BlockN);
  uint64_t *xempty = xfull + kDqX, *wfull = xempty + kDqX, *wempty = wfull + kDqW, *afull = wempty + kDqW;
  uint64_t* aempty = afull + kDqA;
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32;
  const int stages = k / kStageK, groups = stages / kSpg, kb = k / 32;
  const int tiles_m = (m + kDqBM - 1) / kDqBM, tiles_n = (n + kSm90BlockN - 1) / kSm90BlockN;
  const int tiles = tiles_m * tiles_n;
  const int count =
      (tiles - static_cast<int>(blockIdx.x) + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x);
  auto tile_at = [&](int ti, int& n0, int& m0) {
    int tile_n, tile_m;
    tile_of(static_cast<int>(blockIdx.x) + ti * static_cast<int>(gridDim.x), tiles_m, tiles_n, tile_n,
            tile_m);
    n0 = tile_n * kSm90BlockN, m0 = tile_m * kDqBM;
  };
  if (threadIdx.x == 0) {
    // x and A slots are freed by the 8 consumer warps, weight slots by the 2 decoder warps; wfull: the
    // producer's lane 0 (expect_tx) + its 32 lanes' scale stores; afull: the 2 decoder warps.
    for (int i = 0; i < kDqX; ++i) mbar_init(xfull + i, 1), mbar_init(xempty + i, 8);
    for (int i = 0; i < kDqW; ++i) mbar_init(wfull + i, 33), mbar_init(wempty + i, 2);
    for (int i = 0; i < kDqA; ++i) mbar_init(afull + i, 2), mbar_init(aempty + i, 8);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // note: the CTA's pool is what the launch allocated (168 a thread): warpgroup 0 gives 88 a thread back,
    // the consumers take 40 more each (asking for more than the pool holds never returns).
    asm volatile("setmaxnreg.dec.sync.aligned.u32 80;");
    const int warp = threadIdx.x / 32;
    if (warp < 2) {
      sm90_produce<Fmt, false, kDqX, kDqW, kStageBytes>(warp, lane, tile_at, count, &xmap, &wmap, ring, wvals,
                                                         wscales, xfull, xempty, wfull, wempty, ws, n, kb, 0,
                                                         stages, 0, groups);
    } else {
      const int r0 = 32 * (warp - 2) + lane;  // rows r0 and r0 + 64
      // note: a lane reads its row's 4 runs starting at run (r/2 + r/8) % 4: 4 wavefronts a 16-byte read
      // and 2 an 8-byte store across the warp (starting every row at run 0 makes the reads 16-way
      // conflicted).
      for (int ti = 0; ti < count; ++ti) {
        int n0, m0;
        tile_at(ti, n0, m0);
        uint32_t bref[2];
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const int r = r0 + 64 * p;
          // note: rows past n fold with row n-1's scales; their values are TMA zero fill, never stored.
          bref[p] = row_max_scale_one(ws + static_cast<int64_t>(min(n0 + r, n - 1)) * kb, kb);
          brefs[(ti & 1) * kSm90BlockN + r] = bref[p];
        }
        for (int s = 0; s < stages; ++s) {
          const int q = s / kSpg, h = s % kSpg, Q = ti * groups + q, wslot = Q % kDqW;
          const int A = ti * stages + s, aslot = A % kDqA;
          if (h == 0) mbar_wait(wfull + wslot, (Q / kDqW) & 1);
          if (A >= kDqA) mbar_wait(aempty + aslot, ((A / kDqA) - 1) & 1);
#pragma unroll
          for (int p = 0; p < 2; ++p) {
            const int r = r0 + 64 * p, rot = (r >> 1) + (r >> 3);
            const uint8_t* src = wvals + wslot * kWSlotBytes + r * kWGroupBytes;
            const uint32_t sc = wscales[wslot * kSm90BlockN + r] >> (16 * h);
            const uint32_t s0 = fold_scale(sc & 0xFF, bref[p], Fmt::kFoldBase);
            const uint32_t s1 = fold_scale((sc >> 8) & 0xFF, bref[p], Fmt::kFoldBase);
            const uint32_t dst = smem_addr(abuf + aslot * kDqABytes + r * 128);
            // 8 decoded bytes of elements 16j + 4t' .. + 3 (j < 4 in the stage, run t') → chunk 2j + t'/2
            // of the row, half t' % 2, swizzled.
            auto put = [&](int j, int tp, uint32_t lo, uint32_t hi) {
              st_shared_v2(dst + (((2 * j + (tp >> 1)) ^ (r & 7)) << 4) + 8 * (tp & 1), lo, hi);
            };
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int tp = (i + rot) & 3;
              if constexpr (Fmt::kWords == 4) {
                // MXFP8: run t' byte 4j + e = element 16j + 4t' + e (gemv_layout.h); blocks j / 2.
                const uint4 v = *reinterpret_cast<const uint4*>(src + 16 * tp);
                const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                  uint32_t lo, hi;
                  e4m3x4_to_bf16x4_scaled(w[j], j < 2 ? s0 : s1, lo, hi);
                  put(j, tp, lo, hi);
                }
              } else {
                // MXFP4: run t' byte 2j + e/2 = elements 16j + 4t' + e (j < 8 in the group); stage h takes
                // j = 4h .. 4h + 3, the run's bytes 8h .. 8h + 7.
                const uint2 v = *reinterpret_cast<const uint2*>(src + 16 * tp + 8 * h);
                uint32_t pr[4];
                e2m1x8_to_bf16x8_scaled(v.x, s0, s0, pr);
                put(0, tp, pr[0], pr[1]), put(1, tp, pr[2], pr[3]);
                e2m1x8_to_bf16x8_scaled(v.y, s1, s1, pr);
                put(2, tp, pr[0], pr[1]), put(3, tp, pr[2], pr[3]);
              }
            }
          }
          fence_proxy_async_smem();
          __syncwarp();
          if (lane == 0) {
            mbar_arrive(afull + aslot);
            if (h == kSpg - 1) mbar_arrive(wempty + wslot);
          }
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 208;");
    const int cw = wg - 1, warp = (threadIdx.x / 32) % 4, g = lane / 4, t = lane % 4;
    const int lr_a = 64 * cw + 16 * warp + g, lr_b = lr_a + 8;  // rows in the tile
    for (int ti = 0; ti < count; ++ti) {
      int n0, m0;
      tile_at(ti, n0, m0);
      float acc[kDqBM / 2];
#pragma unroll
      for (int i = 0; i < kDqBM / 2; ++i) acc[i] = 0.f;
      for (int s = 0; s < stages; ++s) {
        const int A = ti * stages + s, aslot = A % kDqA, xslot = A % kDqX;  // note: one x stage per A stage
        mbar_wait(afull + aslot, (A / kDqA) & 1);
        mbar_wait(xfull + xslot, (A / kDqX) & 1);
        const uint8_t* at = abuf + aslot * kDqABytes + cw * 64 * 128;
        const uint8_t* xt = ring + xslot * kStageBytes;
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < 4; ++j) wgmma_m64n256k16_ss(acc, smem_desc(at + 32 * j), smem_desc(xt + 32 * j));
        wgmma_commit();
        wgmma_wait<1>();
        if (s > 0 && lane == 0) mbar_arrive(aempty + (A - 1) % kDqA), mbar_arrive(xempty + (A - 1) % kDqX);
      }
      wgmma_wait<0>();
      if (lane == 0) {
        const int last = ti * stages + stages - 1;
        mbar_arrive(aempty + last % kDqA), mbar_arrive(xempty + last % kDqX);
      }
      // Epilogue: acc[4j + c] holds row (c < 2 ? g : g+8), activation column 8j + 2t + (c & 1).
      const int row_a = n0 + lr_a, row_b = row_a + 8;
      const float post_a = post_scale(brefs[(ti & 1) * kSm90BlockN + lr_a]);
      const float post_b = post_scale(brefs[(ti & 1) * kSm90BlockN + lr_b]);
#pragma unroll
      for (int j = 0; j < kDqBM / 8; ++j) {
        const int col = m0 + 8 * j + 2 * t;
        store_pair(y, m, n, row_a, col, acc[4 * j] * post_a, acc[4 * j + 1] * post_a);
        store_pair(y, m, n, row_b, col, acc[4 * j + 2] * post_b, acc[4 * j + 3] * post_b);
      }
    }
  }
#endif
}

}  // namespace mxq::cuda::gemm
