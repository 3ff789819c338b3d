// Launchers of refit's device path for sparse planes kept in their wire encoding (docs/refit-format.md
// "Device path"): decode + validate (sparse_decode.cu), the batched scatter with undo capture and the
// incremental checksum update in one pass (refit_scatter.cu), used by
// weight_memory_cuda.cpp. Plain C++ (no base/error.h): every launcher returns the cudaError_t of its
// launches.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/refit/refit_launch.h"

namespace mxq::cuda {

// Index bytes of a gaps or bitmap plane one thread block decodes (256 threads x 16 bytes).
inline constexpr uint64_t kDecodeChunkBytes = 4096;

// One sparse plane of a batch. Entries of all jobs are numbered globally (first_entry: the prefix of the
// counts), and so are the decode chunks of the gaps / bitmap jobs (first_chunk; runs jobs have none).
struct SparseJobDevice {
  DevicePlane plane;
  const uint8_t* index = nullptr;  // gaps: LEB128 varints; bitmap: bits; runs: int32 (start, position) pairs
  uint64_t index_bytes = 0;
  const uint8_t* bytes = nullptr;  // count x entry_bytes new bytes (no alignment assumed)
  uint8_t* undo = nullptr;         // same size, or null
  int64_t count = 0, entries = 0;
  uint64_t* sums = nullptr;  // kept XXH3 block sums of its tensor (incremental checksums), or null
  uint64_t stream_off = 0;   // the plane's first byte in its tensor's checksum stream
  uint64_t blocks = 0;       // full blocks of that stream (xxh3_job_blocks)
  int entry_bytes = 1;
  uint8_t encoding = 0;  // 0 gaps, 1 bitmap, 2 runs
  uint8_t policy = 0;    // NewBytePolicy (model/weight_memory.h)
};

// Decodes every job into positions[first_entry + k] (int32 entry indices) and checks indices and new bytes;
// writes min(job << 32 | position) of every refusal into *error (set to ~0 by the caller). jobs, first_entry
// (job_count + 1 words), first_chunk (job_count + 1): device arrays. runs: some job is a runs job with
// entries. scan: 2 x (total_chunks + 1) words of scratch.
cudaError_t launch_sparse_decode(const SparseJobDevice* jobs, const uint64_t* first_entry,
                                 const uint64_t* first_chunk, int job_count, uint64_t total_chunks,
                                 uint64_t total_entries, bool runs, uint64_t* scan, int32_t* positions,
                                 unsigned long long* error, cudaStream_t stream);

// Entry k of job j: canonical bytes positions[first_entry[j] + k]·entry_bytes + b <- bytes[k·entry_bytes +
// b], the old byte saved to undo first; a job with kept sums (incremental checksums, undo given) adds each
// changed word's new term minus its old one to them (sum_delta.cu's rule) in the same pass. One thread per
// changed 8-byte word of all jobs.
cudaError_t launch_sparse_scatter_batch(const SparseJobDevice* jobs, const uint64_t* first_entry,
                                        int job_count, uint64_t total_entries, const int32_t* positions,
                                        cudaStream_t stream);

}  // namespace mxq::cuda
