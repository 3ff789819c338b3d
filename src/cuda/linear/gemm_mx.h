// Weight-only GEMM for prefill (M > 32 in the linear table, any M >= 1 accepted): y[M,N] = x[M,K] · W[N,K]^T
// with x, y bf16 and W in MXFP8 or MXFP4, read in the same native layout as the GEMV (prepare_gemv_values,
// gemv_layout.h), so one weight buffer serves both and the dispatch picks the kernel by M.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "base/error.h"
#include "cuda/linear/gemv_mx.h"

namespace mxq::cuda {

// x: [m, k] bf16 bits (16-byte aligned), y: [m, n] bf16 bits, both row-major device buffers; w as for the
// GEMV. f32 accumulation. Refuses by name a format other than the launcher's, m < 1, k not a multiple of 32,
// a null or misaligned pointer.
// splitk: device f32 scratch (16-byte aligned) for split-K on sm_90a: when the tiles leave SMs idle (small M,
// or small N), up to 8 splits of K each store an f32 partial tile there and a second launch sums them in
// split order (deterministic); splits are cut to what fits. Empty: no split. kGemmSplitKFloats is what
// LinearContext keeps.
inline constexpr int64_t kGemmSplitKFloats = int64_t{4} << 20;
Status gemm_mxfp8(const uint16_t* x, int64_t m, const MxGemvWeights& w, uint16_t* y, cudaStream_t stream,
                  std::span<float> splitk = {});
Status gemm_mxfp4(const uint16_t* x, int64_t m, const MxGemvWeights& w, uint16_t* y, cudaStream_t stream,
                  std::span<float> splitk = {});

}  // namespace mxq::cuda
