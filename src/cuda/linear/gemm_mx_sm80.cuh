// The portable MX GEMM (sm_80+, and what the tests also run on Hopper): mma.sync m16n8k16 with the weights
// as A. Tile: 128 weight rows (8 warps x 16) x 128 activation rows, K in 64-wide stages. x goes through a
// 3-stage cp.async ring in shared memory (rows padded to 80 elements: conflict-free 8-byte fragment loads);
// each lane loads its weight bytes straight from global memory one stage ahead, in the GEMV layout's k
// order, which the B fragments follow (elements 4t..4t+3 of each 16-k block, one 8-byte load).
#pragma once

#include "cuda/linear/gemm_mx_kernel.cuh"

namespace mxq::cuda::gemm {

inline constexpr int kSm80BlockN = 128, kSm80BlockM = 128, kSm80Stages = 3, kSm80Threads = 256;
// note: 80 = 64 + 16: the 8-byte loads of a half warp (4 rows x 4 lanes) then hit 32 distinct banks.
inline constexpr int kSm80RowElems = 80;
inline constexpr int kSm80StageElems = kSm80BlockM * kSm80RowElems;
inline constexpr int kSm80SmemBytes = kSm80Stages * kSm80StageElems * 2;

__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

// Grid: cdiv(n, 128) * cdiv(m, 128) blocks (tile_of), 256 threads, kSm80SmemBytes of dynamic shared memory.
template <class Fmt>
__global__ void __launch_bounds__(kSm80Threads)
    gemm_mx_sm80(const __nv_bfloat16* __restrict__ x, int m, const uint8_t* __restrict__ wv,
                 const uint8_t* __restrict__ ws, __nv_bfloat16* __restrict__ y, int n, int k) {
  extern __shared__ __align__(16) __nv_bfloat16 xs[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  int tile_n, tile_m;
  const int tiles_m = (m + kSm80BlockM - 1) / kSm80BlockM;
  tile_of(blockIdx.x, tiles_m, static_cast<int>(gridDim.x) / tiles_m, tile_n, tile_m);
  const int n0 = tile_n * kSm80BlockN, m0 = tile_m * kSm80BlockM, stages = (k + kStageK - 1) / kStageK;
  const int row_a = n0 + 16 * warp + g, row_b = row_a + 8;
  // note: rows past n read row n-1 (valid memory) and are never stored.
  const int64_t ra = min(row_a, n - 1), rb = min(row_b, n - 1);
  const int64_t row_bytes = Fmt::kWords == 4 ? k : k / 2;
  const int kb = k / 32;
  const uint8_t *va = wv + ra * row_bytes, *vb = wv + rb * row_bytes;
  const uint8_t *sa = ws + ra * kb, *sb = ws + rb * kb;
  const uint32_t bref_a = row_max_scale(sa, kb, t), bref_b = row_max_scale(sb, kb, t);

  // x stage s → slot: 128 rows x 8 chunks of 16 B, 4 chunks per thread; rows past m and k past K read 0.
  auto load_x = [&](int s) {
    __nv_bfloat16* slot = xs + (s % kSm80Stages) * kSm80StageElems;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int id = threadIdx.x + kSm80Threads * i, r = id / 8, c = id % 8;
      const int kk = s * kStageK + 8 * c;
      const bool valid = m0 + r < m && kk < k;
      const __nv_bfloat16* src = valid ? x + static_cast<int64_t>(m0 + r) * k + kk : x;
      cp_async16(slot + r * kSm80RowElems + 8 * c, src, valid);
    }
  };
  for (int s = 0; s < kSm80Stages - 1; ++s) {
    if (s < stages) load_x(s);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }

  float acc[16][4] = {};
  RawStage<Fmt::kWords> cur_a, cur_b, nxt_a, nxt_b;
  load_raw<Fmt, true>(va, sa, k, 0, t, cur_a);
  load_raw<Fmt, true>(vb, sb, k, 0, t, cur_b);
  for (int s = 0; s < stages; ++s) {
    if (s + 1 < stages) {
      load_raw<Fmt, true>(va, sa, k, s + 1, t, nxt_a);
      load_raw<Fmt, true>(vb, sb, k, s + 1, t, nxt_b);
    }
    asm volatile("cp.async.wait_group %0;" ::"n"(kSm80Stages - 2) : "memory");
    __syncthreads();  // note: stage s landed for all threads, and slot (s-1) is no longer read
    if (s + kSm80Stages - 1 < stages) load_x(s + kSm80Stages - 1);
    asm volatile("cp.async.commit_group;" ::: "memory");

    uint32_t frag[4][4];
    stage_fragments<Fmt>(cur_a, cur_b, bref_a, bref_b, frag);
    const __nv_bfloat16* slot = xs + (s % kSm80Stages) * kSm80StageElems;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        const uint2 b = *reinterpret_cast<const uint2*>(slot + (nt * 8 + g) * kSm80RowElems + 16 * j + 4 * t);
        gemv::mma_bf16_16816(acc[nt], frag[j], b.x, b.y);
      }
    cur_a = nxt_a, cur_b = nxt_b;
  }

  const float post_a = post_scale(bref_a), post_b = post_scale(bref_b);
#pragma unroll
  for (int nt = 0; nt < 16; ++nt) {
    const int col = m0 + nt * 8 + 2 * t;
    store_pair(y, m, n, row_a, col, acc[nt][0] * post_a, acc[nt][1] * post_a);
    store_pair(y, m, n, row_b, col, acc[nt][2] * post_b, acc[nt][3] * post_b);
  }
}

}  // namespace mxq::cuda::gemm
