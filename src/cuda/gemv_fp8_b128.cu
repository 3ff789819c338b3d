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
// Kernels: for K % 64 == 0 (no tail group) the streaming form of gemv_mx_stream.cuh (per-warp cp.async
// ring of weight bytes and per-group f32 scales, persistent blocks walking tiles, one barrier per tile);
// else the register-prefetch kernel. The process-wide GemvKernel switch (gemv_mx_launch.h) picks the
// streaming configuration, or the register kernel everywhere.
#include "cuda/gemv_fp8_b128_launch.h"
#include "cuda/gemv_mx_launch.h"
#include "cuda/gemv_mx_stream.cuh"

namespace mxq::cuda {
namespace {

using gemv::kRowsPerTile;
using gemv::kThreads;
using gemv::kUnroll;
using gemv::kWarps;
constexpr int kGroupK = 64;

template <int kNTiles, bool kHasTail>
__global__ void __launch_bounds__(kThreads, 2)
    gemv_fp8_b128_kernel(const __nv_bfloat16* __restrict__ x, int m, const uint8_t* __restrict__ wv,
                         const float* __restrict__ ws, int64_t s_row, int64_t s_col,
                         __nv_bfloat16* __restrict__ y, int n, int k) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * kRowsPerTile;
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
    xr[nt] = x + static_cast<int64_t>(xok[nt] ? nt * 8 + g : 0) * k;
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
  for (; q0 < nfull; q0 += kStride) {
    if (q0 + kStride < nfull) load(q0 + kStride, na, nb, nsa, nsb);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (q0 + u >= nfull) break;
      const uint32_t wa4[4] = {wa[u].x, wa[u].y, wa[u].z, wa[u].w},
                     wb4[4] = {wb[u].x, wb[u].y, wb[u].z, wb[u].w};
      group_mma(wa4, wb4, static_cast<int64_t>(q0 + u) * kGroupK + 16 * t, 4, 4, sca[u], scb[u]);
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

  // Cross-warp sum: red[warp][value][lane], then warp 0 adds and stores.
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
      // c0, c1: row g, activations 2t, 2t+1; c2, c3: row g+8.
      const int row = row0 + g + (c >= 2 ? 8 : 0), mi = nt * 8 + 2 * t + (c & 1);
      if (row < n && mi < m) y[static_cast<int64_t>(mi) * n + row] = __float2bfloat16_rn(s);
    }
}


// Streaming kernel: the ring of gemv_mx_stream.cuh; the scale slot of a group holds the f32 block scale of
// the lane's row (row block r/128, column block q/2). Requires K % 64 == 0, values 16-byte aligned.
template <int kNTiles, int kStages, int kU, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    gemv_fp8_b128_stream_kernel(const __nv_bfloat16* __restrict__ x, int m, const uint8_t* __restrict__ wv,
                                const float* __restrict__ ws, int64_t s_row, int64_t s_col,
                                __nv_bfloat16* __restrict__ y, int n, int k) {
  constexpr int kSlots = kStages * kU * 2 * 32;
  extern __shared__ uint4 ring_all[];
  __shared__ float red[2][kWarps][kNTiles * 4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  uint4* wring = ring_all + warp * (kSlots + kSlots / 4);
  float* sring = reinterpret_cast<float*>(wring + kSlots);
  const int nfull = k / kGroupK, tiles = (n + kRowsPerTile - 1) / kRowsPerTile;
  const int ns = nfull > warp * kU ? (nfull - warp * kU + kWarps * kU - 1) / (kWarps * kU) : 0;
  const int bx0 = static_cast<int>(blockIdx.x), gx = static_cast<int>(gridDim.x);
  const int my_tiles = bx0 < tiles ? (tiles - bx0 + gx - 1) / gx : 0;
  const int total = my_tiles * ns;
  int ip = 0, it = 0, is = 0;
  auto issue = [&] {
    if (ip < total) {
      const int row0 = (bx0 + it * gx) * kRowsPerTile;
      const int64_t ra = min(row0 + g, n - 1), rb = min(row0 + g + 8, n - 1);
      const int stage = ip % kStages;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int q = (is * kWarps + warp) * kU + u;
        if (q < nfull) {
          const int slot = ((stage * kU + u) * 2) * 32 + lane;
          gemv::cp_async16(gemv::smem_addr(wring + slot), wv + ra * k + q * kGroupK + 16 * t);
          gemv::cp_async16(gemv::smem_addr(wring + slot + 32), wv + rb * k + q * kGroupK + 16 * t);
          gemv::cp_async4(gemv::smem_addr(sring + slot), ws + (ra / 128) * s_row + (q / 2) * s_col);
          gemv::cp_async4(gemv::smem_addr(sring + slot + 32), ws + (rb / 128) * s_row + (q / 2) * s_col);
        }
      }
      if (++is == ns) is = 0, ++it;
      ++ip;
    }
    gemv::cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue();

  const __nv_bfloat16* xr[kNTiles];
  bool xok[kNTiles];
#pragma unroll
  for (int nt = 0; nt < kNTiles; ++nt) {
    xok[nt] = nt * 8 + g < m;
    xr[nt] = x + static_cast<int64_t>(xok[nt] ? nt * 8 + g : 0) * k + 16 * t;
  }
  int p = 0;
  for (int ti = 0; ti < my_tiles; ++ti) {
    float acc[kNTiles][4] = {};
    for (int s = 0; s < ns; ++s, ++p) {
      issue();
      gemv::cp_async_wait<kStages - 1>();
      const int stage = p % kStages;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int q = (s * kWarps + warp) * kU + u;
        if (q >= nfull) break;
        const int slot = ((stage * kU + u) * 2) * 32 + lane;
        const uint4 wa = wring[slot], wb = wring[slot + 32];
        const float s_a = sring[slot], s_b = sring[slot + 32];
        const uint32_t wa4[4] = {wa.x, wa.y, wa.z, wa.w}, wb4[4] = {wb.x, wb.y, wb.z, wb.w};
        uint32_t a[4][4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          a[j][0] = gemv::e4m3x2_to_bf16x2(wa4[j] & 0xFFFFu);
          a[j][1] = gemv::e4m3x2_to_bf16x2(wb4[j] & 0xFFFFu);
          a[j][2] = gemv::e4m3x2_to_bf16x2(wa4[j] >> 16);
          a[j][3] = gemv::e4m3x2_to_bf16x2(wb4[j] >> 16);
        }
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            uint2 bx = make_uint2(0, 0);
            if (xok[nt]) bx = __ldg(reinterpret_cast<const uint2*>(xr[nt] + q * kGroupK + 4 * j));
            gemv::mma_bf16_16816(d, a[j], bx.x, bx.y);
          }
          acc[nt][0] = fmaf(d[0], s_a, acc[nt][0]);
          acc[nt][1] = fmaf(d[1], s_a, acc[nt][1]);
          acc[nt][2] = fmaf(d[2], s_b, acc[nt][2]);
          acc[nt][3] = fmaf(d[3], s_b, acc[nt][3]);
        }
      }
    }
    // Tile end, as gemv_mx_stream_kernel: partial sums to red[ti & 1], one barrier, warp ti % kWarps stores.
    const int buf = ti & 1;
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[buf][warp][nt * 4 + c][lane] = acc[nt][c];
    __syncthreads();
    if (warp == ti % kWarps) {
      const int row0 = (bx0 + ti * gx) * kRowsPerTile;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float sum = 0.f;
#pragma unroll
          for (int w = 0; w < kWarps; ++w) sum += red[buf][w][nt * 4 + c][lane];
          const int row = row0 + g + (c >= 2 ? 8 : 0), mi = nt * 8 + 2 * t + (c & 1);
          if (row < n && mi < m) y[static_cast<int64_t>(mi) * n + row] = __float2bfloat16_rn(sum);
        }
    }
  }
  gemv::cp_async_wait<0>();
}

