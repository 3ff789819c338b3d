// W8A16 MXFP8 GEMV for decode, y[M,N] = x[M,K] · W[N,K]^T, M = 1..32.
// Layout contract (gemv_layout.h, written by prepare_gemv_values):
//   values: [N, K] E4M3, each row a byte permutation of the canonical row in groups of 64 (tail 32):
//           canonical k0 + 16j + 4t + e → native k0 + 4J·t + 4j + e (J = 4, or 2 for a 32-wide tail group);
//   scales: canonical [N, K/32] E8M0, row-major (identity); x, y: row-major bf16; K % 32 == 0; any N >= 1.
// Arch: sm_80+ (mma.sync bf16, prmt). The "cvt" decode uses cvt.rn.f16x2.e4m3x2 on sm_89+, bit moves before.
// Kernels (gemv_mx_launch.h, GemvKernel::kAuto): at m = 1 the shared-memory ring kernel (gemv_mx_ring.cuh, 3
// stages, 2 persistent blocks per SM) where it fits, else the register kernel (gemv_mx_kernel.cuh) with
// "bits" and the step body at m = 1, "cvt" and the per-group loop for m > 1; at m = 1 with more row tiles
// than 2 per SM, its persistent form (gemv_mx_persist_kernel: blocks walk tiles, warps prefetch across them).
// note: a streaming kernel (persistent blocks fed by a per-warp cp.async shared-memory ring) measured 25-75%
// slower at M <= 16 and 8% faster only at M = 32 on the Qwen3-8B shapes (bench/history/RESULTS-log.md,
// "GEMV at M <= 32: read-only ceiling") and was removed. Decode
// ("bits"): each E4M3 byte s.eeee.mmm becomes the bf16 bits s at 15, eeee.mmm at 10..4, i.e. the value ·
// 2^-120 exactly (codes 1..7 land on bf16 subnormals, which mma.sync keeps); the 2^120 is folded into the
// E8M0 scale multiply (FoldedScale). Three integer ops per bf16x2 pair. A warp whose activation rows all stay
// below 2^-8 (whose products would leave f32's range at 2^-120) recomputes its tile with "cvt" (Exact;
// warp_rows_small, gemv_mx_kernel.cuh). Decode ("cvt", for m > 1 and that recompute): E4M3 pair → f16x2
// (exact) → bf16 bits by moving the exponent field (value · 2^-112, a bf16 normal) → one bf16x2 multiply by
// 2^112 (exact).

#include "cuda/linear/gemv_grouped.cuh"
#include "cuda/linear/gemv_mx_kernel.cuh"
#include "cuda/linear/gemv_mx_ring.cuh"

