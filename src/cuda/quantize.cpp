#include "cuda/quantize.h"

#include "cuda/check.h"
#include "cuda/quantize_launch.h"

namespace mxq::cuda {

Status quantize_bf16(Format format, const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                     void* scales, std::string_view name, cudaStream_t stream) {
  if (format != Format::kMXFP8 && format != Format::kMXFP4 && format != Format::kFP8_B128)
    return fail("{}: GPU quantize to {} (expected mxfp8, mxfp4 or fp8-b128)", name, traits(format).name);
  if (rows < 0 || cols < 0) return fail("{}: shape [{}, {}] (expected non-negative)", name, rows, cols);
  const FormatTraits& t = traits(format);
  if (cols % t.block_cols != 0 && t.block_rows == 1)
    return fail("{}: K = {} (expected a multiple of {} for {})", name, cols, t.block_cols, t.name);
  if (rows == 0 || cols == 0) return {};
  if (!x || !values || !scales) return fail("{}: null device pointer", name);

  auto bad = DeviceBuffer::alloc(sizeof(unsigned long long));
  if (!bad) return fail_in(name, bad.error());
  auto* bad_block = bad->as<unsigned long long>();
  MXQ_CUDA_CHECK(cudaMemsetAsync(bad_block, 0xFF, sizeof(unsigned long long), stream));
  if (format == Format::kMXFP8)
    MXQ_CUDA_CHECK(
        launch_quantize_mxfp8_ceil(x, rows, cols, values, static_cast<uint8_t*>(scales), bad_block, stream));
  else if (format == Format::kMXFP4)
    MXQ_CUDA_CHECK(
        launch_quantize_mxfp4_ct(x, rows, cols, values, static_cast<uint8_t*>(scales), bad_block, stream));
  else
    MXQ_CUDA_CHECK(
        launch_quantize_fp8_b128(x, rows, cols, values, static_cast<float*>(scales), bad_block, stream));
  unsigned long long first_bad = 0;
  MXQ_CUDA_CHECK(cudaMemcpyAsync(&first_bad, bad_block, sizeof(first_bad), cudaMemcpyDeviceToHost, stream));
  MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (first_bad != ~0ull) {
    const auto shape = scales_shape(format, rows, cols);
    const int64_t idx = static_cast<int64_t>(first_bad);
    return fail("{}: {} block {} (block row {}, block col {}) holds NaN or Inf (expected finite values)",
                name, t.name, idx, idx / shape[1], idx % shape[1]);
  }
  return {};
}

}  // namespace mxq::cuda
