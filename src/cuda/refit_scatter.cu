// Refit's sparse write on the device (CPU twin: WeightStore::apply_sparse on a host store). Two kernels on
// one stream: the check finds the first entry that is outside the plane or not above its predecessor and
// records it in a status word; the scatter reads that word and writes nothing if it is set, so a refused
// call leaves the live bytes untouched without a host round trip. Entry j covers canonical bytes
// indices[j]·entry_bytes + b, each sent through the layout; the old byte goes to undo[j·entry_bytes + b]
// right before the new one lands. One thread per entry: entries are distinct, so no two threads touch the
// same native byte. Indices come as int64 or int32 (the applier uploads int32 when a plane allows it).
// sparse_scatter_batch is the same write for a whole batch of planes at once (refit's device path), one
// thread per entry of all planes, after sparse_decode.cu has decoded and checked their positions.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/refit_launch.h"
#include "cuda/refit_plane.cuh"
#include "cuda/sparse_decode_launch.h"

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

// Entry j of a plane: its bytes through the layout, the old ones saved to undo first.
// note: a 1-byte entry of a plane with a `cols` table (the GEMV values) finds its native byte through the
// int32 run table: one row_off and one cols load instead of two int64 tables.
__device__ __forceinline__ void scatter_entry(const DevicePlane& p, uint64_t index, int64_t j,
                                              int entry_bytes, const uint8_t* bytes, uint8_t* undo) {
  const uint64_t first = index * static_cast<uint64_t>(entry_bytes);
  if (entry_bytes == 1 && p.cols != nullptr) {
    int64_t r, c;
    row_col(p, first, r, c);
    uint8_t* dst = p.native + p.row_off[r] + p.cols[c / p.run] + c % p.run;
    if (undo) undo[j] = *dst;
    *dst = bytes[j];
    return;
  }
  for (int b = 0; b < entry_bytes; ++b) {
    uint8_t* dst = p.native + native_offset(p, first + static_cast<uint64_t>(b));
    const int64_t k = j * entry_bytes + b;
    if (undo) undo[k] = *dst;
    *dst = bytes[k];
  }
}

// One thread per entry of all jobs (refit's device path: positions decoded and checked by sparse_decode.cu).
__global__ void sparse_scatter_batch(const SparseJobDevice* jobs, const uint64_t* first_entry, int job_count,
                                     uint64_t total, const int32_t* positions) {
  for (uint64_t e = static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x; e < total;
       e += static_cast<uint64_t>(gridDim.x) * kThreads) {
    const int j = job_of(first_entry, job_count, e);
    const SparseJobDevice& job = jobs[j];
    scatter_entry(job.plane, static_cast<uint64_t>(positions[e]), static_cast<int64_t>(e - first_entry[j]),
                  job.entry_bytes, job.bytes, job.undo);
  }
}

template <class I>
__global__ void sparse_scatter(DevicePlane p, const I* indices, int64_t count, int entry_bytes,
                               const uint8_t* bytes, uint8_t* undo, const unsigned long long* status) {
  if (*status != ~0ull) return;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; j < count;
       j += static_cast<int64_t>(gridDim.x) * kThreads)
    scatter_entry(p, static_cast<uint64_t>(indices[j]), j, entry_bytes, bytes, undo);
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

cudaError_t launch_sparse_scatter_batch(const SparseJobDevice* jobs, const uint64_t* first_entry,
                                        int job_count, uint64_t total_entries, const int32_t* positions,
                                        cudaStream_t stream) {
  if (total_entries == 0 || job_count == 0) return cudaSuccess;
  sparse_scatter_batch<<<grid_for(static_cast<int64_t>(total_entries)), kThreads, 0, stream>>>(
      jobs, first_entry, job_count, total_entries, positions);
  return cudaGetLastError();
}

}  // namespace mxq::cuda
