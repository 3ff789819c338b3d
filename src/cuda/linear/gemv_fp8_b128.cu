// W8A16 FP8-B128 GEMV for decode, y[M,N] = x[M,K] · W[N,K]^T, M = 1..32, x and y bf16.
// Layout contract (the one cuBLASLt's large-M path reads too, so one weight copy serves every M):
//   values: [N, K] E4M3 row-major (the canonical plane as stored); K % 16 == 0, any N >= 1;
//   scales: f32, one per 128x128 block, block (nb, kb) at scales[nb · s_row + kb · s_col] (the native
//           layout linear_prepare writes; the launcher takes the two strides);
//   x: [M, K] bf16 row-major, y: [M, N] bf16 row-major.
// Arch: sm_80+ (mma.sync m16n8k16 bf16; the E4M3 decode uses cvt.rn.f16x2.e4m3x2 from sm_89, bit moves
// before). Tiles as gemv_mx_kernel.cuh: a block of 8 warps owns 16 weight rows and splits K by groups of 64.
// note: with one scale per 128 columns a 64-group never straddles two scale blocks, so no layout permutation
// is needed: quad lane t reads 16 contiguous bytes (elements 16t..16t+15 of the group) and MMA j takes
// its elements 16t+4j..+3 in k-slots (2t, 2t+1, 2t+8, 2t+9); x is read with the same assignment, and a dot
// product does not care which k sits in which slot. A 16/32/48-element tail group is read per MMA.
// note: a streaming form (a per-warp cp.async shared-memory ring) measured 10-75% slower at every M <= 32 on
// the Qwen3-8B shapes (bench/history/RESULTS-log.md, "GEMV at M <= 32: read-only ceiling") and was removed.
// The process-wide GemvKernel switch (gemv_mx_launch.h): kRegister runs the per-group loop, anything else
// (kAuto too) the step body at m <= 8.
// M 17..32 (3, 4 n-tiles) serves sm_80's table; sm_90a's takes cuBLASLt from M = 9 (cuda/linear/linear.cpp).
#include "cuda/linear/gemv_fp8_b128_launch.h"
#include "cuda/linear/gemv_grouped.cuh"
#include "cuda/linear/gemv_mx_kernel.cuh"
#include "cuda/linear/gemv_mx_launch.h"

namespace mxq::cuda {
namespace {

using gemv::kRowsPerTile;
using gemv::kThreads;
using gemv::kUnroll;
using gemv::kWarps;
constexpr int kGroupK = 64;

// kStep (1 n-tile only): a whole step of kUnroll groups without bounds checks, as one block. The tile body
// of one block (weight rows row0..row0+15); kGather: x row i at x + (x_rows[i] / x_div)·k (gemv_grouped.cuh).
template <int kNTiles, bool kHasTail, bool kStep, bool kGather = false>
__device__ __forceinline__ void gemv_fp8_b128_tile(const __nv_bfloat16* __restrict__ x, int m,
                                                   const int32_t* __restrict__ x_rows, int x_div,
                                                   const uint8_t* __restrict__ wv, const float* __restrict__ ws,
                                                   int64_t s_row, int64_t s_col, __nv_bfloat16* __restrict__ y,
                                                   int n, int k, int row0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  // note: rows past n read row n-1 (valid memory) and are never stored.
  const int64_t ra = min(row0 + g, n - 1), rb = min(row0 + g + 8, n - 1);
  const uint8_t* va = wv + ra * k;
  const uint8_t* vb = wv + rb * k;
  const float* sa = ws + (ra / 128) * s_row;
  const float* sb = ws + (rb / 128) * s_row;
  const __nv_bfloat16* xr[kNTiles];
  bool xok[kNTiles];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    xok[nt] = nt * 8 + g < m;
    const int xi = xok[nt] ? nt * 8 + g : 0;
    xr[nt] = x + static_cast<int64_t>(kGather ? x_rows[xi] / x_div : xi) * k;
  }
  float acc[kNTiles][4] = {};