template <int kNTiles, int kStages, int kU, int kMinBlocks>
cudaError_t launch_stream_nt(const __nv_bfloat16* x, int m, const uint8_t* values, const float* scales,
                             int64_t s_row, int64_t s_col, __nv_bfloat16* y, int n, int k, cudaStream_t stream) {
  constexpr int smem = gemv::kStreamSmem<kStages, kU>;
  auto* kernel = gemv_fp8_b128_stream_kernel<kNTiles, kStages, kU, kMinBlocks>;
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
  kernel<<<static_cast<unsigned>(min(tiles, resident)), kThreads, smem, stream>>>(x, m, values, scales, s_row,
                                                                                 s_col, y, n, k);
  return cudaGetLastError();
}

template <int kStages, int kU, int kMinBlocks>
cudaError_t launch_stream_cfg(const __nv_bfloat16* x, int m, const uint8_t* values, const float* scales,
                              int64_t s_row, int64_t s_col, __nv_bfloat16* y, int n, int k, cudaStream_t stream) {
  if (m <= 8)
    return launch_stream_nt<1, kStages, kU, kMinBlocks>(x, m, values, scales, s_row, s_col, y, n, k, stream);
  if (m <= 16)
    return launch_stream_nt<2, kStages, kU, kMinBlocks>(x, m, values, scales, s_row, s_col, y, n, k, stream);
  if (m <= 24)
    return launch_stream_nt<3, kStages, kU, kMinBlocks>(x, m, values, scales, s_row, s_col, y, n, k, stream);
  return launch_stream_nt<4, kStages, kU, kMinBlocks>(x, m, values, scales, s_row, s_col, y, n, k, stream);
}

}  // namespace

