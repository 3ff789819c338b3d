// The read-only ceiling kernel of the benchmarks (read_ceiling.cu): one pass of 16-byte loads over `bytes`
// bytes at p (device, 16-byte aligned), nothing written but a sink word that the data never selects.
// variant 0 or 1: two grid / loads-in-flight shapes; take the faster of the two as the ceiling.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

cudaError_t launch_read_ceiling(const uint8_t* p, int64_t bytes, uint32_t* sink, int variant,
                                cudaStream_t stream);

}  // namespace mxq::cuda
