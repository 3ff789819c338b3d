#include "bench/cuda/gemm_fp8_b128_sm90.h"

#include <climits>

#include "cuda/common/check.h"

namespace mxq::cuda {
namespace {

Status check_shape(const Fp8B128Weights& w) {
  if (!fp8_b128_sm90_takes(w.n, w.k))
    return fail("fp8-b128 sm_90a GEMM: weight shape [{}, {}] (expected N and K positive multiples of 128)",
                w.n, w.k);
  return {};
}

}  // namespace

bool fp8_b128_sm90_takes(int64_t n, int64_t k) {
  return n >= 128 && k >= 128 && n % 128 == 0 && k % 128 == 0 && n <= INT_MAX && k <= INT_MAX &&
         n * k <= (int64_t{1} << 40);
}

Status gemm_fp8_b128_sm90(const uint8_t* xq, const float* xs, int64_t xs_ld, int64_t m,
                          const Fp8B128Weights& w, uint16_t* y, cudaStream_t stream, Fp8GemmTile tile) {
  if (Status st = check_shape(w); !st) return st;
  if (m < 1 || m > INT_MAX) return fail("fp8-b128 sm_90a GEMM: m = {} (expected 1..{})", m, INT_MAX);
  if (xs_ld < m || xs_ld % 4 != 0 || xs_ld > INT_MAX)
    return fail(
        "fp8-b128 sm_90a GEMM: x scale leading dimension {} for m = {} (expected >= m, a multiple of 4)",
        xs_ld, m);
  if (!xq || !xs || !w.values || !w.scales || !y) return fail("fp8-b128 sm_90a GEMM: null device pointer");
  const cudaError_t e = launch_gemm_fp8_b128_sm90(xq, xs, xs_ld, static_cast<int>(m), w.values, w.scales,
                                                  fp8_b128_scale_strides(w.n, w.k).row, static_cast<int>(w.n),
                                                  static_cast<int>(w.k), y, tile, stream);
  if (e == cudaErrorNoKernelImageForDevice)
    return fail("fp8-b128 sm_90a GEMM: the device is not compute capability 9.0 (the kernel is sm_90a only)");
  MXQ_CUDA_CHECK(e);
  return {};
}

Status linear_fp8_b128_sm90(Fp8B128Gemm& g, const uint16_t* x, int64_t m, const Fp8B128Weights& w,
                            uint16_t* y, cudaStream_t stream, Fp8GemmTile tile) {
  if (Status st = check_shape(w); !st) return st;
  if (m < 1) return fail("fp8-b128 sm_90a GEMM: m = {} (expected >= 1)", m);
  if (!x) return fail("fp8-b128 sm_90a GEMM: null device pointer");
  auto q = g.quantize(x, m, w.n, w.k, stream);
  if (!q) return tl::unexpected(q.error());
  return gemm_fp8_b128_sm90(q->values, q->scales, q->scale_ld, m, w, y, stream, tile);
}

}  // namespace mxq::cuda
