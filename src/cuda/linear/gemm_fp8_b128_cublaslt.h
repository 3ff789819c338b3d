// FP8-B128 linear for large M through cuBLASLt's block-scaled FP8 matmul (sm_90):
//   y[M,N] bf16 = x[M,K] bf16 · W[N,K]^T, W in FP8-B128 (E4M3 + f32 per 128x128 block).
// x is first quantized per 1x128 (quantize_act.h, E4M3 + f32); cuBLASLt then runs D = op(A)·op(B) with
// A = x_q (K x M column-major, ld K, transa = T, scale mode VEC128_32F), B = W (K x N column-major, ld K,
// transb = N, BLK128x128_32F), D = y (M x N in CUBLASLT_ORDER_ROW, ld N, bf16), f32 accumulate.
// What the H200 (CUDA 13.0, driver 580) showed, GPU test Fp8B128CublasLt.ScaleLayoutProbe
// (bench/history/RESULTS-log.md, "What the device showed about cuBLASLt block-scaled FP8"):
//   - the heuristic refuses block scale modes whose scale pointers are not set yet (INVALID_VALUE);
//   - M must be a multiple of 4 (M = 17, 18, 33: NOT_SUPPORTED): run() pads M to 4 (pad rows in scratch,
//     D into a scratch, then one copy of the M real rows), an extra pass over y only when M % 4 != 0;
//   - W's block scales are K-block-major with each row padded to a multiple of 4 floats: block (nb, kb) at
//     nb · roundup(cdiv(K,128), 4) + kb (unpadded rows are wrong when cdiv(K,128) % 4 != 0, MN-major is
//     wrong always); x's scales are M-major, block (r, kb) at kb · M_padded + r;
//   - W as A with x as B and a column-major N x M D (LtRoles::kWeightA, also y in place) gives the same
//     results; the library keeps the row-order form, which the tests and the benchmark ran (the two were
//     not timed against each other).
// Native weight layout (linear_prepare): values = the canonical row-major [N, K] plane as stored; scales =
// the canonical [cdiv(N,128), cdiv(K,128)] f32 plane with each row padded to 4 floats (zero pads) — a byte
// permutation plus padding. The same native weights serve the small-M GEMV.
// Shapes: K % 16 == 0 (FP8 leading dimensions of 16 bytes), N % 8 == 0 (16-byte bf16 rows of D);
// anything else is refused by name.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>

#include "base/error.h"
#include "cuda/common/check.h"

namespace mxq::cuda {

// One FP8-B128 linear layer's weights on the device, in the native layout above.
struct Fp8B128Weights {
  const uint8_t* values = nullptr;  // E4M3 [n, k] row-major
  const float* scales = nullptr;    // fp8_b128_scale_floats(n, k) floats
  int64_t n = 0, k = 0;
};

// Native weight-scale layout: float index of block (nb, kb), and the plane's size in floats.
int64_t fp8_b128_scale_offset(int64_t nb, int64_t kb, int64_t n, int64_t k);
int64_t fp8_b128_scale_floats(int64_t n, int64_t k);
// Strides of that layout (offset = nb · row + kb · col), as the GEMV takes them.
struct ScaleStrides {
  int64_t row, col;
};
ScaleStrides fp8_b128_scale_strides(int64_t n, int64_t k);
// Rows cuBLASLt runs for m rows of x (m rounded up to 4), which is also the leading dimension (floats) of
// the activation scales.
int64_t fp8_b128_padded_m(int64_t m);

// Refuses, by name, a weight shape cuBLASLt cannot take (see the top of this file).
Status check_fp8_b128_gemm_shape(int64_t n, int64_t k);

namespace detail {
// How y = x·W^T maps onto cuBLASLt's column-major D = op(A)·op(B) (FP8 wants op(A) = A^T, op(B) = B).
// kRoles is what Fp8B128Gemm uses; the others exist for the layout probe test, which times none of them.
enum class LtRoles : uint8_t {
  kWeightA,   // A = W (BLK128x128), B = x_q (VEC128), D = y as N x M column-major (ld N)
  kActARowD,  // A = x_q (VEC128), B = W (BLK128x128), D = y as M x N in CUBLASLT_ORDER_ROW (ld N)
  kActAColD,  // A = x_q (VEC128), B = W (BLK128x128), D = y^T: M x N column-major (ld M), probe only
};
inline constexpr LtRoles kRoles = LtRoles::kActARowD;
std::string_view lt_roles_name(LtRoles r);
// One uncached matmul through a fresh handle, as the probe test needs it (same arguments as matmul(), no
// check of m).
Status probe_matmul(LtRoles roles, const uint8_t* xq, const float* xs, int64_t m, const Fp8B128Weights& w,
                    uint16_t* y, cudaStream_t stream);
}  // namespace detail

// Owns the cuBLASLt handle, its workspace, the scratch for quantized activations and one cached plan
// (descriptors + heuristic algorithm) per (m, n, k). Not thread-safe: one per stream.
class Fp8B128Gemm {
 public:
  static Result<std::unique_ptr<Fp8B128Gemm>> create(size_t workspace_bytes = 32u << 20);
  ~Fp8B128Gemm();
  Fp8B128Gemm(const Fp8B128Gemm&) = delete;
  Fp8B128Gemm& operator=(const Fp8B128Gemm&) = delete;

