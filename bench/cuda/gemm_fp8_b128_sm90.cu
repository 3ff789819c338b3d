// The sm_90a FP8-B128 GEMM (DeepGEMM's design, written here from its description):
//   y[M,N] bf16 = sum over K blocks kb of (xq[:,kb]·Wq[:,kb]^T) · sx[m][kb] · sw[n/128][kb]
// x: E4M3 [M, K] row-major with f32 1x128 scales, K-block-major (sx of row r, block b at b·xs_ld + r, what
// quantize_act_fp8_b128 writes for cuBLASLt); W: the native FP8-B128 layout unchanged (linear_prepare,
// gemm_fp8_b128_cublaslt.h): E4M3 [N, K] row-major, f32 block scales at nb·ws_ld + kb (rows padded to 4).
// Shapes: N and K multiples of 128, any M >= 1 (TMA zero-fills rows past M, their outputs are never stored).
// Status: correct (GPU tests) but not in the linear table: cuBLASLt measured faster at every M tried
// (bench/RESULTS.md, FP8-B128 linear: the GEMM alone at M = 4096 reached 0.73-0.79x of cuBLASLt's TFLOP/s).
// Tile: 128 x rows (M) x BN W rows (N, 128 or 64), K in 128-wide stages (one scale block a stage).
// Persistent: grid = min(tiles, SMs); CTA b runs tiles b, b + grid, ... in a raster order that walks N
// inside groups of 8 M-blocks (the ~132 tiles in flight share 8 x tiles and ~17 W tiles in L2).
// Warp-specialised, 3 warpgroups (384 threads):
//   warpgroup 0, the producer (setmaxnreg 40): warp 0 lane 0 streams every tile's stages into a ring of
//   kStages slots by TMA (x 128 x 128 B and W BN x 128 B, both 128-byte swizzled, and the 128 x scales of
//   the stage), one mbarrier "full" per slot with the transaction bytes; the ring runs on across tiles, so
//   the next tile's stages load while the consumers finish and store the current one; warpgroups 1 and 2, the
//   consumers (setmaxnreg 232), own x rows 0-63 and 64-127 of the tile: per stage 4 x wgmma m64nBNk32
//   e4m3·e4m3 (both operands from shared memory) into an f32 partial, wait, free the slot ("empty", one
//   arrive per consumer warp), then promote: acc += partial · sx[row] · sw (DeepGEMM's fix for the tensor
//   cores' limited-precision FP8 accumulation: at most 128 products accumulate there). While one warpgroup
//   promotes, the other's wgmmas keep the tensor cores busy. bf16 epilogue from registers.
// note: W's scale (one float per stage, the same for the whole tile) is read from global (L1) one stage
// ahead. note: a variant with two partials in flight per warpgroup (stage i+1's wgmmas issued before stage i
// is promoted, stores overlapping the next tile; ptxas kept it asynchronous) measured 4-23% slower at M =
// 4096 (bench/history/RESULTS-log.md, "FP8-B128: our sm_90a wgmma GEMM vs cuBLASLt", call 2): it holds each
// slot until the next stage has landed.
#include <cuda.h>
#include <cuda_bf16.h>

#include "bench/cuda/gemm_fp8_b128_sm90_launch.h"
#include "cuda/common/device_sms.h"
#include "cuda/linear/gemm_mx_launch.cuh"

