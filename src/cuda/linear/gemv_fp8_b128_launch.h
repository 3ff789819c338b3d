// Unchecked FP8-B128 GEMV launcher (nvcc side); gemv_fp8_b128.cpp checks the arguments. Contract:
// gemv_fp8_b128.h. The weight scale of row block nb, column block kb is scales[nb · s_row + kb · s_col].
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/linear/gemv_mx_launch.h"

namespace mxq::cuda {

cudaError_t launch_gemv_fp8_b128(const uint16_t* x, int m, const uint8_t* values, const float* scales,
                                 int64_t s_row, int64_t s_col, uint16_t* y, int n, int k,
                                 cudaStream_t stream);
// Every part of p (gemv_mx_launch.h) in one launch; part q's weight scales at p.scales[q] (f32), strides
// p.s_row[q], p.s_col[q].
cudaError_t launch_gemv_parts_fp8_b128(const uint16_t* x, int m, const GemvParts& p, int k,
                                       cudaStream_t stream);

}  // namespace mxq::cuda
