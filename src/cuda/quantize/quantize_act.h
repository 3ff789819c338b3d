// GPU activation quantizers. quantize_act_fp8_b128, for the FP8-B128 GEMM: bf16 x [m, k] → E4M3 [m, k] + f32
// scales per 1x128 block, written K-block-major (scales[b · scale_ld + r]), the layout cuBLASLt's VEC128_32F
// mode reads for x. Byte-exact twin of the CPU quantize_act_fp8_b128 (src/cpu/quantize_act.h) up to that
// scale permutation. Graph-capturable: no synchronisation, no NaN check (see the .cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/error.h"

namespace mxq::cuda {

// values: m·k bytes; scales: cdiv(k, 128) · scale_ld floats. Refuses negative shapes, scale_ld < m, a null
// pointer, or sizes past what the kernel indexes.
Status quantize_act_fp8_b128(const uint16_t* x, int64_t m, int64_t k, uint8_t* values, float* scales,
                             int64_t scale_ld, cudaStream_t stream);

// The W8A8 mode's MXFP8 activation quantize-dequantize (fake_quant_mxfp8.cu): bf16 x [m, k] → bf16 y [m, k],
// each 1x32 block of a row quantized to MXFP8 (rule ceil) and dequantized; a block with Inf / NaN gives 32
// NaN. Bitwise twin of the CPU fake_quant_mxfp8 (src/cpu/quantize_act.h). Graph-capturable. Refuses k % 32
// != 0, negative shapes, a null pointer, y overlapping x, or sizes past one launch.
Status fake_quant_mxfp8(const uint16_t* x, int64_t m, int64_t k, uint16_t* y, cudaStream_t stream);

}  // namespace mxq::cuda
