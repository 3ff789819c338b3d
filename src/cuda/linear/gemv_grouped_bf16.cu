// Grouped bf16 expert GEMV for MoE decode (the grouped entry of gemv_grouped.cuh with a plain bf16 tile):
//   values: each expert part [n, k] bf16 row-major (the checkpoint layout); k % 8 == 0 (16-byte loads);
//   x: bf16 rows of k (gathered through sorted_rows / top_k or in entry order), y: bf16 rows of n.
// Tile: the block's 8 warps take 2 of its 16 weight rows each; a warp reads 16 B of each row per lane (256
// columns a step) and the same columns of up to 8 activation rows (L1-cached, read by every warp), sums in
// f32 per lane, then across the warp by a butterfly, and rounds once to bf16. Activation rows past 8 rerun
// the weight rows (from L2). The sum order depends only on k, never on m or the batch.
// note: a "simple grouped bf16 GEMV" (issue #5): bf16 MoE decode was cuBLAS per expert; this trades the
// tensor cores for one launch, which at decode's few rows per expert is bandwidth-bound either way.
#include <cuda_bf16.h>

#include "cuda/linear/gemv_grouped.cuh"

namespace mxq::cuda {
namespace {

constexpr int kRowsPerWarp = gemv::kRowsPerTile / gemv::kWarps;  // 2
constexpr int kXRows = 8;                                        // activation rows per pass

__device__ __forceinline__ void fma_bf16x8(const uint4& w, const uint4& x, float& acc) {
  const uint32_t wv[4] = {w.x, w.y, w.z, w.w}, xv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    acc = fmaf(__uint_as_float(wv[q] << 16), __uint_as_float(xv[q] << 16), acc);
    acc = fmaf(__uint_as_float(wv[q] & 0xFFFF0000u), __uint_as_float(xv[q] & 0xFFFF0000u), acc);
  }
}

template <bool kHasTail, bool kGather>
struct Bf16GroupedTile {
  template <int kMaxNTiles>
  __device__ static void run(const GroupedGemvArgs& a, const __nv_bfloat16* x, int m, const int32_t* rows,
                             const uint8_t* wv, const uint8_t*, __nv_bfloat16* y, int row0) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t k = a.k;
    const auto* xb = reinterpret_cast<const uint16_t*>(x);
    for (int m0 = 0; m0 < m; m0 += kXRows) {
      const int mm = min(kXRows, m - m0);
      const uint16_t* xr[kXRows];
#pragma unroll
      for (int i = 0; i < kXRows; ++i) {
        const int xi = m0 + min(i, mm - 1);
        xr[i] = xb + static_cast<int64_t>(kGather ? rows[xi] / a.x_div : xi) * k;
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int row = row0 + warp * kRowsPerWarp + r;
        if (row >= a.n) break;  // warp-uniform
        const auto* w = reinterpret_cast<const uint16_t*>(wv) + static_cast<int64_t>(row) * k;
        float acc[kXRows] = {};
        for (int64_t c = 8 * lane; c < k; c += 256) {
          const uint4 wq = __ldg(reinterpret_cast<const uint4*>(w + c));
#pragma unroll
          for (int i = 0; i < kXRows; ++i)
            if (i < mm) fma_bf16x8(wq, __ldg(reinterpret_cast<const uint4*>(xr[i] + c)), acc[i]);
        }
#pragma unroll
        for (int i = 0; i < kXRows; ++i) {
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) acc[i] += __shfl_xor_sync(0xFFFFFFFFu, acc[i], o);
          if (lane == 0 && i < mm) y[static_cast<int64_t>(m0 + i) * a.n + row] = __float2bfloat16_rn(acc[i]);
        }
      }
    }
  }
};

}  // namespace

cudaError_t launch_gemv_grouped_bf16(const GroupedGemvArgs& a, cudaStream_t stream) {
  return gemv::launch_grouped<Bf16GroupedTile>(a, false, stream);
}

}  // namespace mxq::cuda
