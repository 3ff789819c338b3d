// GPU activation quantizer for the FP8-B128 GEMM: bf16 x [m, k] → E4M3 [m, k] + f32 scales per 1x128 block,
// written K-block-major (scales[b · scale_ld + r]), the layout cuBLASLt's VEC128_32F mode reads for x.
// Byte-exact twin of the CPU quantize_act_fp8_b128 (src/cpu/quantize_act.h) up to that scale permutation.
// Graph-capturable: no synchronisation, no NaN check (see the .cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/error.h"

namespace mxq::cuda {

// values: m·k bytes; scales: cdiv(k, 128) · scale_ld floats. Refuses negative shapes, scale_ld < m, a null
// pointer, or sizes past what the kernel indexes.
Status quantize_act_fp8_b128(const uint16_t* x, int64_t m, int64_t k, uint8_t* values, float* scales,
                             int64_t scale_ld, cudaStream_t stream);

}  // namespace mxq::cuda
