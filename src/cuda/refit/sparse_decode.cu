// Decode and validation of refit delta index sets on the device (docs/refit-format.md section 3 and "Device
// path"). CPU twin: refit::decode_indices (index_codec.cpp) + check_tensor_delta's W-05 policy; the GPU test
// compares positions bitwise and refusals plane by plane.
//
// Layout contract. A batch of jobs (SparseJobDevice), each one sparse plane: its index bytes, count changed
// entries of a plane of `entries` (< 2^31), its new bytes. Output: positions[first_entry[j] + k], int32, the
// k-th changed entry of job j. Errors: *error = min(job << 32 | position) over every refused entry, nothing
// else written (the live planes are not touched here at all).
//
// Gaps (LEB128 varints, first index then differences >= 1) and bitmaps are cut into 4 KiB chunks, one thread
// block each, 16 bytes per thread, in three passes:
//   1. chunk_count: per chunk, the varints that END in it (a byte without bit 7) and the sum of their values
//      (bitmap: the set bits). A varint's value is read backwards from its last byte, so a varint that
//      straddles chunks belongs to the chunk of its last byte.
//   2. chunk_scan: one thread block, exclusive prefix sums of both over all chunks of all jobs; a job's
//      base is the prefix at its first chunk.
//   3. chunk_emit: the same walk with the block's own prefix: varint v of the job is index
//      sum(values 0..v) (bitmap: byte·8 + bit), written when v < count; refused: a tenth byte (>= 2^63), a
//      final 0x00 after a continuation byte (non-minimal), a zero gap after the first (W-02), an index past
//      the plane (W-01; gaps are >= 1, so order holds by construction), more varints than count.
// Then job_check (one thread per job): varints found != count (W-03), a gaps plane ending inside a varint
// (cut off), bitmap length != ceil(entries / 8) or pad bits set. chunk_emit also checks each entry's new
// bytes against the plane's policy as it decodes it (a gaps chunk gathers its positions in shared memory
// and writes them out in whole sectors). Runs arrive decoded and checked by the host as a run table (int32
// first entry, int32 position per run, O(runs)); entry_pass (launched only when a job has runs) expands
// them (binary search by position) and checks their new bytes. Entries of a gaps / bitmap plane past its
// last varint or set bit are not policy-checked: the count check refuses that plane at a lower position.
// note: varint values are clamped to `entries` before they are summed, so a forged 9-byte varint cannot wrap
// the prefix sums of the entries before it (they stay below 2^62: count < 2^31 terms below 2^31).
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_scan.cuh>

#include "cuda/refit/new_byte_policy.cuh"
#include "cuda/refit/refit_plane.cuh"
#include "cuda/refit/sparse_decode_launch.h"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBytesPerThread = static_cast<int>(kDecodeChunkBytes) / kThreads;
static_assert(kBytesPerThread * kThreads == static_cast<int>(kDecodeChunkBytes));
constexpr uint8_t kGaps = 0, kBitmap = 1, kRuns = 2;

__device__ __forceinline__ void refuse(unsigned long long* error, int job, int64_t position) {
  const auto pos = static_cast<unsigned long long>(position < 0xFFFFFFFFll ? position : 0xFFFFFFFFll);
  atomicMin(error, static_cast<unsigned long long>(job) << 32 | pos);
}

// The varint ending at byte b (b has bit 7 clear) of data[0..]: its value, its length in bytes (stops
// counting at 10, which is refused), and whether it is minimal.
struct Varint {
  uint64_t value;
  int length;
  bool minimal;
};
__device__ __forceinline__ Varint varint_ending_at(const uint8_t* data, int64_t b) {
  Varint v{data[b], 1, true};
  for (int64_t k = b - 1; k >= 0 && (data[k] & 0x80) && v.length < 10; --k) {
    v.value = v.value << 7 | (data[k] & 0x7F);
    ++v.length;
  }
  v.minimal = v.length == 1 || data[b] != 0;
  return v;
}

// This thread's bytes of chunk c: [lo, hi) of the job's index bytes.
__device__ __forceinline__ void thread_bytes(const SparseJobDevice& job, uint64_t local_chunk, int64_t& lo,
                                             int64_t& hi) {
  const auto len = static_cast<int64_t>(job.index_bytes);
  lo = static_cast<int64_t>(local_chunk * kDecodeChunkBytes) + threadIdx.x * kBytesPerThread;
  hi = lo + kBytesPerThread < len ? lo + kBytesPerThread : len;
}

__device__ __forceinline__ uint64_t clamp_value(const Varint& v, int64_t entries) {
  return v.length >= 10 || v.value >= static_cast<uint64_t>(entries) ? static_cast<uint64_t>(entries)
                                                                     : v.value;
}

