// quantize_act: activations bf16 [m, k] → FP8-B128 activation planes, one f32 scale per 1x128 block of a row
// (the per-token-group quantization that block-scaled FP8 GEMMs take for x). CPU twin of
// src/cuda/quantize_act_fp8_b128.cu.
// Rule (spec/formats.md FP8-B128, applied to 1-row blocks): amax' = max(amax, 1e-4); elements
// e4m3(x · RN(448 / amax')); scale = amax' / 448; a short final block counts only its real elements.
// note: DeepSeek's Triton act_quant divides x / (amax'/448) instead; mxq keeps one rule for weights and
// activations (the CPU FP8-B128 quantizer's), which can differ from it by one E4M3 step at rounding ties.
#pragma once

#include <cstdint>

#include "base/error.h"

namespace mxq {

// x: bf16 bits [m, k] row-major; values: E4M3 [m, k] row-major; scales: f32 [m, cdiv(k, 128)] row-major
// (canonical; the CUDA kernel writes the same numbers K-block-major for cuBLASLt). Refuses NaN/Inf in a
// block (naming its row and block) and negative shapes.
Status quantize_act_fp8_b128(const uint16_t* x, int64_t m, int64_t k, uint8_t* values, float* scales);

}  // namespace mxq
