#include "cuda/linear/gemv_mx.h"

#include <atomic>
#include <climits>

#include "cuda/common/check.h"
#include "cuda/linear/gemv_mx_launch.h"

namespace mxq::cuda {
namespace {

std::atomic<GemvKernel> g_kernel{GemvKernel::kAuto};
GemvTrace g_trace;

using Launcher = cudaError_t (*)(const uint16_t*, int, const uint8_t*, const uint8_t*, uint16_t*, int, int,
                                 cudaStream_t);

Status checked_gemv(Format expected, Launcher launch, const uint16_t* x, int64_t m, const MxGemvWeights& w,
                    uint16_t* y, cudaStream_t stream) {
  const std::string_view name = traits(expected).name;
  if (w.format != expected)
    return fail("gemv_{}: weights are {} (expected {})", name, traits(w.format).name, name);
  if (m < 1 || m > kGemvMaxM) return fail("gemv_{}: m = {} (expected 1..{})", name, m, kGemvMaxM);
  // note: INT_MAX / 2 keeps every in-kernel element index of a row in int.
  if (w.n < 1 || w.k < 32 || w.k % 32 != 0 || w.n > INT_MAX || w.k > INT_MAX / 2)
    return fail("gemv_{}: weight shape [{}, {}] (expected N >= 1, K a positive multiple of 32)", name, w.n,
                w.k);
  if (!x || !y || !w.values || !w.scales) return fail("gemv_{}: null device pointer", name);
  MXQ_CUDA_CHECK(launch(x, static_cast<int>(m), w.values, w.scales, y, static_cast<int>(w.n),
                        static_cast<int>(w.k), stream));
  return {};
}

}  // namespace

const char* gemv_kernel_name(GemvKernel k) {
  switch (k) {
    case GemvKernel::kAuto:
      return "auto";
    case GemvKernel::kRegister:
      return "register";
    case GemvKernel::kRegisterStep:
      return "register_step";
    case GemvKernel::kPersist:
      return "persist";
    case GemvKernel::kPersistStep:
      return "persist_step";
    case GemvKernel::kRing:
      return "ring";
    case GemvKernel::kRingPersist:
      return "ring_persist";
    case GemvKernel::kRingDeep:
      return "ring_deep";
  }
  return "?";
}
void set_gemv_kernel(GemvKernel k) { g_kernel.store(k); }
GemvKernel gemv_kernel() { return g_kernel.load(std::memory_order_relaxed); }

// note: study only; set and read from the benchmark's one host thread.
void set_gemv_trace(const GemvTrace& t) { g_trace = t; }
GemvTrace gemv_trace() { return g_trace; }

Status gemv_mxfp8(const uint16_t* x, int64_t m, const MxGemvWeights& w, uint16_t* y, cudaStream_t stream) {
  return checked_gemv(Format::kMXFP8, launch_gemv_mxfp8, x, m, w, y, stream);
}

Status gemv_mxfp4(const uint16_t* x, int64_t m, const MxGemvWeights& w, uint16_t* y, cudaStream_t stream) {
  return checked_gemv(Format::kMXFP4, launch_gemv_mxfp4, x, m, w, y, stream);
}

}  // namespace mxq::cuda
