// The device table of a batch of encoded sparse planes (CudaWeightMemory's sparse decode and scatter,
// weight_memory_cuda.cpp): one SparseJobDevice per plane plus the entry and decode-chunk prefixes
// (sparse_decode_launch.h), uploaded into a buffer of the caller's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <span>

#include "base/error.h"
#include "cuda/common/check.h"
#include "cuda/refit/kept_sums.h"
#include "cuda/refit/sparse_decode_launch.h"
#include "layout/layout.h"
#include "layout/plane_jobs.h"

namespace mxq::cuda {

struct SparseJobTable {
  const SparseJobDevice* jobs = nullptr;
  const uint64_t *first_entry = nullptr, *first_chunk = nullptr;
  uint64_t entries = 0, chunks = 0;
};

// A live plane's device description (CudaWeightMemory's own planes only).
using PlaneLookup = std::function<Result<DevicePlane>(const PlaneLayout&, std::span<const uint8_t>)>;

// Checks each job's sizes, builds its descriptor and uploads the table into `table` (grown on demand, on
// `stream`). kept: the incremental checksums' records, or null; a job whose tensor has valid kept sums
// updates them in the scatter when it saves undo bytes, and marks them stale when it does not.
Result<SparseJobTable> upload_sparse_jobs(std::span<const SparsePlaneJob> jobs,
                                          std::span<const uint8_t> positions, KeptSums* kept,
                                          const PlaneLookup& plane, DeviceBuffer& table, cudaStream_t stream);

}  // namespace mxq::cuda
