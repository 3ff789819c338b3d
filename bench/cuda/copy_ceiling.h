// The copy ceiling kernel of the refit benchmark (copy_ceiling.cu): one pass of 16-byte loads and stores
// over `bytes` bytes (device, 16-byte aligned, a multiple of 16), src -> dst, no other work. It is what an SM
// kernel that moves every byte once reaches, beside cudaMemcpy's D2D rate on the same bytes.
// variant 0..3: two grid / loads-in-flight shapes, streaming or default-cached accesses; take the fastest.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

cudaError_t launch_copy_ceiling(uint8_t* dst, const uint8_t* src, int64_t bytes, int variant,
                                cudaStream_t stream);

}  // namespace mxq::cuda
