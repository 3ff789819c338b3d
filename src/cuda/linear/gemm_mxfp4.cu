// W4A16 MXFP4 GEMM for prefill, y[M,N] = x[M,K] · W[N,K]^T, f32 accumulation.
// Layout contract (gemv_layout.h, the GEMV's, written by prepare_gemv_values):
//   values: [N, K/2] bytes, E2M1 nibbles (element 2i in bits 3:0 of byte i), each row a byte permutation of
//           the canonical row in groups of 128 elements (tail 32, 64 or 96): canonical element
//           k0 + 16j + 4t + e → native k0 + 4J·t + 4j + e (J = 8, or tail/16); bytes move whole;
//   scales: canonical [N, K/32] E8M0, row-major (identity); x: row-major bf16, 16-byte aligned; y: row-major
//           bf16; K % 32 == 0; any M, N >= 1.
// Arch: sm_90a → gemm_mx_sm90.cuh (wgmma, TMA); sm_80+ → gemm_mx_sm80.cuh (mma.sync, cp.async). A layout
// group spans two 64-k pipeline stages.
// Decode: nibble bits placed as bf16 bits (value · 2^-126) → one bf16x2 multiply by 2^(126 + b - bref).
#include "cuda/linear/gemm_mx_launch.cuh"

namespace mxq::cuda {

cudaError_t launch_gemm_mxfp4(const uint16_t* x, int m, const uint8_t* values, const uint8_t* scales,
                              uint16_t* y, int n, int k, GemmPath path, float* ws, int64_t ws_floats,
                              cudaStream_t stream) {
  return gemm::launch_gemm<gemm::Fp4>(x, m, values, scales, y, n, k, path, ws, ws_floats, stream);
}

}  // namespace mxq::cuda