  // One group: wa4/wb4 = the lane's 4 words of rows a and b (word j = elements 4j..4j+3 of its run), xoff =
  // element offset of the lane's run in x, jn = MMAs in the group, s_a/s_b = the two rows' block scales.
  auto group_mma = [&](const uint32_t* wa4, const uint32_t* wb4, int64_t xoff, int jn, int xstride, float s_a,
                       float s_b) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j >= jn) break;
        uint2 bx = make_uint2(0, 0);
        if (xok[nt]) bx = __ldg(reinterpret_cast<const uint2*>(xr[nt] + xoff + j * xstride));
        const uint32_t a[4] = {gemv::e4m3x2_to_bf16x2(wa4[j] & 0xFFFFu),
                               gemv::e4m3x2_to_bf16x2(wb4[j] & 0xFFFFu), gemv::e4m3x2_to_bf16x2(wa4[j] >> 16),
                               gemv::e4m3x2_to_bf16x2(wb4[j] >> 16)};
        gemv::mma_bf16_16816(d, a, bx.x, bx.y);
      }
      acc[nt][0] = fmaf(d[0], s_a, acc[nt][0]);
      acc[nt][1] = fmaf(d[1], s_a, acc[nt][1]);
      acc[nt][2] = fmaf(d[2], s_b, acc[nt][2]);
      acc[nt][3] = fmaf(d[3], s_b, acc[nt][3]);
    }
  };

  // Main loop, software-pipelined as the MX skeleton: the next kUnroll groups load while these compute.
  const int nfull = k / kGroupK;
  constexpr int kStride = kWarps * kUnroll;
  uint4 wa[kUnroll], wb[kUnroll], na[kUnroll], nb[kUnroll];
  float sca[kUnroll], scb[kUnroll], nsa[kUnroll], nsb[kUnroll];
  auto load = [&](int q0, uint4(&la)[kUnroll], uint4(&lb)[kUnroll], float(&ls)[kUnroll],
                  float(&lt)[kUnroll]) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (q0 + u >= nfull) break;
      const int q = q0 + u;
      la[u] = gemv::load_stream16(va + q * kGroupK + 16 * t);
      lb[u] = gemv::load_stream16(vb + q * kGroupK + 16 * t);
      ls[u] = __ldg(sa + (q / 2) * s_col);  // note: group q lies in column block q/2
      lt[u] = __ldg(sb + (q / 2) * s_col);
    }
  };
  int q0 = warp * kUnroll;
  if (q0 < nfull) load(q0, wa, wb, sca, scb);
  // note: under PDL the first step's weights are in flight before the wait (as gemv_mx_kernel.cuh).
  pdl::enter();
  for (; q0 < nfull; q0 += kStride) {
    if (q0 + kStride < nfull) load(q0 + kStride, na, nb, nsa, nsb);
    auto group = [&](int u) {
      const uint32_t wa4[4] = {wa[u].x, wa[u].y, wa[u].z, wa[u].w},
                     wb4[4] = {wb[u].x, wb[u].y, wb[u].z, wb[u].w};
      group_mma(wa4, wb4, static_cast<int64_t>(q0 + u) * kGroupK + 16 * t, 4, 4, sca[u], scb[u]);
    };
    // note: a whole step without bounds checks is one block the compiler can interleave (with more than one
    // n-tile that block spills more).
    if (kStep && q0 + kUnroll <= nfull) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) group(u);
    } else {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (q0 + u >= nfull) break;
        group(u);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wa[u] = na[u], wb[u] = nb[u], sca[u] = nsa[u], scb[u] = nsb[u];
  }

  if constexpr (kHasTail) {
    // note: tail MMA j covers elements k0 + 16j .. +15; lane t takes k0 + 16j + 4t .. +3 (4-byte loads).
    const int k0 = nfull * kGroupK, jn = (k - k0) / 16;
    if (warp == kWarps - 1) {
      uint32_t wa4[4] = {0, 0, 0, 0}, wb4[4] = {0, 0, 0, 0};
#pragma unroll
      for (int j = 0; j < 3; ++j) {
        if (j >= jn) break;
        wa4[j] = __ldg(reinterpret_cast<const uint32_t*>(va + k0 + 16 * j + 4 * t));
        wb4[j] = __ldg(reinterpret_cast<const uint32_t*>(vb + k0 + 16 * j + 4 * t));
      }
      const float s_a = __ldg(sa + (k0 / 128) * s_col), s_b = __ldg(sb + (k0 / 128) * s_col);
      group_mma(wa4, wb4, k0 + 4 * t, jn, 16, s_a, s_b);
    }
  }

  gemv::store_tile_sums<kNTiles>(acc, warp, lane, row0, m, y, n);
}

