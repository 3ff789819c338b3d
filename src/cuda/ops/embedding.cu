// Token embedding gather: out[t, :] = table[ids[t], :] for t < *num_tokens.
//   table      bf16 [vocab, hidden] row-major, hidden % 8 == 0
//   ids        int32 [max_tokens] (device)
//   num_tokens int32 [1] (device; null = max_tokens): rows at or past it are left untouched
//   out        f32 [max_tokens, hidden] (the residual stream) or bf16 (same layout)
//   bad_token  int32 [1] (device): atomicMin'd with the index of a token whose id is outside [0, vocab);
//              that row is written as zeros. The table is never read out of bounds.
// Exact: bf16 → f32 is lossless, bf16 → bf16 a copy (bitwise equal to cpu/embedding).
#include <cuda_bf16.h>

#include <climits>

#include "cuda/ops/embedding.h"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ void store8(float* dst, uint4 raw) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  float4 lo, hi;
  lo.x = __uint_as_float(w[0] << 16);
  lo.y = __uint_as_float(w[0] & 0xFFFF0000u);
  lo.z = __uint_as_float(w[1] << 16);
  lo.w = __uint_as_float(w[1] & 0xFFFF0000u);
  hi.x = __uint_as_float(w[2] << 16);
  hi.y = __uint_as_float(w[2] & 0xFFFF0000u);
  hi.z = __uint_as_float(w[3] << 16);
  hi.w = __uint_as_float(w[3] & 0xFFFF0000u);
  reinterpret_cast<float4*>(dst)[0] = lo;
  reinterpret_cast<float4*>(dst)[1] = hi;
}
__device__ __forceinline__ void store8(uint16_t* dst, uint4 raw) { *reinterpret_cast<uint4*>(dst) = raw; }

// One CTA per token row; each thread moves 8 elements (16 bytes of the table) per step.
template <class Out>
__global__ void __launch_bounds__(kThreads)
    embedding_kernel(const uint16_t* __restrict__ table, int64_t vocab, int64_t hidden,
                     const int32_t* __restrict__ ids, const int32_t* __restrict__ num_tokens,
                     Out* __restrict__ out, int32_t* bad_token) {
  const int64_t t = blockIdx.x;
  if (num_tokens && t >= *num_tokens) return;
  const int32_t id = ids[t];
  const bool ok = id >= 0 && id < vocab;
  if (!ok && threadIdx.x == 0) atomicMin(bad_token, static_cast<int32_t>(t));
  const uint4* src = reinterpret_cast<const uint4*>(table + (ok ? id : 0) * hidden);
  Out* dst = out + t * hidden;
  for (int64_t c = threadIdx.x; c < hidden / 8; c += kThreads)
    store8(dst + c * 8, ok ? __ldg(src + c) : make_uint4(0, 0, 0, 0));
}

template <class Out>
cudaError_t launch(const uint16_t* table, int64_t vocab, int64_t hidden, const int32_t* ids,
                   const int32_t* num_tokens, int64_t max_tokens, Out* out, int32_t* bad_token,
                   cudaStream_t stream) {
  if (hidden < 8 || hidden % 8 != 0 || vocab < 1 || max_tokens < 0 || max_tokens > INT_MAX || !table ||
      !ids || !out || !bad_token)
    return cudaErrorInvalidValue;
  if (max_tokens == 0) return cudaSuccess;
  embedding_kernel<Out><<<static_cast<unsigned>(max_tokens), kThreads, 0, stream>>>(
      table, vocab, hidden, ids, num_tokens, out, bad_token);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_embedding_f32(const uint16_t* table, int64_t vocab, int64_t hidden, const int32_t* ids,
                                 const int32_t* num_tokens, int64_t max_tokens, float* out,
                                 int32_t* bad_token, cudaStream_t stream) {
  return launch(table, vocab, hidden, ids, num_tokens, max_tokens, out, bad_token, stream);
}

cudaError_t launch_embedding_bf16(const uint16_t* table, int64_t vocab, int64_t hidden, const int32_t* ids,
                                  const int32_t* num_tokens, int64_t max_tokens, uint16_t* out,
                                  int32_t* bad_token, cudaStream_t stream) {
  return launch(table, vocab, hidden, ids, num_tokens, max_tokens, out, bad_token, stream);
}

}  // namespace mxq::cuda
