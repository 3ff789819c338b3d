// Launch of the whole-plane W-05 check (check_planes.cu): the CUDA memory's WeightMemory::check_planes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

// One plane: `bytes` new bytes of entries of the policy's width. Planes are cut into 16-byte chunks, numbered
// globally (first_chunk: the prefix of the chunk counts).
struct PlaneCheckDevice {
  const uint8_t* bytes = nullptr;
  uint64_t size = 0;
  uint64_t first_chunk = 0;
  uint8_t policy = 0;  // NewBytePolicy (model/weight_memory.h)
};

// Bits of the error key below the job index: the refused entry's position.
inline constexpr int kCheckPositionBits = 40;

// *error (set to ~0 by the caller) = min(job << kCheckPositionBits | entry) over every refused entry.
cudaError_t launch_check_planes(const PlaneCheckDevice* jobs, int job_count, uint64_t total_chunks,
                                unsigned long long* error, cudaStream_t stream);

}  // namespace mxq::cuda
