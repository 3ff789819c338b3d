// Full-plane moves between a canonical plane and a live separable plane (refit_launch.h DevicePlane):
//   write: native[row_off[r] + col_off[c]] <- canonical[r·row_bytes + c]   (WeightStore::apply_tensor)
//   read:  canonical[r·row_bytes + c] <- native[row_off[r] + col_off[c]]   (read_canonical, undo of anchors)
// CPU twin: to_native / to_canonical (layout/layout.cpp). Identity planes never come here (a memcpy).
// Grid: x covers one row's units of R bytes (R = the plane's run, cut down to the canonical pointer's
// alignment), y strides over rows. One thread moves one unit with one load and one store, so a warp reads
// 32·R contiguous canonical bytes, and for the GEMV layout (R = 4, 64-byte groups) writes the same 32·R bytes
// of the native row in another order: both sides coalesced.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/refit/refit_launch.h"
#include "cuda/refit/refit_plane.cuh"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 256;

template <int R, bool kWrite>
__global__ void plane_move(DevicePlane p, uint8_t* canonical) {
  using T = typename Unit<R>::T;
  const int64_t units = p.row_bytes / R;
  const int64_t u = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (u >= units) return;
  const int64_t c = u * R;
  const int64_t col = p.col_off[c];
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    T* canon = reinterpret_cast<T*>(canonical + r * p.row_bytes + c);
    T* native = reinterpret_cast<T*>(p.native + p.row_off[r] + col);
    if constexpr (kWrite)
      *native = *canon;
    else
      *canon = *native;
  }
}

// note: the common case (row_bytes % 16 == 0, canonical 16-byte aligned): one thread moves 16 canonical bytes
// (one vector load or store) as 16/R native units, and a block walks up to rows/1024 rows so each thread
// keeps its column offsets in registers.
template <int R, bool kWrite>
__global__ void plane_move16(DevicePlane p, uint8_t* canonical) {
  using T = typename Unit<R>::T;
  constexpr int kParts = 16 / R;
  const int64_t v = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (v >= p.row_bytes / 16) return;
  const int64_t c0 = v * 16;
  int64_t cols[kParts];
#pragma unroll
  for (int k = 0; k < kParts; ++k) cols[k] = p.col_off[c0 + k * R];
  for (int64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    uint8_t* nrow = p.native + p.row_off[r];
    uint4* canon = reinterpret_cast<uint4*>(canonical + r * p.row_bytes + c0);
    if constexpr (kWrite) {
      const uint4 val = *canon;
      const T* parts = reinterpret_cast<const T*>(&val);
#pragma unroll
      for (int k = 0; k < kParts; ++k) *reinterpret_cast<T*>(nrow + cols[k]) = parts[k];
    } else {
      uint4 val;
      T* parts = reinterpret_cast<T*>(&val);
#pragma unroll
      for (int k = 0; k < kParts; ++k) parts[k] = *reinterpret_cast<const T*>(nrow + cols[k]);
      *canon = val;
    }
  }
}

template <bool kWrite>
cudaError_t launch(const DevicePlane& p, uint8_t* canonical, cudaStream_t stream) {
  if (p.bytes() == 0) return cudaSuccess;
  int r = p.run;
  // note: the canonical side may be any device pointer (a delta's bytes, an undo log): cut R to its
  // alignment.
  while (r > 1 && reinterpret_cast<uintptr_t>(canonical) % static_cast<uintptr_t>(r) != 0) r /= 2;
  if (p.row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(canonical) % 16 == 0) {
    const dim3 grid16(static_cast<unsigned>((p.row_bytes / 16 + kThreads - 1) / kThreads),
                      static_cast<unsigned>(p.rows < 1024 ? p.rows : 1024));
    switch (p.run) {
      case 16:
        plane_move16<16, kWrite><<<grid16, kThreads, 0, stream>>>(p, canonical);
        break;
      case 8:
        plane_move16<8, kWrite><<<grid16, kThreads, 0, stream>>>(p, canonical);
        break;
      case 4:
        plane_move16<4, kWrite><<<grid16, kThreads, 0, stream>>>(p, canonical);
        break;
      case 2:
        plane_move16<2, kWrite><<<grid16, kThreads, 0, stream>>>(p, canonical);
        break;
      default:
        plane_move16<1, kWrite><<<grid16, kThreads, 0, stream>>>(p, canonical);
    }
    return cudaGetLastError();
  }
  const int64_t units = p.row_bytes / r;
  const dim3 grid(static_cast<unsigned>((units + kThreads - 1) / kThreads),
                  static_cast<unsigned>(p.rows < 65535 ? p.rows : 65535));
  switch (r) {
    case 16:
      plane_move<16, kWrite><<<grid, kThreads, 0, stream>>>(p, canonical);
      break;
    case 8:
      plane_move<8, kWrite><<<grid, kThreads, 0, stream>>>(p, canonical);
      break;
    case 4:
      plane_move<4, kWrite><<<grid, kThreads, 0, stream>>>(p, canonical);
      break;
    case 2:
      plane_move<2, kWrite><<<grid, kThreads, 0, stream>>>(p, canonical);
      break;
    default:
      plane_move<1, kWrite><<<grid, kThreads, 0, stream>>>(p, canonical);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_plane_write(const DevicePlane& p, const uint8_t* canonical, cudaStream_t stream) {
  return launch<true>(p, const_cast<uint8_t*>(canonical), stream);
}

cudaError_t launch_plane_read(const DevicePlane& p, uint8_t* canonical, cudaStream_t stream) {
  return launch<false>(p, canonical, stream);
}

}  // namespace mxq::cuda
