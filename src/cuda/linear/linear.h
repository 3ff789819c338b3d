// The one closed dispatch table of CUDA linear kernels: y[M,N] = x[M,K] · W[N,K]^T, x and y bf16 on the
// device, W in its format and native layout. Keyed by (format, arch, M range):
//   format    arch          M       kernel
//   bf16      sm_90a, sm_80 1..     cuBLAS GEMM (bf16 in/out, f32 accumulate)
//   mxfp8/4   sm_90a        1..20   gemv_mx (weight-only, gemv_mx.h)
//   mxfp8/4   sm_90a        21..    gemm_mx (wgmma, split-K where tiles leave SMs idle; same native layout)
//   mxfp8/4   sm_80         1..32   gemv_mx
//   mxfp8/4   sm_80         33..    gemm_mx (mma.sync)
//   fp8-b128  sm_90a        1..8    gemv_fp8_b128 (weight-only)
//   fp8-b128  sm_80         1..32   gemv_fp8_b128
//   fp8-b128  sm_90a        9..     cuBLASLt block-scaled FP8 (activations quantized per 1x128)
// Anything else is a missing entry: check_linear_supported refuses it at load naming format, arch and
// tensor; linear() refuses it the same way if asked anyway.
// W8A8 mode (LinearWeights::act = MXFP8, for MXFP8 weights, and W4A8 for MXFP4 ones): x is first quantized to
// MXFP8 per 1x32 block of a row and dequantized to bf16 (fake_quant_mxfp8, cuda/quantize/quantize_act.h),
// then the table's weight-only kernel for (format, arch, M) runs on it: "dequantize both, bf16 product, f32
// accumulate" (the products of two dequantized MX values are exact in the MMA). On Hopper this is a
// numerics mode (the activations of an MXFP8 W8A8 deployment, e.g. Blackwell's mm_mxfp8), not a speed-up:
// sm_90 has no MX block-scaled MMA.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "base/error.h"
#include "cuda/linear/gemm_fp8_b128_cublaslt.h"
#include "format/formats.h"
#include "layout/layout.h"
#include "layout/probe.h"

namespace mxq::cuda {

enum class Arch : uint8_t { kSm80, kSm90a };
std::string_view arch_name(Arch a);  // "sm_80", "sm_90a"
// The table's arch for a device: compute capability 9.0 → sm_90a, 8.x → sm_80; others are refused.
Result<Arch> device_arch(int device);

// One layer's weights on the device in the native layout linear_prepare wrote; scales is null for bf16.
struct LinearWeights {
  Format format = Format::kBF16;
  const uint8_t* values = nullptr;
  const uint8_t* scales = nullptr;
  int64_t n = 0, k = 0;
  // Activations: kBF16 (x as given, weight-only) or kMXFP8 (the W8A8 mode above; MX weights only).
  Format act = Format::kBF16;
};

// The native view of one [n, k] matrix of a tensor whose planes linear_prepare wrote: the tensor itself
// (shape [n, k], expert < 0) or expert `expert` of a stacked [E, n, k] one. The plane sizes must be the
// native sizes for the shape; refusals name the tensor.
Result<LinearWeights> linear_weights(std::string_view tensor, Format f, std::span<const int64_t> shape,
                                     std::span<const uint8_t> values, std::span<const uint8_t> scales,
                                     int64_t expert = -1);

// Load-time check that every M in 1..max_m has a kernel for this format, arch and [n, k]; the refusal
// names the tensor, the format, the arch and the M range or shape rule that fails.
Status check_linear_supported(Format f, Arch arch, std::string_view tensor, int64_t n, int64_t k,
                              int64_t max_m);

// canonical planes → the native planes the table's kernels read for (format, arch), host memory; a byte
// permutation plus zero padding, learned by probe_layout (layout name: linear_layout_name). Formats without
// a kernel are refused by name.
Result<HostPlanes> linear_prepare(Format f, Arch arch, const TensorGeometry& g, const HostPlanes& canonical);
std::string_view linear_layout_name(Format f);

// Per-stream state of the table's library kernels: cuBLAS and cuBLASLt handles, workspaces, scratch.
class LinearContext {
 public:
  static Result<std::unique_ptr<LinearContext>> create(Arch arch);
  ~LinearContext();
  LinearContext(const LinearContext&) = delete;
  LinearContext& operator=(const LinearContext&) = delete;
  Arch arch() const { return arch_; }
  // Sizes scratch for M <= max_m, N <= max_n, K <= max_k so that later calls allocate nothing (CUDA graph
  // capture); act_quant: also the W8A8 mode's activations (max_m · max_k bf16).
  Status reserve(int64_t max_m, int64_t max_n, int64_t max_k, bool act_quant = false);
  // The W8A8 mode's activation buffer for x [m, k]: grown here unless `stream` is capturing a graph (then
  // too small is a named error: reserve() first).
  Result<uint16_t*> act_scratch(int64_t m, int64_t k, cudaStream_t stream);
  // The cuBLAS handle bound to `stream` with the context's own workspace.
  // note: cublasSetStream resets the workspace to cuBLAS's default pool, so the workspace is set again on
  // every change of stream (a pool allocation inside a graph capture would break the capture).
  Result<cublasHandle_t> blas(cudaStream_t stream);
  Fp8B128Gemm& fp8() { return *fp8_; }
  // f32 scratch for the MX GEMM's split-K partials (gemm_mx.h), kGemmSplitKFloats, allocated at create.
  std::span<float> splitk() { return {splitk_.as<float>(), splitk_.bytes() / sizeof(float)}; }

 private:
  LinearContext() = default;
  Arch arch_ = Arch::kSm90a;
  cublasHandle_t blas_ = nullptr;
  cudaStream_t blas_stream_ = nullptr;
  bool blas_bound_ = false;
  DeviceBuffer blas_workspace_;
  DeviceBuffer splitk_;
  DeviceBuffer act_;
  std::unique_ptr<Fp8B128Gemm> fp8_;
};

// Picks the kernel from the table and runs it; x [m, w.k], y [m, w.n], bf16 bits, device buffers (with
// w.act = MXFP8, x quantize-dequantized first into the context's act_scratch).
Status linear(LinearContext& ctx, const LinearWeights& w, const uint16_t* x, int64_t m, uint16_t* y,
              cudaStream_t stream);

// Several projections of the same x (q/k/v_proj, gate/up_proj): y[i] [m, w[i].n] = x · W_i^T, bitwise what
// linear() gives each part. Where the table's entry for m is a GEMV and the parts share format and k (at most
// 3 parts), one launch runs them all (gemv_mx_launch.h, GemvParts: the small parts' tiles fill the GPU
// together and the launch pays one tail); otherwise linear() per part. The parts share one act mode (x is
// quantize-dequantized once). Refusals name the part index.
inline constexpr int kLinearMaxParts = 3;
Status linear_parts(LinearContext& ctx, std::span<const LinearWeights> w, const uint16_t* x, int64_t m,
                    std::span<uint16_t* const> y, cudaStream_t stream);

// y f32 [m, w.n] (logits, MoE router logits): cuBLAS with f32 output, BF16 weights only (lm_head and
// mlp.gate keep their checkpoint dtype); any other format is refused by name.
Status linear_f32(LinearContext& ctx, const LinearWeights& w, const uint16_t* x, int64_t m, float* y,
                  cudaStream_t stream);

// The table entry's kernel name for (format, arch, m), or the named refusal: for tests and the benchmark.
Result<std::string_view> linear_kernel_name(Format f, Arch arch, int64_t m);

}  // namespace mxq::cuda
