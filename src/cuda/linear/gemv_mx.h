// Weight-only GEMV for decode (M = 1..32): y[M,N] = x[M,K] · W[N,K]^T with x, y bf16 and W in MXFP8 or MXFP4,
// read in the native layout that prepare_gemv_values() writes (contract: gemv_layout.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/error.h"
#include "format/formats.h"

namespace mxq::cuda {

inline constexpr int64_t kGemvMaxM = 32;

// One linear layer's weights on the device, native values plane plus canonical [n, k/32] E8M0 scales.
struct MxGemvWeights {
  Format format = Format::kMXFP8;  // kMXFP8 or kMXFP4
  const uint8_t* values = nullptr;
  const uint8_t* scales = nullptr;
  int64_t n = 0;
  int64_t k = 0;
};

// x: [m, k] bf16 bits, y: [m, n] bf16 bits, both row-major device buffers. Refuses by name a format other
// than the launcher's, m outside 1..32, k not a multiple of 32, or a null pointer.
Status gemv_mxfp8(const uint16_t* x, int64_t m, const MxGemvWeights& w, uint16_t* y, cudaStream_t stream);
Status gemv_mxfp4(const uint16_t* x, int64_t m, const MxGemvWeights& w, uint16_t* y, cudaStream_t stream);

}  // namespace mxq::cuda
