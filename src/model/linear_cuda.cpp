#include "model/linear_cuda.h"

#include <algorithm>

#include "cuda/check.h"
#include "cuda/gemv_mx.h"

namespace mxq::cuda {

Result<CudaLinear> cuda_linear(const QTensor& t, int64_t expert) {
  const size_t rank = t.shape.size();
  if (rank != (expert < 0 ? 2u : 3u))
    return fail("{}: rank {} tensor used as {} linear", t.name, rank, expert < 0 ? "a dense" : "an expert");
  const int64_t n = t.shape[rank - 2], k = t.shape[rank - 1];
  const int64_t e = std::max<int64_t>(expert, 0);
  if (expert >= 0 && expert >= t.shape[0]) return fail("{}: expert {} of {}", t.name, expert, t.shape[0]);
  CudaLinear w{t.format, nullptr, nullptr, n, k, &t.name};
  switch (t.format) {
    case Format::kBF16:
      w.values = t.values.data() + e * n * k * 2;
      return w;
    case Format::kMXFP8:
    case Format::kMXFP4: {
      // note: the GEMV layout permutes bytes inside a row only, so expert e's rows start at e·n·row_bytes.
      const int64_t row_bytes = t.format == Format::kMXFP8 ? k : k / 2;
      if (static_cast<int64_t>(t.values.size()) != t.layout.values.canonical.bytes())
        return fail("{}: native values plane of {} bytes, expected {} (row-contiguous)", t.name,
                    t.values.size(), t.layout.values.canonical.bytes());
      w.values = t.values.data() + e * n * row_bytes;
      w.scales = t.scales.data() + e * n * (k / 32);
      return w;
    }
    default:
      return fail("{}: format {} has no CUDA linear kernel in this build (bf16, mxfp8, mxfp4)", t.name,
                  traits(t.format).name);
  }
}

Status linear(const LinearContext& ctx, const CudaLinear& w, const uint16_t* x, int64_t m, uint16_t* y,
              int64_t ldy) {
  if (m <= 0) return {};
  if (ldy < w.n) return fail("linear {}: output stride {} < n = {}", *w.name, ldy, w.n);
  if (w.format == Format::kBF16) {
    // note: row-major y[m, n] = x[m, k] · W[n, k]^T is column-major y^T[n, m] = W^T-view · x^T-view.
    const float one = 1.0f, zero = 0.0f;
    MXQ_CUDA_CHECK(cublasGemmEx(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.n),
                                static_cast<int>(m), static_cast<int>(w.k), &one, w.values, CUDA_R_16BF,
                                static_cast<int>(w.k), x, CUDA_R_16BF, static_cast<int>(w.k), &zero, y,
                                CUDA_R_16BF, static_cast<int>(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return {};
  }
  const MxGemvWeights gw{w.format, w.values, w.scales, w.n, w.k};
  for (int64_t r = 0; r < m; r += kGemvMaxM) {
    const int64_t mm = std::min(kGemvMaxM, m - r);
    uint16_t* dst = ldy == w.n ? y + r * ldy : ctx.scratch;
    auto st = w.format == Format::kMXFP8 ? gemv_mxfp8(x + r * w.k, mm, gw, dst, ctx.stream)
                                         : gemv_mxfp4(x + r * w.k, mm, gw, dst, ctx.stream);
    if (!st) return fail_in(fmt::format("linear {}", *w.name), st.error());
    if (ldy != w.n)
      MXQ_CUDA_CHECK(cudaMemcpy2DAsync(y + r * ldy, ldy * 2, dst, w.n * 2, w.n * 2, mm,
                                       cudaMemcpyDeviceToDevice, ctx.stream));
  }
  return {};
}

Status linear_f32_out(const LinearContext& ctx, const CudaLinear& w, const uint16_t* x, int64_t m, float* y) {
  if (m <= 0) return {};
  if (w.format != Format::kBF16)
    return fail("linear {}: f32 output needs BF16 weights, got {}", *w.name, traits(w.format).name);
  const float one = 1.0f, zero = 0.0f;
  MXQ_CUDA_CHECK(cublasGemmEx(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.n),
                              static_cast<int>(m), static_cast<int>(w.k), &one, w.values, CUDA_R_16BF,
                              static_cast<int>(w.k), x, CUDA_R_16BF, static_cast<int>(w.k), &zero, y,
                              CUDA_R_32F, static_cast<int>(w.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return {};
}

}  // namespace mxq::cuda
