// Activation quantizers (CPU twins of src/cuda/quantize/quantize_act.h). quantize_act_fp8_b128: activations
// bf16 [m, k] → FP8-B128 activation planes, one f32 scale per 1x128 block of a row (the per-token-group
// quantization that block-scaled FP8 GEMMs take for x). CPU twin of
// src/cuda/quantize/quantize_act_fp8_b128.cu.
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

// The W8A8 mode's MXFP8 activation quantize-dequantize (twin of src/cuda/quantize/fake_quant_mxfp8.cu): each
// 1x32 block of a row of x [m, k] is quantized by the MXFP8 weight quantizer (rule ceil) and dequantized to
// f32 (element · 2^(b-127)) and rounded to bf16 (RNE); a block holding an Inf or NaN gives 32 NaN (E8M0 255).
// bf16 bits in and out. Refuses k % 32 != 0 and negative shapes. y may be x.
Status fake_quant_mxfp8(const uint16_t* x, int64_t m, int64_t k, uint16_t* y);

}  // namespace mxq
