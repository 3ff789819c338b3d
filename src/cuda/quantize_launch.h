// Unchecked quantize launchers (nvcc side); quantize.cpp checks the arguments and reads back `bad_block`.
// Every kernel reads bf16 [rows, cols] row-major and writes canonical planes (spec/formats.md). A block that
// holds NaN or Inf lowers *bad_block (initialised to ~0) to its index: blocks are numbered row-major over the
// scales plane.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

cudaError_t launch_quantize_mxfp8_ceil(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                                       uint8_t* scales, unsigned long long* bad_block, cudaStream_t stream);
cudaError_t launch_quantize_mxfp4_ct(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                                     uint8_t* scales, unsigned long long* bad_block, cudaStream_t stream);
cudaError_t launch_quantize_fp8_b128(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                                     float* scales, unsigned long long* bad_block, cudaStream_t stream);

// The generic launcher (quantize_src.cu): any source dtype, any MXFP8 scale rule. Codes, since this side
// cannot include format/ (fmt): QuantRule follows mxq::ScaleRule's order (static_assert in quantize.cpp).
enum class QuantFormat : int { kMXFP8, kMXFP4, kFP8_B128 };
enum class QuantRule : int { kCeil, kOcp, kFloor, kCt };
enum class QuantSrc : int { kBF16, kF16, kF32 };
// x: [rows, cols] of `src` elements, row-major; scales: E8M0 bytes (MX) or f32 (FP8-B128). MXFP4 takes rule
// kCt only and FP8-B128 ignores the rule (quantize.cpp checks both).
cudaError_t launch_quantize_src(QuantFormat format, QuantRule rule, QuantSrc src, const void* x, int64_t rows,
                                int64_t cols, uint8_t* values, void* scales, unsigned long long* bad_block,
                                cudaStream_t stream);

}  // namespace mxq::cuda