namespace mxq::cuda {
namespace {

constexpr int kBM = 128, kBK = 128, kThreads = 384;
constexpr int stages_for(int bn) { return bn == 128 ? 6 : 8; }
constexpr int w_tile_bytes(int bn) { return bn * kBK; }
constexpr int kXTileBytes = kBM * kBK, kXScaleBytes = kBM * 4;
// note: + 1024 so the rings start on a 1024-byte boundary (128-byte swizzle atoms), + 2 barriers a slot.
constexpr int smem_bytes(int bn) {
  return stages_for(bn) * (kXTileBytes + w_tile_bytes(bn) + kXScaleBytes) + 1024 + 2 * stages_for(bn) * 8;
}
static_assert(smem_bytes(128) <= 227 * 1024 && smem_bytes(64) <= 227 * 1024);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr int kGroupM = 8;
// Tile t's (M-block, N-block): groups of kGroupM M-blocks, N walked inside a group, M fastest.
__device__ __forceinline__ void tile_coords(int t, int mblocks, int nblocks, int& tm, int& tn) {
  const int per_group = kGroupM * nblocks, first = (t / per_group) * kGroupM;
  const int gm = min(kGroupM, mblocks - first), r = t % per_group;
  tm = first + r % gm, tn = r / gm;
}

using gemm::mbar_arrive;
using gemm::mbar_expect_tx;
using gemm::mbar_init;
using gemm::mbar_wait;
using gemm::smem_desc;
using gemm::tma_load_2d;

// d[64] (+)= A (shared, K-major 64 x 32 E4M3) · B (shared, K-major 128 x 32 E4M3)^T; scale_d 0: d = A·B^T.
__device__ __forceinline__ void wgmma_e4m3_m64n128k32(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20,"
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39,"
      "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58,"
      "%59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(scale_d));
}

// d[32] (+)= A (shared, K-major 64 x 32 E4M3) · B (shared, K-major 64 x 32 E4M3)^T; scale_d 0: d = A·B^T.
__device__ __forceinline__ void wgmma_e4m3_m64n64k32(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20,"
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}

// Cluster helpers for the paired (kPair) kernel: this CTA's rank in its cluster, a TMA whose box lands at the
// same shared offset in every CTA of `mask` (each CTA's barrier at bar's offset gets the bytes), an arrive on
// the barrier at bar's offset in CTA `rank`, and a cluster-wide barrier.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* map, int c0, int c1,
                                                      uint64_t* bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(gemm::smem_addr(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(gemm::smem_addr(bar)), "h"(mask)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n .reg .b32 remote;\n mapa.shared::cluster.u32 remote, %0, %1;\n"
      " mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(gemm::smem_addr(bar)),
      "r"(rank)
      : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n barrier.cluster.wait.acquire;" ::: "memory");
}
#endif

// kPair: launched in clusters of 2 CTAs along x; a cluster runs units of two M-blocks (2·pm, 2·pm + 1; rank r
// takes 2·pm + r) on the same N-block, and each CTA's producer loads half the W tile (rows 64r..64r+63) and
// multicasts it into both CTAs' slots, halving the W bytes each SM pulls from L2. A slot is free when the
// consumers of both CTAs are done with it: every consumer warp arrives on its own CTA's "empty" and the
// peer's (16 arrivals). A rank-1 CTA past the last M-block loads zeros and stores nothing.
template <int kBN, bool kPair>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_fp8_b128_sm90(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap,
                       const __grid_constant__ CUtensorMap smap, const float* __restrict__ wsc, int ws_ld,
                       __nv_bfloat16* __restrict__ y, int m, int n, int k) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!kPair || kBN == 128);
  constexpr int kS = stages_for(kBN), kWTile = w_tile_bytes(kBN), kAcc = kBN / 2;
  constexpr uint32_t kTx = kXTileBytes + kWTile + kXScaleBytes;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* xring = smem_raw + gemm::pad_to_1024(smem_raw);
  uint8_t* wring = xring + kS * kXTileBytes;
  float* sring = reinterpret_cast<float*>(wring + kS * kWTile);
  uint64_t* full = reinterpret_cast<uint64_t*>(sring + kS * kBM);
  uint64_t* empty = full + kS;
  const int mblocks = (m + kBM - 1) / kBM, nblocks = n / kBN, kblocks = k / kBK;
  // Work units: tiles, or (kPair) pairs of M-blocks x one N-block, run by clusters.
  const int unit_m = kPair ? (mblocks + 1) / 2 : mblocks, units = unit_m * nblocks;
  const int first = kPair ? blockIdx.x / 2 : blockIdx.x, step = kPair ? gridDim.x / 2 : gridDim.x;
  const int rank = kPair ? static_cast<int>(cluster_rank()) : 0;
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kS; ++i) mbar_init(full + i, 1), mbar_init(empty + i, kPair ? 16 : 8);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if constexpr (kPair)
    cluster_sync();  // note: the peer's barriers must be initialised before any multicast or remote arrive
  else
    __syncthreads();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (threadIdx.x == 0) {
      int it = 0;
      for (int u = first; u < units; u += step) {
        int um, tn;
        tile_coords(u, unit_m, nblocks, um, tn);
        const int tm = kPair ? 2 * um + rank : um;
        for (int kb = 0; kb < kblocks; ++kb, ++it) {
          const int slot = it % kS;
          if (it >= kS) mbar_wait(empty + slot, ((it / kS) - 1) & 1);
          mbar_expect_tx(full + slot, kTx);
          tma_load_2d(xring + slot * kXTileBytes, &xmap, kb * kBK, tm * kBM, full + slot);
          if constexpr (kPair)
            tma_load_2d_multicast(wring + slot * kWTile + rank * (kWTile / 2), &wmap, kb * kBK,
                                  tn * kBN + rank * (kBN / 2), full + slot, 0x3);
          else
            tma_load_2d(wring + slot * kWTile, &wmap, kb * kBK, tn * kBN, full + slot);
          tma_load_2d(sring + slot * kBM, &smap, tm * kBM, kb, full + slot);
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int c = wg - 1, warp = (threadIdx.x / 32) % 4, g = lane / 4, t4 = lane % 4;
    const int lr = 64 * c + 16 * warp + g;  // this thread's first x row in the tile (the second: lr + 8)
    float acc[kAcc], part[kAcc];
    int it = 0;
    for (int u = first; u < units; u += step) {
      int um, tn;
      tile_coords(u, unit_m, nblocks, um, tn);
      const int tm = kPair ? 2 * um + rank : um;
      const float* sw_row = wsc + static_cast<int64_t>(tn * kBN / 128) * ws_ld;
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
      float sw_next = __ldg(sw_row);
      for (int kb = 0; kb < kblocks; ++kb, ++it) {
        const int slot = it % kS;
        const float sw = sw_next;
        if (kb + 1 < kblocks) sw_next = __ldg(sw_row + kb + 1);
        mbar_wait(full + slot, (it / kS) & 1);
        const uint8_t* xa = xring + slot * kXTileBytes + 64 * c * kBK;
        const uint8_t* wb = wring + slot * kWTile;
        gemm::wgmma_fence();
#pragma unroll
        for (int j = 0; j < kBK / 32; ++j) {
          if constexpr (kBN == 128)
            wgmma_e4m3_m64n128k32(part, smem_desc(xa + 32 * j), smem_desc(wb + 32 * j), j);
          else
            wgmma_e4m3_m64n64k32(part, smem_desc(xa + 32 * j), smem_desc(wb + 32 * j), j);
        }
        gemm::wgmma_commit();
        gemm::wgmma_wait<0>();
        const float sxa = sring[slot * kBM + lr], sxb = sring[slot * kBM + lr + 8];
        __syncwarp();
        if (lane == 0) {
          mbar_arrive(empty + slot);
          if constexpr (kPair) mbar_arrive_cluster(empty + slot, rank ^ 1);
        }
        const float fa = sxa * sw, fb = sxb * sw;
        // acc[4j + e] holds row lr + 8·(e >= 2), column 8j + 2·t4 + (e & 1)
#pragma unroll
        for (int i = 0; i < kAcc; ++i) acc[i] = fmaf(part[i], (i & 2) ? fb : fa, acc[i]);
      }
      const int row_a = tm * kBM + lr, row_b = row_a + 8;
      __nv_bfloat16* ya = y + static_cast<int64_t>(row_a) * n + tn * kBN + 2 * t4;
      __nv_bfloat16* yb = ya + 8 * static_cast<int64_t>(n);
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        if (row_a < m)
          *reinterpret_cast<__nv_bfloat162*>(ya + 8 * j) = __floats2bfloat162_rn(acc[4 * j], acc[4 * j + 1]);
        if (row_b < m)
          *reinterpret_cast<__nv_bfloat162*>(yb + 8 * j) =
              __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
      }
    }
  }
  // note: neither CTA of a pair may exit while the peer can still multicast into it or arrive on its barriers
  if constexpr (kPair) cluster_sync();
#endif
}

// A 2D tensor map of `type` over [rows, cols] (row stride `stride` bytes) with `box` = {cols, rows}.
cudaError_t make_map(CUtensorMap* map, CUtensorMapDataType type, const void* base, uint64_t cols,
                     uint64_t rows, uint64_t stride, uint32_t box_cols, uint32_t box_rows,
                     CUtensorMapSwizzle swizzle) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = gemm::tensor_map_encoder();
  if (!encode) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {cols, rows}, strides[1] = {stride};
  const cuuint32_t box[2] = {box_cols, box_rows}, elem_strides[2] = {1, 1};
  const CUresult r = encode(map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <int kBN, bool kPair>
cudaError_t launch(const uint8_t* xq, const float* xs, int64_t xs_ld, int m, const uint8_t* wv,
                   const float* wsc, int64_t ws_ld, int n, int k, uint16_t* y, int sms, cudaStream_t stream) {
  auto* kernel = gemm_fp8_b128_sm90<kBN, kPair>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes(kBN));
  if (attr != cudaSuccess) return attr;
  CUtensorMap xmap, wmap, smap;
  const auto u8 = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  if (cudaError_t e = make_map(&xmap, u8, xq, k, m, k, kBK, kBM, CU_TENSOR_MAP_SWIZZLE_128B);
      e != cudaSuccess)
    return e;
  if (cudaError_t e =
          make_map(&wmap, u8, wv, k, n, k, kBK, kPair ? kBN / 2 : kBN, CU_TENSOR_MAP_SWIZZLE_128B);
      e != cudaSuccess)
    return e;
  if (cudaError_t e = make_map(&smap, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, xs, m, k / kBK, xs_ld * 4, kBM, 1,
                               CU_TENSOR_MAP_SWIZZLE_NONE);
      e != cudaSuccess)
    return e;
  const int64_t mblocks = (m + kBM - 1) / kBM;
  auto* yb = reinterpret_cast<__nv_bfloat16*>(y);
  const int ld = static_cast<int>(ws_ld);
  if constexpr (!kPair) {
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(mblocks * (n / kBN), sms)));
    kernel<<<grid, kThreads, smem_bytes(kBN), stream>>>(xmap, wmap, smap, wsc, ld, yb, m, n, k);
    return cudaGetLastError();
  } else {
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 2, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
    cfg.blockDim = dim3(kThreads), cfg.dynamicSmemBytes = smem_bytes(kBN), cfg.stream = stream;
    cfg.attrs = &cluster, cfg.numAttrs = 1;
    // note: how many 2-CTA clusters fit at once (GPCs with an odd SM count leave an SM out), asked once.
    static const int max_clusters = [&] {
      cudaLaunchConfig_t q = cfg;
      q.gridDim = dim3(2 * 66);
      int c = 0;
      return cudaOccupancyMaxActiveClusters(&c, kernel, &q) == cudaSuccess && c > 0 ? c : sms / 2;
    }();
    const int64_t units = (mblocks + 1) / 2 * (n / kBN);
    cfg.gridDim = dim3(static_cast<unsigned>(2 * std::min<int64_t>(units, max_clusters)));
    return cudaLaunchKernelEx(&cfg, kernel, xmap, wmap, smap, wsc, ld, yb, m, n, k);
  }
}

}  // namespace

