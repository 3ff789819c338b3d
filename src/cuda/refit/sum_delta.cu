// Incremental XXH3-64 block sums after a sparse write (CudaMemoryOptions::incremental_checksums). CPU twin:
// the full block sums of xxh3_device.cuh (hash_long_reference), which the GPU test compares bitwise after
// every update. A block's 8 lane sums are plain sums over its 16 stripes of per-word terms:
//   word w at stripe s, lane i adds  w  to sum[i ^ 1]  and  lo32(w ^ k)·hi32(w ^ k)  to sum[i],
//   k = secret at 8s + 8i,
// so replacing a word changes exactly those two sums by (new term − old term), mod 2^64. One thread per
// entry; the first entry of each changed 8-byte word (indices are sorted) handles the whole word: it reads
// the new word from the live plane (after the scatter, same stream), rebuilds the old word by putting back
// the undo bytes of every entry in that word, and adds the two differences with 64-bit atomics (entries of
// other words of the same block may add concurrently). Words of the stream's tail (blocks >=
// full_blocks(len)) have no kept sums: the chain reads the tail from the live planes. (Refit's batched
// device path applies the same rule inside its scatter: refit_scatter.cu, sparse_write_batch.)
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/refit/refit_launch.h"
#include "cuda/refit/refit_plane.cuh"
#include "cuda/refit/xxh3_device.cuh"

namespace mxq::cuda {
namespace {

namespace x = xxh3;

constexpr int kThreads = 256;

// Entry j of a plane's sorted indices: if it is the first entry of its 8-byte stream word, adds the word's
// new term minus its old one to the kept sums.
template <class I>
__device__ __forceinline__ void sum_delta_entry(const DevicePlane& p, const I* indices, int64_t count,
                                                int64_t j, uint64_t eb, const uint8_t* undo,
                                                uint64_t stream_off, uint64_t blocks, uint64_t* sums) {
  const uint64_t q = static_cast<uint64_t>(indices[j]) * eb;  // plane byte of the entry
  const uint64_t word = (stream_off + q) / 8;                 // stream word
  if (j > 0 && (stream_off + static_cast<uint64_t>(indices[j - 1]) * eb) / 8 == word) return;
  const uint64_t block = word * 8 / x::kBlockBytes;
  if (block >= blocks) return;
  const uint64_t wq = word * 8 - stream_off;  // plane byte of the word (stream_off % 8 == 0)
  const uint64_t now = plane_word(p, wq);
  uint64_t old = now;
  // note: entries of one word are consecutive in sorted order; at most 8 of them.
  for (int64_t e = j; e < count; ++e) {
    const uint64_t qe = static_cast<uint64_t>(indices[e]) * eb;
    if ((stream_off + qe) / 8 != word) break;
    for (uint64_t b = 0; b < eb; ++b) {
      const int shift = static_cast<int>(8 * (qe + b - wq));
      old = (old & ~(0xFFull << shift)) | uint64_t{undo[static_cast<uint64_t>(e) * eb + b]} << shift;
    }
  }
  if (old == now) return;
  const int s = static_cast<int>(word * 8 % x::kBlockBytes / x::kStripeBytes);
  const int i = static_cast<int>(word % 8);
  const uint64_t key = x::secret_word(s + i);
  unsigned long long* at = reinterpret_cast<unsigned long long*>(sums + block * 8);
  atomicAdd(at + (i ^ 1), static_cast<unsigned long long>(now - old));
  atomicAdd(at + i, static_cast<unsigned long long>(x::mul_term(now, key) - x::mul_term(old, key)));
}

template <class I>
__global__ void sum_delta(DevicePlane p, const I* indices, int64_t count, int entry_bytes,
                          const uint8_t* undo, uint64_t stream_off, uint64_t blocks, uint64_t* sums,
                          const unsigned long long* status) {
  if (*status != ~0ull) return;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; j < count;
       j += static_cast<int64_t>(gridDim.x) * kThreads)
    sum_delta_entry(p, indices, count, j, static_cast<uint64_t>(entry_bytes), undo, stream_off, blocks, sums);
}

unsigned grid_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 132 * 64 ? (blocks > 0 ? blocks : 1) : 132 * 64);
}

}  // namespace

cudaError_t launch_sum_delta(const DevicePlane& p, const void* indices, int index_bytes, int64_t count,
                             int entry_bytes, const uint8_t* undo, uint64_t stream_off, uint64_t len,
                             uint64_t* sums, const unsigned long long* status, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const uint64_t blocks = xxh3_job_blocks(len);
  if (index_bytes == 4)
    sum_delta<<<grid_for(count), kThreads, 0, stream>>>(p, static_cast<const int32_t*>(indices), count,
                                                        entry_bytes, undo, stream_off, blocks, sums, status);
  else
    sum_delta<<<grid_for(count), kThreads, 0, stream>>>(p, static_cast<const int64_t*>(indices), count,
                                                        entry_bytes, undo, stream_off, blocks, sums, status);
  return cudaGetLastError();
}

}  // namespace mxq::cuda