  // Sizes the scratch (quantized x, and the padded D for M % 4 != 0) for up to max_m rows, max_n
  // outputs, max_k inputs; run() grows it otherwise, which is refused while the stream is captured.
  Status reserve(int64_t max_m, int64_t max_n, int64_t max_k);
  // x (bf16 [m, k]) quantized per 1x128 into the scratch (values [m, k], scales K-block-major with leading
  // dimension fp8_b128_padded_m(m)), as run() and the sm_90a kernel (gemm_fp8_b128_sm90.h) take it. Grows
  // the scratch for (m, n, k) outside graph capture, refuses inside.
  struct QuantizedAct {
    const uint8_t* values;
    const float* scales;
    int64_t scale_ld;
  };
  Result<QuantizedAct> quantize(const uint16_t* x, int64_t m, int64_t n, int64_t k, cudaStream_t stream);
  // Quantizes x (bf16 [m, w.k]) and runs the matmul into y (bf16 [m, w.n]). m >= 1.
  Status run(const uint16_t* x, int64_t m, const Fp8B128Weights& w, uint16_t* y, cudaStream_t stream);
  // The matmul alone on already-quantized activations: xq E4M3 [m, k], xs M-major f32 scales with leading
  // dimension m; m % 4 == 0 (refused otherwise). Used by run() and the benchmark.
  Status matmul(const uint8_t* xq, const float* xs, int64_t m, const Fp8B128Weights& w, uint16_t* y,
                cudaStream_t stream);

  // Which of the heuristic's algorithms a new plan takes (index 0: its first, the default) and the roles
  // (default detail::kRoles), for the benchmark's sweep (`mxq-bench linear --lt-sweep`). Drops the cached
  // plans. A plan whose index is past the heuristic's count is refused by name.
  struct Choice {
    detail::LtRoles roles = detail::kRoles;
    int index = 0;
  };
  static constexpr int kMaxHeuristics = 16;
  void set_choice(Choice c);
  // The cached plan's algorithm for (m, n, k) in words (config id, tile, stages, split-K, swizzle,
  // cluster); an error when no plan is cached for it.
  Result<std::string> plan_algo(int64_t m, int64_t n, int64_t k) const;

  struct Plan;  // one shape's descriptors and algorithm (the .cpp)

 private:
  Fp8B128Gemm() = default;
  Result<Plan*> plan_for(int64_t m, const Fp8B128Weights& w, const float* xs);

  cublasLtHandle_t handle_ = nullptr;
  Choice choice_;
  DeviceBuffer workspace_, act_values_, act_scales_, out_pad_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<Plan>> plans_;
};

}  // namespace mxq::cuda
