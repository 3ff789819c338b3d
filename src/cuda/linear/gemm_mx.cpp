#include "cuda/linear/gemm_mx.h"

#include <climits>

#include "cuda/common/check.h"
#include "cuda/linear/gemm_mx_launch.h"

namespace mxq::cuda {
namespace {

using Launcher = cudaError_t (*)(const uint16_t*, int, const uint8_t*, const uint8_t*, uint16_t*, int, int,
                                 GemmPath, float*, int64_t, cudaStream_t);

Status checked_gemm(Format expected, Launcher launch, const uint16_t* x, int64_t m, const MxGemvWeights& w,
                    uint16_t* y, cudaStream_t stream, std::span<float> splitk) {
  const std::string_view name = traits(expected).name;
  if (w.format != expected)
    return fail("gemm_{}: weights are {} (expected {})", name, traits(w.format).name, name);
  if (m < 1 || m > INT_MAX) return fail("gemm_{}: m = {} (expected 1..{})", name, m, INT_MAX);
  // note: INT_MAX / 2 keeps every in-kernel element index of a row in int.
  if (w.n < 1 || w.k < 32 || w.k % 32 != 0 || w.n > INT_MAX || w.k > INT_MAX / 2)
    return fail("gemm_{}: weight shape [{}, {}] (expected N >= 1, K a positive multiple of 32)", name, w.n,
                w.k);
  if (!x || !y || !w.values || !w.scales) return fail("gemm_{}: null device pointer", name);
  // note: x is read by 16-byte copies (TMA tensor map on sm_90a, cp.async elsewhere).
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0) return fail("gemm_{}: x is not 16-byte aligned", name);
  // note: the sm_90a kernel copies the values plane by TMA (a tensor map needs a 16-byte aligned base).
  if (reinterpret_cast<uintptr_t>(w.values) % 16 != 0)
    return fail("gemm_{}: weight values are not 16-byte aligned", name);
  if (reinterpret_cast<uintptr_t>(splitk.data()) % 16 != 0)
    return fail("gemm_{}: split-K scratch is not 16-byte aligned", name);
  MXQ_CUDA_CHECK(launch(x, static_cast<int>(m), w.values, w.scales, y, static_cast<int>(w.n),
                        static_cast<int>(w.k), GemmPath::kAuto, splitk.data(),
                        static_cast<int64_t>(splitk.size()), stream));
  return {};
}

}  // namespace

Status gemm_mxfp8(const uint16_t* x, int64_t m, const MxGemvWeights& w, uint16_t* y, cudaStream_t stream,
                  std::span<float> splitk) {
  return checked_gemm(Format::kMXFP8, launch_gemm_mxfp8, x, m, w, y, stream, splitk);
}

Status gemm_mxfp4(const uint16_t* x, int64_t m, const MxGemvWeights& w, uint16_t* y, cudaStream_t stream,
                  std::span<float> splitk) {
  return checked_gemm(Format::kMXFP4, launch_gemm_mxfp4, x, m, w, y, stream, splitk);
}

}  // namespace mxq::cuda
