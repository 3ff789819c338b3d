// GPU block quantizers, byte-exact twins of the CPU quantize (spec/formats.md): bf16 [rows, cols] row-major
// device input → canonical planes on the device. MXFP8 rule `ceil`, MXFP4 rule `ct`, FP8-B128 (f32 scales).
// Synchronises `stream` to read back the NaN/Inf check; a block holding NaN or Inf is refused naming `name`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string_view>

#include "base/error.h"
#include "format/formats.h"

namespace mxq::cuda {

// values: values_bytes(format, rows, cols) bytes; scales: scales_bytes(format, rows, cols) bytes (E8M0 bytes
// for MX, f32 for FP8-B128). Refuses another format, MX cols not a multiple of 32, or a null pointer.
Status quantize_bf16(Format format, const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                     void* scales, std::string_view name, cudaStream_t stream);

}  // namespace mxq::cuda
