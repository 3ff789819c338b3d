// W4A16 MXFP4 GEMV for decode, y[M,N] = x[M,K] · W[N,K]^T, M = 1..32.
// Layout contract (gemv_layout.h, written by prepare_gemv_values):
//   values: [N, K/2] bytes, E2M1 nibbles (element 2i in bits 3:0 of byte i), each row a byte permutation of
//           the canonical row in groups of 128 elements (tail 32, 64 or 96): canonical element
//           k0 + 16j + 4t + e → native k0 + 4J·t + 4j + e (J = 8, or tail/16); bytes move whole;
//   scales: canonical [N, K/32] E8M0, row-major (identity); x, y: row-major bf16; K % 32 == 0; any N >= 1.
// Kernel: at m = 1 the shared-memory ring kernel (gemv_mx_ring.cuh, 3 stages, 2 persistent blocks per SM)
// where it fits (K % 512 == 0), else the register kernel (gemv_mx_kernel.cuh), per-group loop
// (kRegisterStep forces the step body; the persistent register form measured 7-18% slower on every
// Qwen3-8B shape at m = 1, so kAuto never takes it). The ring kernel runs the step body's math; for MXFP4
// the step body and the loop give the same bits (either scale path yields the same f32 scale).
// Scales: at one n-tile a per-group warp vote sends groups without scale byte 0 or 255 through b << 23
// (kScaleVote; 5.4% / 3.9% faster than e8m0_to_f32 for every scale on gate_up / down at m = 1, equal
// elsewhere, bench/history/RESULTS-log.md, "GEMV at M = 1: persistent blocks and the MXFP4 scale vote").
// Arch: sm_80+ (mma.sync bf16). Decode: nibble bits placed as bf16 bits (code << 6, sign << 12) are
// the value · 2^-126 (code 1 = 0.5 becomes a bf16 subnormal); one bf16x2 multiply by 2^126 makes them exact.
// note: a two-step prmt table decode (magnitude → selector byte with the sign in bit 6 → bf16 bytes; exact,
// 15 instead of 18 ops per word) measured 5% slower in sum on the H200 (bench/history/RESULTS-log.md,
// "GEMV decode variants", 8b).

#include "cuda/linear/gemv_grouped.cuh"
#include "cuda/linear/gemv_mx_kernel.cuh"
#include "cuda/linear/gemv_mx_ring.cuh"

namespace mxq::cuda {
namespace {

struct Mxfp4Decode {
  static constexpr int kGroupK = 128, kPairsPerWord = 4, kRowBytesNum = 1, kRowBytesDen = 2, kScaleFold = 0;
  static constexpr bool kScaleVote = true;
  using Exact = Mxfp4Decode;  // note: already exact (kScaleFold 0)
  // Byte p of `word` (elements 2p, 2p+1) becomes pair p.
  __device__ static void decode(uint32_t word, uint32_t* pairs) {
    const uint32_t even = word & 0x0F0F0F0Fu, odd = (word >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      // note: selector nibble 8 sign-replicates byte 0 of `even`, whose bit 7 is clear: a zero byte.
      const uint32_t q = gemv::prmt(even, odd, 0x8080u | p | ((4u + p) << 8));
      // note: q * 4160 = (q << 6) + (q << 12); a 4-bit code per half keeps the two terms from overlapping.
      const uint32_t raw = (q * 4160u) & 0x81C081C0u;
      pairs[p] = gemv::bf16x2_mul(raw, 0x7E807E80u);  // note: bf16 0x7E80 = 2^126
    }
  }
  __device__ static uint32_t load_tail(const uint8_t* p) {
    return __ldg(reinterpret_cast<const uint16_t*>(p));
  }
};

// The grouped entry's tile (gemv_grouped.cuh): launch_gemv_mxfp4's kAuto choice (the per-group loop) with
// the chunk's n-tile count.
template <bool kHasTail, bool kGather>
struct Mxfp4GroupedTile {
  template <int kMaxNTiles>
  __device__ static void run(const GroupedGemvArgs& a, const __nv_bfloat16* x, int m, const int32_t* rows,
                             const uint8_t* wv, const uint8_t* ws, __nv_bfloat16* y, int row0) {
    using gemv::gemv_mx_tile;
    if (kMaxNTiles == 1 || m <= 8)
      gemv_mx_tile<Mxfp4Decode, 1, kHasTail, false, kGather>(x, m, rows, a.x_div, wv, ws, y, a.n, a.k, row0);
    else if constexpr (kMaxNTiles >= 2)
      gemv_mx_tile<Mxfp4Decode, 2, kHasTail, false, kGather>(x, m, rows, a.x_div, wv, ws, y, a.n, a.k, row0);
  }
};

}  // namespace

cudaError_t launch_gemv_grouped_mxfp4(const GroupedGemvArgs& a, cudaStream_t stream) {
  return gemv::launch_grouped<Mxfp4GroupedTile>(a, a.k % Mxfp4Decode::kGroupK != 0, stream);
}

cudaError_t launch_gemv_parts_mxfp4(const uint16_t* x, int m, const GemvParts& p, int k,
                                    cudaStream_t stream) {
  const GemvKernel kernel = gemv_kernel();
  // note: kAuto at m = 1 takes the ring kernel with 3 stages at 2 blocks per SM (kRingDeep) where it fits:
  // 51.0 against the per-group loop's 55.2 us over the four Qwen3-8B shapes on the H200 (down equal, the
  // others 8-17% faster); at m = 8 every ring variant measured 15-30% slower (bench/history/RESULTS-log.md,
  // "GEMV at M = 1: the shared-memory ring").
  const GemvKernel ring = kernel == GemvKernel::kAuto && m == 1 ? GemvKernel::kRingDeep : kernel;
  const bool step =
      kernel == GemvKernel::kRegisterStep || kernel == GemvKernel::kPersistStep || gemv_ring(kernel);
  if (gemv_ring(ring) && gemv::gemv_ring_fits<Mxfp4Decode>(m, p, k))
    return gemv::launch_gemv_ring_variant<Mxfp4Decode>(ring, x, m, p, k, stream);
  return gemv::launch_gemv<Mxfp4Decode>(x, m, p, k, step, gemv_persistent(kernel), stream);
}

cudaError_t launch_gemv_mxfp4(const uint16_t* x, int m, const uint8_t* values, const uint8_t* scales,
                              uint16_t* y, int n, int k, cudaStream_t stream) {
  return launch_gemv_parts_mxfp4(x, m, GemvParts::one(values, scales, y, n), k, stream);
}

}  // namespace mxq::cuda
