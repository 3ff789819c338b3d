// Unchecked GEMV launchers, the part compiled by nvcc (which cannot parse fmt); gemv_mx.cpp checks the
// arguments and calls these. Shapes and the layout contract: gemv_mx.h, gemv_layout.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

cudaError_t launch_gemv_mxfp8(const uint16_t* x, int m, const uint8_t* values, const uint8_t* scales,
                              uint16_t* y, int n, int k, cudaStream_t stream);
cudaError_t launch_gemv_mxfp4(const uint16_t* x, int m, const uint8_t* values, const uint8_t* scales,
                              uint16_t* y, int n, int k, cudaStream_t stream);

// Up to kMaxGemvParts projections of the same x [m, k] in one launch (q/k/v, gate/up): part q is
// y[q] [m, n[q]] = x · W_q^T, W_q at values[q] / scales[q] in the format's GEMV layout. Each part's rows are
// computed by the same tile code as its own launch, so y is bitwise the same; one launch instead of several
// fills the GPU with the small parts' tiles (k/v_proj alone are 64 tiles on 132 SMs) and pays one tail.
inline constexpr int kMaxGemvParts = 3;
struct GemvParts {
  const uint8_t* values[kMaxGemvParts] = {};
  const uint8_t* scales[kMaxGemvParts] = {};  // MX: E8M0 bytes; FP8-B128: f32 (as bytes)
  uint16_t* y[kMaxGemvParts] = {};
  int n[kMaxGemvParts] = {};
  int64_t s_row[kMaxGemvParts] = {}, s_col[kMaxGemvParts] = {};  // FP8-B128 scale strides (floats)
  int count = 0;

  // One projection (scales: the format's scale plane as bytes; FP8-B128 strides s_row, s_col).
  static GemvParts one(const uint8_t* values, const uint8_t* scales, uint16_t* y, int n, int64_t s_row = 0,
                       int64_t s_col = 0) {
    GemvParts p;
    p.values[0] = values, p.scales[0] = scales, p.y[0] = y, p.n[0] = n;
    p.s_row[0] = s_row, p.s_col[0] = s_col, p.count = 1;
    return p;
  }
};
cudaError_t launch_gemv_parts_mxfp8(const uint16_t* x, int m, const GemvParts& p, int k, cudaStream_t stream);
cudaError_t launch_gemv_parts_mxfp4(const uint16_t* x, int m, const GemvParts& p, int k, cudaStream_t stream);

// Which GEMV kernel the launchers run, process-wide. kAuto (the default): at m = 1 for MXFP8 and MXFP4 the
// shared-memory ring kernel (gemv_mx_ring.cuh; kRingDeep's configuration) where it fits; else the register
// kernel (gemv_mx_kernel.cuh), with the branch-free step body at m <= 8 for MXFP8 and FP8-B128 and the
// per-group loop for MXFP4 (the step body measured 2-12% faster for the first two and 1-25% slower for
// MXFP4 on the H200, bench/history/RESULTS-log.md, "Session 3 final whole-tree run"); for MXFP8 at m = 1 with
// more row tiles than 2 per SM where the ring does not fit, persistent blocks. The others force one kernel,
// to measure and test each from one build (tests, `mxq-bench linear --gemv-study`): kRegister, the per-group
// loop at every m; kRegisterStep, the step body at m <= 8. The FP8-B128 GEMV reads kRegister (per-group loop)
// vs anything else (step body at m <= 8).
enum class GemvKernel : int {
  kAuto = 0,
  kRegister = 1,      // register kernel, per-group loop at every m (= kAuto for MXFP4)
  kRegisterStep = 2,  // register kernel, branch-free step body at m <= 8
  kPersist = 3,       // kAuto's loop body, persistent blocks at every m <= 8 (gemv_mx_persist_kernel)
  kPersistStep = 4,   // step body and persistent blocks at m <= 8
  // The shared-memory ring kernel (gemv_mx_ring.cuh) where it fits (m <= 8, whole warp steps, aligned
  // planes; elsewhere kRegisterStep's kernel): bitwise the step body. 2 stages at 3 blocks per SM, one
  // tile per block / persistent; 3 stages at 2 blocks per SM, persistent.
  kRing = 5,
  kRingPersist = 6,
  kRingDeep = 7,
};
inline constexpr GemvKernel kGemvKernels[] = {
    GemvKernel::kAuto,        GemvKernel::kRegister, GemvKernel::kRegisterStep, GemvKernel::kPersist,
    GemvKernel::kPersistStep, GemvKernel::kRing,     GemvKernel::kRingPersist,  GemvKernel::kRingDeep};
// True for the variants with persistent blocks.
constexpr bool gemv_persistent(GemvKernel k) {
  return k == GemvKernel::kPersist || k == GemvKernel::kPersistStep;
}
// True for the shared-memory ring variants.
constexpr bool gemv_ring(GemvKernel k) {
  return k == GemvKernel::kRing || k == GemvKernel::kRingPersist || k == GemvKernel::kRingDeep;
}
const char* gemv_kernel_name(GemvKernel k);
void set_gemv_kernel(GemvKernel k);
GemvKernel gemv_kernel();

// Study only (`mxq-bench linear --gemv-trace`): while `records` is set, every block of the ring kernels
// writes one record of kGemvTraceWords words at slot (n % capacity), n = the block's arrival number
// (atomicAdd on *count): globaltimer ns at its start, after its PDL wait, when its first step's bytes are in
// shared memory (warp 0), at its end (after warp 0's stores); smid | blockIdx << 32; gridDim.x | the low 32
// bits of the first part's values pointer << 32 (which launch: arrival numbers alone do not order launches,
// since a block's atomicAdd may land after the next launch's first blocks); then 6 clock64 cycle counts of
// warp 0 after its PDL wait: tile 0's steps 0 and 1 before / after their cp.async wait, tile 0's steps
// done, tile 0's sums stored (gemv_mx_ring.cuh). Null (the default): the launchers run the kernels without
// records.
struct GemvTrace {
  unsigned long long* records = nullptr;
  unsigned int* count = nullptr;
  int capacity = 0;  // blocks
};
inline constexpr int kGemvTraceWords = 12;
void set_gemv_trace(const GemvTrace& t);
GemvTrace gemv_trace();

}  // namespace mxq::cuda