cudaError_t launch_gemv_fp8_b128(const uint16_t* x, int m, const uint8_t* values, const float* scales,
                                 int64_t s_row, int64_t s_col, uint16_t* y, int n, int k,
                                 cudaStream_t stream) {
  const auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
  auto* yb = reinterpret_cast<__nv_bfloat16*>(y);
  const GemvKernel kernel = gemv_kernel();
  if (kernel != GemvKernel::kRegister && k % kGroupK == 0 && reinterpret_cast<uintptr_t>(values) % 16 == 0) {
    if (kernel == GemvKernel::kStreamS4U2x2)
      return launch_stream_cfg<4, 2, 2>(xb, m, values, scales, s_row, s_col, yb, n, k, stream);
    if (kernel == GemvKernel::kStreamS8U2)
      return launch_stream_cfg<8, 2, 1>(xb, m, values, scales, s_row, s_col, yb, n, k, stream);
    return launch_stream_cfg<4, 4, 1>(xb, m, values, scales, s_row, s_col, yb, n, k, stream);
  }
  const dim3 grid(static_cast<unsigned>((n + kRowsPerTile - 1) / kRowsPerTile));
  const bool tail = k % kGroupK != 0;
#define MXQ_GEMV_LAUNCH(NT, TAIL) \
  gemv_fp8_b128_kernel<NT, TAIL><<<grid, kThreads, 0, stream>>>(xb, m, values, scales, s_row, s_col, yb, n, k)
  // note: 3 and 4 n-tiles (M 17..32) spill here; the streaming kernel serves those M when K % 64 == 0.
  if (m <= 8) {
    if (tail)
      MXQ_GEMV_LAUNCH(1, true);
    else
      MXQ_GEMV_LAUNCH(1, false);
  } else if (m <= 16) {
    if (tail)
      MXQ_GEMV_LAUNCH(2, true);
    else
      MXQ_GEMV_LAUNCH(2, false);
  } else if (m <= 24) {
    if (tail)
      MXQ_GEMV_LAUNCH(3, true);
    else
      MXQ_GEMV_LAUNCH(3, false);
  } else {
    if (tail)
      MXQ_GEMV_LAUNCH(4, true);
    else
      MXQ_GEMV_LAUNCH(4, false);
  }
#undef MXQ_GEMV_LAUNCH
  return cudaGetLastError();
}

}  // namespace mxq::cuda
