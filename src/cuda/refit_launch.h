// Launchers of the refit kernels (refit_plane.cu, refit_scatter.cu, xxh3_checksum.cu), used by
// weight_memory_cuda.cpp. Plain C++ (no base/error.h): every launcher returns the cudaError_t of its launch.
// A DevicePlane is one live plane in device memory with its Layout (layout/layout.h) tables on the device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#if defined(__CUDACC__)
#define MXQ_REFIT_HD __host__ __device__
#else
#define MXQ_REFIT_HD
#endif

namespace mxq::cuda {

struct DevicePlane {
  uint8_t* native = nullptr;         // live bytes (device)
  const int64_t* row_off = nullptr;  // separable tables (device); both null for an identity plane
  const int64_t* col_off = nullptr;
  int64_t rows = 0, row_bytes = 0;  // canonical geometry (identity: any split of its bytes)
  // Bytes that move together: for c % run == 0, canonical bytes c..c+run-1 of a row sit at native
  // row_off + col_off[c] + 0..run-1, and that offset is a multiple of run (1, 2, 4, 8 or 16; 16 for identity).
  int run = 1;
  MXQ_REFIT_HD int64_t bytes() const { return rows * row_bytes; }
  MXQ_REFIT_HD bool identity() const { return row_off == nullptr; }
};

// Full plane, canonical (device, `bytes()` bytes) -> native, separable planes only (identity is a memcpy).
// Native padding is not touched (the caller zeroes it).
cudaError_t launch_plane_write(const DevicePlane& p, const uint8_t* canonical, cudaStream_t stream);
// Full plane, native -> canonical (device), separable planes only.
cudaError_t launch_plane_read(const DevicePlane& p, uint8_t* canonical, cudaStream_t stream);

// Sparse entries. The check writes min(call << 32 | j) into *status (initially ~0) for the first entry j
// outside [0, entries) or not above its predecessor; the scatter writes nothing when *status != ~0.
cudaError_t launch_sparse_check(const int64_t* indices, int64_t count, int64_t entries, uint32_t call,
                                unsigned long long* status, cudaStream_t stream);
// Entry j: canonical bytes indices[j]·entry_bytes + b <- bytes[j·entry_bytes + b], old byte saved into
// undo[j·entry_bytes + b] first when undo is not null.
cudaError_t launch_sparse_scatter(const DevicePlane& p, const int64_t* indices, int64_t count, int entry_bytes,
                                  const uint8_t* bytes, uint8_t* undo, const unsigned long long* status,
                                  cudaStream_t stream);

// One tensor's XXH3-64 over its canonical values then scales bytes, read through the planes' layouts.
struct ChecksumJobDevice {
  DevicePlane values, scales;
  uint64_t len = 0;          // values.bytes() + scales.bytes()
  uint64_t first_block = 0;  // its first full block in the block-sum array (jobs in order, prefix sums)
};
// Blocks of a job in the block-sum array: the full 1024-byte blocks of a long (> 240 byte) input, else 0.
uint64_t xxh3_job_blocks(uint64_t len);
// Pass 1: 8 lane sums of every full block of every job (sums: total_blocks·8 words). jobs: device array.
cudaError_t launch_xxh3_block_sums(const ChecksumJobDevice* jobs, int job_count, uint64_t total_blocks,
                                   uint64_t* sums, cudaStream_t stream);
// Pass 2: per job, the scramble chain over its block sums, its tail, the merge (or the short path): out[k].
cudaError_t launch_xxh3_finish(const ChecksumJobDevice* jobs, int job_count, const uint64_t* sums,
                               uint64_t* out, cudaStream_t stream);

}  // namespace mxq::cuda
