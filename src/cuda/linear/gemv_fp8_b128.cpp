#include "cuda/linear/gemv_fp8_b128.h"

#include <climits>

#include "cuda/linear/gemv_fp8_b128_launch.h"

namespace mxq::cuda {

Status gemv_fp8_b128(const uint16_t* x, int64_t m, const Fp8B128Weights& w, uint16_t* y,
                     cudaStream_t stream) {
  if (m < 1 || m > kGemvFp8B128MaxM)
    return fail("gemv_fp8-b128: m = {} (expected 1..{})", m, kGemvFp8B128MaxM);
  // note: 16-byte row loads need K % 16 == 0; INT_MAX / 2 keeps every in-kernel element index in int.
  if (w.n < 1 || w.k < 16 || w.k % 16 != 0 || w.n > INT_MAX || w.k > INT_MAX / 2)
    return fail("gemv_fp8-b128: weight shape [{}, {}] (expected N >= 1, K a positive multiple of 16)", w.n,
                w.k);
  if (!x || !y || !w.values || !w.scales) return fail("gemv_fp8-b128: null device pointer");
  const ScaleStrides s = fp8_b128_scale_strides(w.n, w.k);
  MXQ_CUDA_CHECK(launch_gemv_fp8_b128(x, static_cast<int>(m), w.values, w.scales, s.row, s.col, y,
                                      static_cast<int>(w.n), static_cast<int>(w.k), stream));
  return {};
}

}  // namespace mxq::cuda