cudaError_t launch_gemm_fp8_b128_sm90(const uint8_t* xq, const float* xs, int64_t xs_ld, int m,
                                      const uint8_t* wv, const float* wsc, int64_t ws_ld, int n, int k,
                                      uint16_t* y, Fp8GemmTile tile, cudaStream_t stream) {
  bool sm90 = false;
  if (cudaError_t e = gemm::is_sm90(&sm90); e != cudaSuccess) return e;
  if (!sm90) return cudaErrorNoKernelImageForDevice;
  if (m < 1) return cudaSuccess;
  // note: an unknown SM count plans for the H200's 132.
  const int sms = device_sms() > 0 ? device_sms() : 132;
  // kAuto: 64-wide W tiles when 128-wide ones fill at most half the SMs (small M), else 128 (less
  // shared-memory traffic per FLOP). note: bench/history/RESULTS-log.md
  // ("FP8-B128: our sm_90a wgmma GEMM vs cuBLASLt", call 1): at M = 128 64-wide tiles were 1.2-1.3x faster on
  // q/o and down (32 tiles of 128), a tie on gate_up (192); at M = 512 128-wide won everywhere, q/o's 128
  // tiles included. kN128Pair is never picked: it measured 1.4-2.1x slower than kN128.
  const int64_t tiles128 = static_cast<int64_t>((m + kBM - 1) / kBM) * (n / 128);
  switch (tile) {
    case Fp8GemmTile::kN128:
      return launch<128, false>(xq, xs, xs_ld, m, wv, wsc, ws_ld, n, k, y, sms, stream);
    case Fp8GemmTile::kN64:
      return launch<64, false>(xq, xs, xs_ld, m, wv, wsc, ws_ld, n, k, y, sms, stream);
    case Fp8GemmTile::kN128Pair:
      return launch<128, true>(xq, xs, xs_ld, m, wv, wsc, ws_ld, n, k, y, sms, stream);
    case Fp8GemmTile::kAuto:
      break;
  }
  return 2 * tiles128 <= sms ? launch<64, false>(xq, xs, xs_ld, m, wv, wsc, ws_ld, n, k, y, sms, stream)
                             : launch<128, false>(xq, xs, xs_ld, m, wv, wsc, ws_ld, n, k, y, sms, stream);
}

}  // namespace mxq::cuda