namespace mxq::cuda {
namespace {

// Bytes b0..b3 → pairs (b0, b1), (b2, b3) in the 2^-120 placement above.
__device__ __forceinline__ void e4m3x4_to_bf16x4_scaled(uint32_t word, uint32_t* pairs) {
  // note: selector nibbles 8 and 9 (A, B) replicate the sign of byte 0 (1, 2, 3) into the byte above it, so
  // after << 4 each half carries its sign at bit 15 (and 11..14, masked off); the other half's bits are
  // pushed into 16..19 only, also masked off.
  const uint32_t lo = gemv::prmt(word, 0, 0x9180) << 4, hi = gemv::prmt(word, 0, 0xB3A2) << 4;
  pairs[0] = lo & 0x87F087F0u;
  pairs[1] = hi & 0x87F087F0u;
}

struct Mxfp8Decode {
  static constexpr int kGroupK = 64, kPairsPerWord = 2, kRowBytesNum = 1, kRowBytesDen = 1, kScaleFold = 0;
  static constexpr bool kScaleVote = false;
  using Exact = Mxfp8Decode;
  __device__ static void decode(uint32_t word, uint32_t* pairs) {
    pairs[0] = gemv::e4m3x2_to_bf16x2(word & 0xFFFFu);
    pairs[1] = gemv::e4m3x2_to_bf16x2(word >> 16);
  }
  __device__ static uint32_t load_tail(const uint8_t* p) {
    return __ldg(reinterpret_cast<const uint32_t*>(p));
  }
};

struct Mxfp8BitsDecode {
  static constexpr int kGroupK = 64, kPairsPerWord = 2, kRowBytesNum = 1, kRowBytesDen = 1, kScaleFold = 120;
  static constexpr bool kScaleVote = false;
  using Exact = Mxfp8Decode;  // note: for small activations (warp_rows_small, gemv_mx_kernel.cuh)
  __device__ static void decode(uint32_t word, uint32_t* pairs) { e4m3x4_to_bf16x4_scaled(word, pairs); }
  __device__ static uint32_t load_tail(const uint8_t* p) {
    return __ldg(reinterpret_cast<const uint32_t*>(p));
  }
};

// The grouped entry's tile (gemv_grouped.cuh): launch_gemv_mxfp8's kAuto choices for the chunk's m (m = 1:
// the bits decode and the step body; m = 2..8: cvt and the per-group loop; above: cvt at 2 n-tiles).
template <bool kHasTail, bool kGather>
struct Mxfp8GroupedTile {
  template <int kMaxNTiles>
  __device__ static void run(const GroupedGemvArgs& a, const __nv_bfloat16* x, int m, const int32_t* rows,
                             const uint8_t* wv, const uint8_t* ws, __nv_bfloat16* y, int row0) {
    using gemv::gemv_mx_tile;
    if (m == 1)
      gemv_mx_tile<Mxfp8BitsDecode, 1, kHasTail, true, kGather>(x, m, rows, a.x_div, wv, ws, y, a.n, a.k,
                                                                row0);
    else if (kMaxNTiles == 1 || m <= 8)
      gemv_mx_tile<Mxfp8Decode, 1, kHasTail, false, kGather>(x, m, rows, a.x_div, wv, ws, y, a.n, a.k, row0);
    else if constexpr (kMaxNTiles >= 2)
      gemv_mx_tile<Mxfp8Decode, 2, kHasTail, false, kGather>(x, m, rows, a.x_div, wv, ws, y, a.n, a.k, row0);
  }
};

}  // namespace

cudaError_t launch_gemv_grouped_mxfp8(const GroupedGemvArgs& a, cudaStream_t stream) {
  return gemv::launch_grouped<Mxfp8GroupedTile>(a, a.k % Mxfp8Decode::kGroupK != 0, stream);
}

cudaError_t launch_gemv_parts_mxfp8(const uint16_t* x, int m, const GemvParts& p, int k,
                                    cudaStream_t stream) {
  const GemvKernel kernel = gemv_kernel();
  // note: kAuto takes the step body (m <= 8): on the H200 it measured 2-12% faster than the per-group loop at
  // M = 1 and 1-8% at M = 8 on every Qwen3-8B shape (bench/history/RESULTS-log.md,
  // "Session 3 final whole-tree run").
  const bool step = kernel != GemvKernel::kRegister;
  // note: kAuto takes persistent blocks at m = 1 when the grid has more tiles than fit at once (Qwen3-8B
  // qkv 384 and gate_up 1536 tiles against 264 slots): 3.7% and 3.9% faster there on the H200; with one
  // tile per block (q/o, down: 256) the persistent kernel measured 3-6% slower, and at m = 8 2-8% slower
  // on every shape (bench/history/RESULTS-log.md, "GEMV at M = 1: persistent blocks").
  const bool persist = gemv_persistent(kernel) || (kernel == GemvKernel::kAuto && m == 1 &&
                                                   gemv::gemv_parts_tiles(p) > gemv::gemv_persist_blocks());
  // note: kAuto at m = 1 takes the ring kernel with 3 stages at 2 blocks per SM (kRingDeep) where it fits:
  // 59.2 against the step body's 66.3 us over the four Qwen3-8B shapes on the H200, gate_up at 90% of copy;
  // at m = 8 every ring variant measured 7-12% slower (bench/history/RESULTS-log.md,
  // "GEMV at M = 1: the shared-memory ring").
  const GemvKernel ring = kernel == GemvKernel::kAuto && m == 1 ? GemvKernel::kRingDeep : kernel;
  // note: the bits decode only at m = 1, where it measured 4.4% faster than cvt over the four Qwen3-8B shapes
  // on the H200 (bench/history/RESULTS-log.md, "GEMV decode variants"). At m = 2..8 its small-activation
  // check (warp_rows_small: one L2 round trip per row before the first step) made M = 8 26-37% slower on the
  // Qwen3-8B shapes; the cvt decode is exact and needs none: 1-13% slower than bits was before it had the
  // check, 12-25% faster than bits with it (bench/RESULTS.md, GEMV at M <= 32). With cvt, kAuto at m = 2..8
  // takes the per-group loop: 9.05 / 14.41 / 40.10 / 22.48 against the step body's 9.38 / 14.71 / 40.05 /
  // 23.49 us at M = 8 (same bits: cvt has no scale vote to merge).
  if (m > 1) {
    if (gemv_ring(ring) && gemv::gemv_ring_fits<Mxfp8Decode>(m, p, k))
      return gemv::launch_gemv_ring_variant<Mxfp8Decode>(ring, x, m, p, k, stream);
    // note: the forced ring variants where the ring does not fit run kRegisterStep's kernel
    // (gemv_mx_launch.h).
    const bool step_cvt =
        kernel == GemvKernel::kRegisterStep || kernel == GemvKernel::kPersistStep || gemv_ring(kernel);
    return gemv::launch_gemv<Mxfp8Decode>(x, m, p, k, step_cvt, persist, stream);
  }
  if (gemv_ring(ring) && gemv::gemv_ring_fits<Mxfp8BitsDecode>(m, p, k))
    return gemv::launch_gemv_ring_variant<Mxfp8BitsDecode>(ring, x, m, p, k, stream);
  return gemv::launch_gemv<Mxfp8BitsDecode, 1>(x, m, p, k, step, persist, stream);
}

cudaError_t launch_gemv_mxfp8(const uint16_t* x, int m, const uint8_t* values, const uint8_t* scales,
                              uint16_t* y, int n, int k, cudaStream_t stream) {
  return launch_gemv_parts_mxfp8(x, m, GemvParts::one(values, scales, y, n), k, stream);
}

}  // namespace mxq::cuda
