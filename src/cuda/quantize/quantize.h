// GPU block quantizers, byte-exact twins of the CPU quantize (spec/formats.md): [rows, cols] row-major device
// input → canonical planes on the device. quantize_bf16: bf16 input, MXFP8 rule `ceil`, MXFP4 rule `ct`,
// FP8-B128 (f32 scales); quantize: bf16, f16 or f32 input and any MXFP8 scale rule (quantize_src.cu).
// Synchronises `stream` to read back the NaN/Inf check; a block holding NaN or Inf is refused naming `name`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string_view>

#include "base/error.h"
#include "format/formats.h"
#include "format/quantize.h"

namespace mxq::cuda {

// values: values_bytes(format, rows, cols) bytes; scales: scales_bytes(format, rows, cols) bytes (E8M0 bytes
// for MX, f32 for FP8-B128). Refuses another format, MX cols not a multiple of 32, or a null pointer.
Status quantize_bf16(Format format, const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                     void* scales, std::string_view name, cudaStream_t stream);

// As the CPU mxq::quantize: x holds `src` elements (kBF16, kF16 or kF32); `rule` picks the MXFP8 scale rule,
// MXFP4 takes ct only and FP8-B128 ignores it. Refuses other sources or rules by name, and as quantize_bf16.
Status quantize(Format format, ScaleRule rule, Format src, const void* x, int64_t rows, int64_t cols,
                uint8_t* values, void* scales, std::string_view name, cudaStream_t stream);

}  // namespace mxq::cuda
