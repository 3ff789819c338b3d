// WeightMemory (model/weight_memory.h) in CUDA device memory: live planes from cudaMalloc (allocated once,
// never moved), layout tables uploaded next to them, and the refit kernels (refit_plane.cu,
// refit_scatter.cu, xxh3_checksum.cu) for writes, reads, sparse scatters with undo capture and checksums.
// Host spans given to it (pinned or pageable) are staged through a device buffer; device spans are used as
// they are. All work runs on one stream, in order; calls that return host-visible results (checksums, reads
// into host memory, sync) wait for it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "model/weight_memory.h"

namespace mxq::cuda {

struct CudaMemoryOptions {
  cudaStream_t stream = nullptr;  // null: the memory creates its own non-blocking stream
  // Bytes of scratch (undo logs, uploaded deltas) it will hand out in all; more is refused by name (tests
  // use a small limit to reach W-26 without exhausting the GPU).
  size_t scratch_limit = SIZE_MAX;
};

Result<std::unique_ptr<WeightMemory>> cuda_weight_memory(const CudaMemoryOptions& options = {});

// The stream a CUDA weight memory runs on (null for any other memory).
cudaStream_t weight_memory_stream(const WeightMemory& memory);

}  // namespace mxq::cuda
