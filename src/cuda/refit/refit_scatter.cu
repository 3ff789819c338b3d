// Refit's sparse write on the device (CPU twin: WeightStore::apply_sparse on a host store). Two kernels on
// one stream: the check finds the first entry that is outside the plane or not above its predecessor and
// records it in a status word; the scatter reads that word and writes nothing if it is set, so a refused
// call leaves the live bytes untouched without a host round trip. Entry j covers canonical bytes
// indices[j]·entry_bytes + b, each sent through the layout; the old byte goes to undo[j·entry_bytes + b]
// right before the new one lands. One thread per entry: entries are distinct, so no two threads touch the
// same native byte. Indices come as int64 or int32 (the applier uploads int32 when a plane allows it).
// sparse_write_batch is the same write for a whole batch of planes at once (refit's device path), after
// sparse_decode.cu has decoded and checked their positions, fused with the incremental checksum update
// (sum_delta.cu's rule): one thread per changed 8-byte canonical word of a plane (the thread of the word's
// first entry; the entries of a word are consecutive in sorted order, at most 8 / entry_bytes of them) reads
// the word's native bytes once (GEMV MXFP8 values: two 4-byte loads of one sector; identity and runs of 8 or
// more: one 8-byte load; any other layout: byte by byte), saves the old bytes of its entries to undo, stores
// the changed pieces, and adds the word's new term minus its old one to the kept block sums from the same
// registers (no second pass re-reading the live word and the undo bytes). Threads of one word touch no
// native byte of another (layouts permute whole runs of >= 4 bytes here, or go byte by byte).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/refit/refit_launch.h"
#include "cuda/refit/refit_plane.cuh"
#include "cuda/refit/sparse_decode_launch.h"
#include "cuda/refit/xxh3_device.cuh"

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

// The native places of canonical word wq..wq+7 of a plane (wq % 8 == 0) as 8 / width pieces of `width`
// bytes (8, 4 or 1), piece i holding canonical bytes wq + width·i ..; a null piece lies past the plane.
__device__ __forceinline__ int word_pieces(const DevicePlane& p, uint64_t wq, uint8_t* (&at)[8]) {
  const auto bytes = static_cast<uint64_t>(p.bytes());
  if (p.identity()) {
    if (wq + 8 <= bytes) return at[0] = p.native + wq, 8;
  } else if (p.cols != nullptr && p.run >= 4) {
    int64_t r, c;
    row_col(p, wq, r, c);
    if (c + 8 <= p.row_bytes) {
      uint8_t* row = p.native + p.row_off[r];
      if (p.run >= 8) return at[0] = row + p.cols[c / p.run] + c % p.run, 8;
      at[0] = row + p.cols[c / 4], at[1] = row + p.cols[c / 4 + 1];
      return 4;
    }
  }
  for (int b = 0; b < 8; ++b)
    at[b] = wq + b < bytes ? p.native + native_offset(p, wq + static_cast<uint64_t>(b)) : nullptr;
  return 1;
}

__device__ __forceinline__ uint64_t load_piece(const uint8_t* at, int width) {
  if (width == 8) return *reinterpret_cast<const uint64_t*>(at);
  if (width == 4) return *reinterpret_cast<const uint32_t*>(at);
  return *at;
}
__device__ __forceinline__ void store_piece(uint8_t* at, int width, uint64_t v) {
  if (width == 8)
    *reinterpret_cast<uint64_t*>(at) = v;
  else if (width == 4)
    *reinterpret_cast<uint32_t*>(at) = static_cast<uint32_t>(v);
  else
    *at = static_cast<uint8_t>(v);
}

// Batch entry e's job: a warp-uniform binary search from the first active lane's entry (its loads are
// broadcasts), then a short walk for lanes past a job boundary.
// note: a lane behind that entry (lanes of another loop iteration grouped at this instruction) searches on
// its own.
__device__ __forceinline__ int warp_job_of(const uint64_t* first_entry, int job_count, uint64_t e) {
  const unsigned active = __activemask();
  const uint64_t e0 = __shfl_sync(active, e, __ffs(active) - 1);
  int j = job_of(first_entry, job_count, e0);
  if (first_entry[j] > e) j = job_of(first_entry, job_count, e);
  while (j + 1 < job_count && first_entry[j + 1] <= e) ++j;
  return j;
}

// One thread per entry of all jobs; the first entry of each changed 8-byte word does the word.
__global__ void sparse_write_batch(const SparseJobDevice* jobs, const uint64_t* first_entry, int job_count,
                                   uint64_t total, const int32_t* positions) {
  namespace x = xxh3;
  for (uint64_t e = static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x; e < total;
       e += static_cast<uint64_t>(gridDim.x) * kThreads) {
    const int j = warp_job_of(first_entry, job_count, e);
    const SparseJobDevice& job = jobs[j];
    const uint64_t first = first_entry[j], k = e - first;
    const auto eb = static_cast<uint64_t>(job.entry_bytes);
    const uint64_t wq = static_cast<uint64_t>(positions[e]) * eb & ~uint64_t{7};
    if (k > 0 && (static_cast<uint64_t>(positions[e - 1]) * eb & ~uint64_t{7}) == wq) continue;
    uint8_t* at[8];
    const int width = word_pieces(job.plane, wq, at);
    const int pieces = 8 / width;
    uint64_t old = 0;
    for (int i = 0; i < pieces; ++i)
      if (at[i]) old |= load_piece(at[i], width) << (8 * width * i);
    uint64_t now = old;
    const auto count = static_cast<uint64_t>(job.count);
    // note: entry bytes divide 8 (1, 2, 4), so an entry never straddles two words.
    for (uint64_t m = k; m < count; ++m) {
      const uint64_t q = static_cast<uint64_t>(positions[first + m]) * eb;
      if ((q & ~uint64_t{7}) != wq) break;
      for (uint64_t b = 0; b < eb; ++b) {
        const int shift = static_cast<int>(8 * (q + b - wq));
        if (job.undo) job.undo[m * eb + b] = static_cast<uint8_t>(old >> shift);
        now = (now & ~(0xFFull << shift)) | uint64_t{job.bytes[m * eb + b]} << shift;
      }
    }
    const uint64_t piece_mask = width == 8 ? ~0ull : (1ull << (8 * width)) - 1;
    for (int i = 0; i < pieces; ++i) {
      const int shift = 8 * width * i;
      if (at[i] && ((old ^ now) >> shift & piece_mask)) store_piece(at[i], width, now >> shift);
    }
    if (job.sums == nullptr || old == now) continue;
    const uint64_t word = (job.stream_off + wq) / 8;  // stream word (stream_off % 8 == 0)
    const uint64_t block = word * 8 / x::kBlockBytes;
    if (block >= job.blocks) continue;  // the stream's tail: the chain reads it from the live planes
    const int s = static_cast<int>(word * 8 % x::kBlockBytes / x::kStripeBytes),
              i = static_cast<int>(word % 8);
    const uint64_t key = x::secret_word(s + i);
    auto* sum = reinterpret_cast<unsigned long long*>(job.sums + block * 8);
    atomicAdd(sum + (i ^ 1), static_cast<unsigned long long>(now - old));
    atomicAdd(sum + i, static_cast<unsigned long long>(x::mul_term(now, key) - x::mul_term(old, key)));
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
  sparse_write_batch<<<grid_for(static_cast<int64_t>(total_entries)), kThreads, 0, stream>>>(
      jobs, first_entry, job_count, total_entries, positions);
  return cudaGetLastError();
}

}  // namespace mxq::cuda
