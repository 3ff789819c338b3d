// Refit's sparse write on the device (CPU twin: WeightStore::apply_sparse on a host store). Two kernels on
// one stream: the check finds the first entry that is outside the plane or not above its predecessor and
// records it in a status word; the scatter reads that word and writes nothing if it is set, so a refused
// call leaves the live bytes untouched without a host round trip. Entry j covers canonical bytes
// indices[j]·entry_bytes + b, each sent through the layout; the old byte goes to undo[j·entry_bytes + b]
// right before the new one lands. One thread per entry: entries are distinct, so no two threads touch the
// same native byte. Indices come as int64 or int32 (the applier uploads int32 when a plane allows it).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/refit_launch.h"
#include "cuda/refit_plane.cuh"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 256;

template <class I>
__global__ void sparse_check(const I* indices, int64_t count, int64_t entries, uint32_t call,
                             unsigned long long* status) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; j < count;
       j += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t i = indices[j];
    if (i < 0 || i >= entries || (j > 0 && static_cast<int64_t>(indices[j - 1]) >= i)) {
      const unsigned long long pos = j < 0xFFFFFFFFll ? static_cast<unsigned long long>(j) : 0xFFFFFFFFull;
      atomicMin(status, static_cast<unsigned long long>(call) << 32 | pos);
    }
  }
}

// note: a 1-byte entry of a plane with a `cols` table (the GEMV values) finds its native byte through the
// int32 run table: one row_off and one cols load instead of two int64 tables.
template <class I>
__global__ void sparse_scatter(DevicePlane p, const I* indices, int64_t count, int entry_bytes,
                               const uint8_t* bytes, uint8_t* undo, const unsigned long long* status) {
  if (*status != ~0ull) return;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; j < count;
       j += static_cast<int64_t>(gridDim.x) * kThreads) {
    const uint64_t first = static_cast<uint64_t>(indices[j]) * static_cast<uint64_t>(entry_bytes);
    if (entry_bytes == 1 && p.cols != nullptr) {
      int64_t r, c;
      row_col(p, first, r, c);
      uint8_t* dst = p.native + p.row_off[r] + p.cols[c / p.run] + c % p.run;
      if (undo) undo[j] = *dst;
      *dst = bytes[j];
      continue;
    }
    for (int b = 0; b < entry_bytes; ++b) {
      uint8_t* dst = p.native + native_offset(p, first + static_cast<uint64_t>(b));
      const int64_t k = j * entry_bytes + b;
      if (undo) undo[k] = *dst;
      *dst = bytes[k];
    }
  }
}

unsigned grid_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 132 * 64 ? (blocks > 0 ? blocks : 1) : 132 * 64);
}

}  // namespace

cudaError_t launch_sparse_check(const void* indices, int index_bytes, int64_t count, int64_t entries,
                                uint32_t call, unsigned long long* status, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (index_bytes == 4)
    sparse_check<<<grid_for(count), kThreads, 0, stream>>>(static_cast<const int32_t*>(indices), count,
                                                           entries, call, status);
  else
    sparse_check<<<grid_for(count), kThreads, 0, stream>>>(static_cast<const int64_t*>(indices), count,
                                                           entries, call, status);
  return cudaGetLastError();
}

cudaError_t launch_sparse_scatter(const DevicePlane& p, const void* indices, int index_bytes, int64_t count,
                                  int entry_bytes, const uint8_t* bytes, uint8_t* undo,
                                  const unsigned long long* status, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (index_bytes == 4)
    sparse_scatter<<<grid_for(count), kThreads, 0, stream>>>(p, static_cast<const int32_t*>(indices), count,
                                                             entry_bytes, bytes, undo, status);
  else
    sparse_scatter<<<grid_for(count), kThreads, 0, stream>>>(p, static_cast<const int64_t*>(indices), count,
                                                             entry_bytes, bytes, undo, status);
  return cudaGetLastError();
}

}  // namespace mxq::cuda
