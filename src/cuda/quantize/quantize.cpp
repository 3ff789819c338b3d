#include "cuda/quantize/quantize.h"

#include "cuda/common/check.h"
#include "cuda/quantize/quantize_launch.h"

namespace mxq::cuda {
namespace {

static_assert(static_cast<int>(QuantRule::kCeil) == static_cast<int>(ScaleRule::kCeil) &&
                  static_cast<int>(QuantRule::kOcp) == static_cast<int>(ScaleRule::kOcp) &&
                  static_cast<int>(QuantRule::kFloor) == static_cast<int>(ScaleRule::kFloor) &&
                  static_cast<int>(QuantRule::kCt) == static_cast<int>(ScaleRule::kCt),
              "QuantRule codes follow ScaleRule");

// Shape checks, the launch, and the NaN/Inf read-back shared by both entry points.
template <class Launch>
Status checked_quantize(Format format, int64_t rows, int64_t cols, const void* x, uint8_t* values,
                        void* scales, std::string_view name, cudaStream_t stream, Launch&& launch) {
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
  MXQ_CUDA_CHECK(launch(bad_block));
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

}  // namespace

Status quantize_bf16(Format format, const uint16_t* x, int64_t rows, int64_t cols, uint8_t* values,
                     void* scales, std::string_view name, cudaStream_t stream) {
  return checked_quantize(format, rows, cols, x, values, scales, name, stream, [&](unsigned long long* bad) {
    if (format == Format::kMXFP8)
      return launch_quantize_mxfp8_ceil(x, rows, cols, values, static_cast<uint8_t*>(scales), bad, stream);
    if (format == Format::kMXFP4)
      return launch_quantize_mxfp4_ct(x, rows, cols, values, static_cast<uint8_t*>(scales), bad, stream);
    return launch_quantize_fp8_b128(x, rows, cols, values, static_cast<float*>(scales), bad, stream);
  });
}

Status quantize(Format format, ScaleRule rule, Format src, const void* x, int64_t rows, int64_t cols,
                uint8_t* values, void* scales, std::string_view name, cudaStream_t stream) {
  if (src != Format::kBF16 && src != Format::kF16 && src != Format::kF32)
    return fail("{}: GPU quantize from {} (expected a bf16, f16 or f32 source)", name, traits(src).name);
  if (format == Format::kMXFP4 && rule != ScaleRule::kCt)
    return fail("{}: mxfp4 supports scale rule ct only (got {})", name, scale_rule_name(rule));
  // note: bf16 with the format's default rule keeps the measured kernels of quantize_bf16.
  if (src == Format::kBF16 && (format == Format::kFP8_B128 || rule == default_scale_rule(format)))
    return quantize_bf16(format, static_cast<const uint16_t*>(x), rows, cols, values, scales, name, stream);
  const QuantFormat f = format == Format::kMXFP8   ? QuantFormat::kMXFP8
                        : format == Format::kMXFP4 ? QuantFormat::kMXFP4
                                                   : QuantFormat::kFP8_B128;
  const QuantSrc s = src == Format::kBF16  ? QuantSrc::kBF16
                     : src == Format::kF16 ? QuantSrc::kF16
                                           : QuantSrc::kF32;
  return checked_quantize(format, rows, cols, x, values, scales, name, stream, [&](unsigned long long* bad) {
    return launch_quantize_src(f, static_cast<QuantRule>(rule), s, x, rows, cols, values, scales, bad,
                               stream);
  });
}

}  // namespace mxq::cuda
