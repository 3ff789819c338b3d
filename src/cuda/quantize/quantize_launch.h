// Unchecked quantize launchers (nvcc side); quantize.cpp checks the arguments and reads back `bad_block`.
// Every kernel reads bf16 [rows, cols] row-major and writes canonical planes (spec/formats.md). A block that
// holds NaN or Inf lowers *bad_block (initialised to ~0) to its index: blocks are numbered row-major over the
// scales plane. The three bf16 launchers take the programmatic-dependent-launch path (cuda/common/pdl.h:
// every block waits for the previous kernel of the stream before it reads x) and a launch shape `QuantLaunch`
// whose defaults are the measured best (bench/RESULTS.md, GPU quantize); the bench and the GPU tests try the
// others.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

// unroll: 16-byte loads in flight per thread before the first use (MX kernels: 2, 4 or 8; 0 = the measured
// default: MXFP8 2, MXFP4 2 below 2^25 elements and 4 from there).
// ctas_per_sm: FP8-B128 only; 0 = one CTA per 128x128 tile, 1..4 = a grid of ctas_per_sm x SMs CTAs striding
// over the tiles with the next tile's loads issued before the current tile's reduction; -1 = the measured
// default: 3 while the tiles fit one round of it (<= 3 x SMs tiles), else 0 (bench/RESULTS.md, GPU quantize).
// Another value is refused (cudaErrorInvalidValue).
struct QuantLaunch {
  int unroll = 0;
  int ctas_per_sm = -1;
};

cudaError_t launch_quantize_mxfp8_ceil(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                                       uint8_t* scales, unsigned long long* bad_block, cudaStream_t stream,
                                       QuantLaunch shape = {});
cudaError_t launch_quantize_mxfp4_ct(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                                     uint8_t* scales, unsigned long long* bad_block, cudaStream_t stream,
                                     QuantLaunch shape = {});
cudaError_t launch_quantize_fp8_b128(const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                                     float* scales, unsigned long long* bad_block, cudaStream_t stream,
                                     QuantLaunch shape = {});

// A plain copy kernel for the bench's same-size reference: reads `bytes` from src and writes them to dst
// (16-byte aligned, bytes a multiple of 16), four 16-byte loads in flight per thread, PDL as above.
cudaError_t launch_copy16(const void* src, void* dst, int64_t bytes, cudaStream_t stream);

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