// Every part of p in one launch (gemv_mx_launch.h, GemvParts), as gemv_mx_kernel.
template <int kNTiles, bool kHasTail, bool kStep>
__global__ void __launch_bounds__(kThreads, 2)
    gemv_fp8_b128_kernel(const __nv_bfloat16* __restrict__ x, int m, const GemvParts p, int k) {
  int row0;
  const int q = gemv::gemv_part_of_block(p, static_cast<int>(blockIdx.x), row0);
  gemv_fp8_b128_tile<kNTiles, kHasTail, kStep>(x, m, nullptr, 1, p.values[q],
                                               reinterpret_cast<const float*>(p.scales[q]), p.s_row[q],
                                               p.s_col[q], reinterpret_cast<__nv_bfloat16*>(p.y[q]), p.n[q],
                                               k, row0);
}

// The grouped entry's tile (gemv_grouped.cuh): launch_gemv_fp8_b128's kAuto choices (the step body at
// m <= 8) with the chunk's n-tile count. note: every M of a grouped decode step stays weight-only (the
// dense table's sm_90a cuBLASLt W8A8 entry from M = 9 is per launch, decided on the host).
template <bool kHasTail, bool kGather>
struct Fp8B128GroupedTile {
  template <int kMaxNTiles>
  __device__ static void run(const GroupedGemvArgs& a, const __nv_bfloat16* x, int m, const int32_t* rows,
                             const uint8_t* wv, const uint8_t* ws, __nv_bfloat16* y, int row0) {
    const auto* s = reinterpret_cast<const float*>(ws);
    if (kMaxNTiles == 1 || m <= 8)
      gemv_fp8_b128_tile<1, kHasTail, true, kGather>(x, m, rows, a.x_div, wv, s, a.s_row, a.s_col, y, a.n,
                                                     a.k, row0);
    else if constexpr (kMaxNTiles >= 2)
      gemv_fp8_b128_tile<2, kHasTail, false, kGather>(x, m, rows, a.x_div, wv, s, a.s_row, a.s_col, y, a.n,
                                                      a.k, row0);
  }
};

}  // namespace

cudaError_t launch_gemv_grouped_fp8_b128(const GroupedGemvArgs& a, cudaStream_t stream) {
  return gemv::launch_grouped<Fp8B128GroupedTile>(a, a.k % kGroupK != 0, stream);
}

cudaError_t launch_gemv_parts_fp8_b128(const uint16_t* x, int m, const GemvParts& p, int k,
                                       cudaStream_t stream) {
  const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
  // note: everything but kRegister takes the step body (m <= 8): 6-10% faster than the per-group loop at
  // M = 1 and 8 on every Qwen3-8B shape on the H200 (bench/history/RESULTS-log.md,
  // "Session 3 final whole-tree run").
  const bool step = gemv_kernel() != GemvKernel::kRegister;
  int tiles = 0;
  for (int q = 0; q < p.count; ++q) tiles += (p.n[q] + kRowsPerTile - 1) / kRowsPerTile;
  const dim3 grid(static_cast<unsigned>(tiles));
  const bool tail = k % kGroupK != 0;
#define MXQ_GEMV_LAUNCH(NT, STEP)                                                                     \
  return launch_pdl(tail ? gemv_fp8_b128_kernel<NT, true, STEP> : gemv_fp8_b128_kernel<NT, false, STEP>, \
                    grid, dim3(kThreads), 0, stream, xb, m, p, k)
  // note: 3 and 4 n-tiles (M 17..32, sm_80's table) spill 24-116 bytes (ptxas, sm_90a).
  if (m <= 8) {
    if (step)
      MXQ_GEMV_LAUNCH(1, true);
    else
      MXQ_GEMV_LAUNCH(1, false);
  } else if (m <= 16) {
    MXQ_GEMV_LAUNCH(2, false);
  } else if (m <= 24) {
    MXQ_GEMV_LAUNCH(3, false);
  }
  MXQ_GEMV_LAUNCH(4, false);
#undef MXQ_GEMV_LAUNCH
}

cudaError_t launch_gemv_fp8_b128(const uint16_t* x, int m, const uint8_t* values, const float* scales,
                                 int64_t s_row, int64_t s_col, uint16_t* y, int n, int k,
                                 cudaStream_t stream) {
  return launch_gemv_parts_fp8_b128(
      x, m, GemvParts::one(values, reinterpret_cast<const uint8_t*>(scales), y, n, s_row, s_col), k, stream);
}

}  // namespace mxq::cuda
