// The grouped entry of the decode GEMVs (MoE experts): one launch covers every active (expert, entries)
// group of a projection, driven only by device data moe_route wrote (offsets, the active-expert list,
// sorted_rows), so a MoE decode step needs no host round trip and is graph-capturable.
//   grid  (parts · ceil(n / 16) row tiles, slots), block gemv::kThreads; slot s serves expert active[s] and
//         exits at once when it is -1 (fewer active experts than slots);
//   a block runs its expert's entries in chunks of 8 (or 16) activation rows through the format's tile body
//   (gemv_mx_tile / gemv_fp8_b128_tile / the bf16 tile), the same device code as the dense GEMV.
// Per-expert M is not known at launch: each chunk picks its n-tile count (1 or 2) and decode on the device,
// as the dense launcher would on the host for that M, so a grouped row equals the dense GEMV's row for the
// same M (tested bitwise).
#pragma once

#include <cuda_bf16.h>

#include "cuda/linear/gemv_grouped_launch.h"
#include "cuda/linear/gemv_mx_kernel.cuh"

namespace mxq::cuda::gemv {

// Tile<kHasTail, kGather>: template <int kMaxNTiles> static __device__ void run(const GroupedGemvArgs&,
// const __nv_bfloat16* x, int m, const int32_t* x_rows, const uint8_t* wv, const uint8_t* ws,
// __nv_bfloat16* y, int row0), m in 1..8·kMaxNTiles; x rows as gemv_mx_tile's (x_rows null unless kGather).
// note: kMaxNTiles (the chunk: 8 or 16 rows) is set per launch from the capacity (gemv_grouped_max_ntiles):
// a kernel holding the 3- and 4-n-tile bodies too took 128 registers and spilled 656-868 bytes (ptxas,
// sm_90a, MXFP8) where the 1-n-tile body alone spills nothing, and decode's per-expert M is mostly <= 8
// (Qwen3-30B-A3B at batch 32: 256 entries over 128 experts). A larger count runs more chunks, each
// rereading the expert's tile of weights (from L2).
template <class Tile, bool kGather, int kMaxNTiles>
__global__ void __launch_bounds__(kThreads, 2) gemv_grouped_kernel(const GroupedGemvArgs a) {
  constexpr int kChunk = 8 * kMaxNTiles;
  const int e = a.active[blockIdx.y];
  if (e < 0) return;
  const int off = a.offsets[e], cnt = a.offsets[e + 1] - off;
  const int tiles = (a.n + kRowsPerTile - 1) / kRowsPerTile;
  const int part = static_cast<int>(blockIdx.x) / tiles;
  const int row0 = (static_cast<int>(blockIdx.x) % tiles) * kRowsPerTile;
  const int64_t w = static_cast<int64_t>(e) * a.parts + part;
  const uint8_t* wv = a.values[w];
  const uint8_t* ws = a.scales ? a.scales[w] : nullptr;
  auto* y = reinterpret_cast<__nv_bfloat16*>(a.y) + part * a.part_stride + static_cast<int64_t>(off) * a.n;
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(a.x);
  for (int c0 = 0; c0 < cnt; c0 += kChunk) {
    // note: the previous chunk's epilogue reads its shared sums in warp 0 while the others would write the
    // next ones
    if (c0 > 0) __syncthreads();
    const int m = min(kChunk, cnt - c0);
    if constexpr (kGather)
      Tile::template run<kMaxNTiles>(a, x, m, a.x_rows + off + c0, wv, ws, y + static_cast<int64_t>(c0) * a.n,
                                     row0);
    else
      Tile::template run<kMaxNTiles>(a, x + static_cast<int64_t>(off + c0) * a.k, m, nullptr, wv, ws,
                                     y + static_cast<int64_t>(c0) * a.n, row0);
  }
}

template <template <bool, bool> class Tile, int kMaxNTiles>
cudaError_t launch_grouped_nt(const GroupedGemvArgs& a, bool tail, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(a.parts * ((a.n + kRowsPerTile - 1) / kRowsPerTile)),
                  static_cast<unsigned>(a.slots));
  const bool gather = a.x_rows != nullptr;
  if (tail && gather)
    gemv_grouped_kernel<Tile<true, true>, true, kMaxNTiles><<<grid, kThreads, 0, stream>>>(a);
  else if (tail)
    gemv_grouped_kernel<Tile<true, false>, false, kMaxNTiles><<<grid, kThreads, 0, stream>>>(a);
  else if (gather)
    gemv_grouped_kernel<Tile<false, true>, true, kMaxNTiles><<<grid, kThreads, 0, stream>>>(a);
  else
    gemv_grouped_kernel<Tile<false, false>, false, kMaxNTiles><<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <template <bool, bool> class Tile>
cudaError_t launch_grouped(const GroupedGemvArgs& a, bool tail, cudaStream_t stream) {
  if (a.slots < 1) return cudaSuccess;
  if (a.max_ntiles == 1) return launch_grouped_nt<Tile, 1>(a, tail, stream);
  return launch_grouped_nt<Tile, 2>(a, tail, stream);
}

}  // namespace mxq::cuda::gemv