// Varints ending in / bits set in this thread's bytes, and the sum of the (clamped) varint values.
__device__ __forceinline__ void thread_totals(const SparseJobDevice& job, int64_t lo, int64_t hi,
                                              unsigned long long& n, unsigned long long& s) {
  n = 0, s = 0;
  for (int64_t b = lo; b < hi; ++b) {
    const uint8_t byte = job.index[b];
    if (job.encoding == kBitmap) {
      n += __popc(byte);
    } else if (!(byte & 0x80)) {
      ++n;
      s += clamp_value(varint_ending_at(job.index, b), job.entries);
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    chunk_count(const SparseJobDevice* jobs, const uint64_t* first_chunk, int job_count, uint64_t* chunk_n,
                uint64_t* chunk_s) {
  using Reduce = cub::BlockScan<unsigned long long, kThreads>;
  __shared__ typename Reduce::TempStorage tmp_n, tmp_s;
  const uint64_t c = blockIdx.x;
  const int j = job_of(first_chunk, job_count, c);
  const SparseJobDevice& job = jobs[j];
  int64_t lo, hi;
  thread_bytes(job, c - first_chunk[j], lo, hi);
  unsigned long long n, s, total_n, total_s;
  thread_totals(job, lo, hi, n, s);
  Reduce(tmp_n).ExclusiveSum(n, n, total_n);
  Reduce(tmp_s).ExclusiveSum(s, s, total_s);
  if (threadIdx.x == 0) chunk_n[c] = total_n, chunk_s[c] = total_s;
}

// Exclusive prefix sums over count + 1 words (the last becomes the total), in place; one thread block.
// note: 256 threads x 16 words a tile: the scan needs ~107 registers a thread, too many for 1024 threads.
constexpr int kScanThreads = 256, kScanItems = 16;
__global__ void __launch_bounds__(kScanThreads)
    chunk_scan(uint64_t* n_words, uint64_t* s_words, uint64_t count) {
  using Scan = cub::BlockScan<unsigned long long, kScanThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ unsigned long long carry;
  for (int pass = 0; pass < 2; ++pass) {
    uint64_t* words = pass == 0 ? n_words : s_words;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (uint64_t tile = 0; tile <= count; tile += kScanThreads * kScanItems) {
      const uint64_t at = tile + static_cast<uint64_t>(threadIdx.x) * kScanItems;
      unsigned long long v[kScanItems], sum = 0;
      for (int k = 0; k < kScanItems; ++k) {
        v[k] = at + k < count ? words[at + k] : 0;
        sum += v[k];
      }
      unsigned long long before, tile_total;
      Scan(tmp).ExclusiveSum(sum, before, tile_total);
      before += carry;
      for (int k = 0; k < kScanItems; ++k) {
        if (at + k <= count) words[at + k] = before;
        before += v[k];
      }
      __syncthreads();  // note: every thread has read `carry` and the scan storage before they change
      if (threadIdx.x == 0) carry += tile_total;
      __syncthreads();
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    chunk_emit(const SparseJobDevice* jobs, const uint64_t* first_entry, const uint64_t* first_chunk,
               int job_count, const uint64_t* chunk_n, const uint64_t* chunk_s, int32_t* positions,
               unsigned long long* error) {
  using Scan = cub::BlockScan<unsigned long long, kThreads>;
  __shared__ typename Scan::TempStorage tmp_n, tmp_s;
  // note: a gaps chunk's positions are one contiguous run of at most kDecodeChunkBytes varints: gathered
  // here, then written out in whole sectors (one thread per varint wrote 4 bytes at ~12-entry strides).
  __shared__ int32_t gathered[kDecodeChunkBytes];
  const uint64_t c = blockIdx.x;
  const int j = job_of(first_chunk, job_count, c);
  const SparseJobDevice& job = jobs[j];
  int64_t lo, hi;
  thread_bytes(job, c - first_chunk[j], lo, hi);
  unsigned long long n, s, block_n;
  thread_totals(job, lo, hi, n, s);
  Scan(tmp_n).ExclusiveSum(n, n, block_n);
  Scan(tmp_s).ExclusiveSum(s, s);
  // note: v = this thread's first varint (or set bit) number in the job, sum = the sum of the values before
  // it
  const uint64_t v_block = chunk_n[c] - chunk_n[first_chunk[j]];
  uint64_t v = v_block + n;
  uint64_t sum = chunk_s[c] - chunk_s[first_chunk[j]] + s;
  int32_t* out = positions + first_entry[j];
  const auto count = static_cast<uint64_t>(job.count);
  const auto eb = static_cast<uint64_t>(job.entry_bytes);
  for (int64_t b = lo; b < hi; ++b) {
    const uint8_t byte = job.index[b];
    if (job.encoding == kBitmap) {
      for (unsigned bits = byte; bits; bits &= bits - 1, ++v) {
        const int64_t index = b * 8 + __ffs(bits) - 1;
        if (index >= job.entries || v >= count) {
          refuse(error, j, static_cast<int64_t>(v < count ? v : count));
          continue;
        }
        if (refused_entry(job.policy, job.bytes + v * eb)) refuse(error, j, static_cast<int64_t>(v));
        out[v] = static_cast<int32_t>(index);
      }
      continue;
    }
    if (byte & 0x80) continue;
    const Varint var = varint_ending_at(job.index, b);
    sum += clamp_value(var, job.entries);
    const bool bad = var.length >= 10 || !var.minimal || (v > 0 && var.value == 0) ||
                     sum >= static_cast<uint64_t>(job.entries) || v >= count;
    if (bad)
      refuse(error, j, static_cast<int64_t>(v < count ? v : count));
    else
      gathered[v - v_block] = static_cast<int32_t>(sum);
    if (v < count && refused_entry(job.policy, job.bytes + v * eb)) refuse(error, j, static_cast<int64_t>(v));
    ++v;
  }
  if (job.encoding == kBitmap) return;  // note: uniform per block
  __syncthreads();
  // note: a refused varint left its slot unwritten; the decode is then refused and positions are not used.
  const uint64_t end = v_block + block_n < count ? v_block + block_n : count;
  for (uint64_t at = v_block + threadIdx.x; at < end; at += kThreads) out[at] = gathered[at - v_block];
}

__global__ void job_check(const SparseJobDevice* jobs, const uint64_t* first_chunk, int job_count,
                          const uint64_t* chunk_n, unsigned long long* error) {
  const int j = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (j >= job_count) return;
  const SparseJobDevice& job = jobs[j];
  if (job.encoding == kRuns) return;
  const auto found = static_cast<int64_t>(chunk_n[first_chunk[j + 1]] - chunk_n[first_chunk[j]]);
  const int64_t at = found < job.count ? found : job.count;
  if (found != job.count) refuse(error, j, at);
  if (job.encoding == kGaps && job.index_bytes > 0 && (job.index[job.index_bytes - 1] & 0x80))
    refuse(error, j, at);  // cut off inside a varint
  if (job.encoding == kBitmap) {
    const auto want = static_cast<uint64_t>((job.entries + 7) / 8);
    if (job.index_bytes != want) refuse(error, j, 0);
    // note: pad bits are caught by chunk_emit (an index past the plane).
  }
}

// Runs jobs only (gaps and bitmap entries are checked by chunk_emit as it decodes them).
__global__ void entry_pass(const SparseJobDevice* jobs, const uint64_t* first_entry, int job_count,
                           uint64_t total, int32_t* positions, unsigned long long* error) {
  for (uint64_t e = static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x; e < total;
       e += static_cast<uint64_t>(gridDim.x) * kThreads) {
    const int j = job_of(first_entry, job_count, e);
    const SparseJobDevice& job = jobs[j];
    const auto k = static_cast<int64_t>(e - first_entry[j]);
    if (job.encoding != kRuns) continue;
    // note: run r covers positions [pos_r, pos_{r+1}) from entry start_r; the host checked the table.
    const auto* runs = reinterpret_cast<const int32_t*>(job.index);
    int lo = 0, hi = static_cast<int>(job.index_bytes / 8) - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (runs[2 * mid + 1] <= k)
        lo = mid;
      else
        hi = mid - 1;
    }
    positions[e] = static_cast<int32_t>(runs[2 * lo] + (k - runs[2 * lo + 1]));
    if (refused_entry(job.policy, job.bytes + k * job.entry_bytes)) refuse(error, j, k);
  }
}

unsigned grid_for(uint64_t count) {
  const uint64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 132 * 64 ? (blocks > 0 ? blocks : 1) : 132 * 64);
}

}  // namespace

cudaError_t launch_sparse_decode(const SparseJobDevice* jobs, const uint64_t* first_entry,
                                 const uint64_t* first_chunk, int job_count, uint64_t total_chunks,
                                 uint64_t total_entries, bool runs, uint64_t* scan, int32_t* positions,
                                 unsigned long long* error, cudaStream_t stream) {
  if (job_count == 0) return cudaSuccess;
  uint64_t* chunk_n = scan;
  uint64_t* chunk_s = scan + total_chunks + 1;
  if (total_chunks > 0x7FFFFFFFull) return cudaErrorInvalidValue;
  if (total_chunks > 0) {
    chunk_count<<<static_cast<unsigned>(total_chunks), kThreads, 0, stream>>>(jobs, first_chunk, job_count,
                                                                              chunk_n, chunk_s);
  }
  chunk_scan<<<1, kScanThreads, 0, stream>>>(chunk_n, chunk_s, total_chunks);
  if (total_chunks > 0) {
    chunk_emit<<<static_cast<unsigned>(total_chunks), kThreads, 0, stream>>>(
        jobs, first_entry, first_chunk, job_count, chunk_n, chunk_s, positions, error);
  }
  job_check<<<(job_count + 127) / 128, 128, 0, stream>>>(jobs, first_chunk, job_count, chunk_n, error);
  if (runs && total_entries > 0)
    entry_pass<<<grid_for(total_entries), kThreads, 0, stream>>>(jobs, first_entry, job_count, total_entries,
                                                                 positions, error);
  return cudaGetLastError();
}

}  // namespace mxq::cuda
