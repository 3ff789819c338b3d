// The engine's one entry to the linear layers until cuda/linear.h (branch fp8lt) lands and replaces it:
// y[m, n] = x[m, k] · W[n, k]^T, x and y bf16, W a live QTensor of a CUDA store (or one expert of a stacked
// [E, n, k] one). BF16 → cuBLAS (any m); MXFP8 / MXFP4 → cuda/gemv_mx.h in chunks of 16 rows (the weights
// are read once per chunk: correct for prefill, fast for decode only). FP8-B128 is refused at load.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/error.h"
#include "model/weight_store.h"

namespace mxq::cuda {

struct CudaLinear {
  Format format = Format::kBF16;
  const uint8_t* values = nullptr;  // native plane: row-major bf16, or the GEMV layout
  const uint8_t* scales = nullptr;  // canonical [n, k/32] E8M0
  int64_t n = 0, k = 0;
  const std::string* name = nullptr;
};

// Views one expert `expert` of a stacked [E, n, k] tensor (-1: the tensor is [n, k]). Refuses a format the
// engine has no kernel for and a native values plane that is not row-contiguous.
Result<CudaLinear> cuda_linear(const QTensor& t, int64_t expert = -1);

struct LinearContext {
  cublasHandle_t cublas;
  cudaStream_t stream;
  uint16_t* scratch;  // bf16 [16, max n]: a GEMV chunk before its strided copy (ldy != n)
};

// Writes y rows at a stride of ldy elements (ldy >= n). Enqueued on ctx.stream, graph-capturable.
Status linear(const LinearContext& ctx, const CudaLinear& w, const uint16_t* x, int64_t m, uint16_t* y,
              int64_t ldy);
// y f32 [m, n] (logits, router logits); BF16 weights only.
Status linear_f32_out(const LinearContext& ctx, const CudaLinear& w, const uint16_t* x, int64_t m, float* y);

}  // namespace mxq::cuda
