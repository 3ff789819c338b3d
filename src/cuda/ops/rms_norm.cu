// RMSNorm (HF Qwen3RMSNorm in f32) over rows of the activations; one CTA per token row.
//   x        [max_tokens, dim] f32 (residual stream) or bf16 (a linear's output), row-major
//   residual [max_tokens, dim] f32, updated in place by add_rms_norm (residual += x)
//   w        bf16 [dim] (input_layernorm / post_attention_layernorm / model.norm)
//   out      bf16 [max_tokens, dim] (the next linear's input)
//   num_tokens int32 [1] on device (null = max_tokens); rows at or past it are untouched.
// Numerics: sum of squares in f32 (tree order, not the CPU's 8 lanes), inv = 1 / sqrt(sum / dim + eps) with
// IEEE sqrt and division, out = w * (x * inv) rounded once to bf16. The residual add is the same single f32
// add as the CPU twin, so residual is bitwise equal to it.
#include <cuda_bf16.h>

#include <climits>

#include "cuda/common/bf16_pack.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/ops/rms_norm.h"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// 8 consecutive elements of a row as f32.
__device__ __forceinline__ void load8(const float* p, float* v) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void load8(const uint16_t* p, float* v) {
  const uint4 r = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) v[2 * i] = bf16_lo(w[i]), v[2 * i + 1] = bf16_hi(w[i]);
}
__device__ __forceinline__ void store8(uint16_t* p, const float* v) {
  *reinterpret_cast<uint4*>(p) = make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]),
                                            pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
}
__device__ __forceinline__ void store8(float* p, const float* v) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

__device__ float block_sum(float v) {
  __shared__ float partial[kThreads / 32];
  __shared__ float total;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int i = 0; i < kThreads / 32; ++i) s += partial[i];
    total = s;
  }
  __syncthreads();
  return total;
}

// Scales row `src` (already final: x or the updated residual) into out.
template <class In>
__device__ void normalise_row(const In* src, const uint16_t* __restrict__ w, float eps, int64_t dim,
                              uint16_t* dst, float sum_sq) {
  const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(dim) + eps);
  for (int64_t c = threadIdx.x * 8; c < dim; c += kThreads * 8) {
    float v[8], wf[8];
    load8(src + c, v);
    load8(w + c, wf);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = wf[i] * (v[i] * inv);
    store8(dst + c, v);
  }
}

template <class In>
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(const In* __restrict__ x, const uint16_t* __restrict__ w, float eps, int64_t dim,
                    const int32_t* __restrict__ num_tokens, uint16_t* __restrict__ out) {
  pdl::enter();
  const int64_t t = blockIdx.x;
  if (num_tokens && t >= *num_tokens) return;
  const In* row = x + t * dim;
  float sq = 0.0f;
  for (int64_t c = threadIdx.x * 8; c < dim; c += kThreads * 8) {
    float v[8];
    load8(row + c, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) sq += v[i] * v[i];
  }
  normalise_row(row, w, eps, dim, out + t * dim, block_sum(sq));
}

__global__ void __launch_bounds__(kThreads)
    add_rms_norm_kernel(const uint16_t* __restrict__ x, float* residual, const uint16_t* __restrict__ w,
                        float eps, int64_t dim, const int32_t* __restrict__ num_tokens,
                        uint16_t* __restrict__ out) {
  pdl::enter();
  const int64_t t = blockIdx.x;
  if (num_tokens && t >= *num_tokens) return;
  float* res = residual + t * dim;
  float sq = 0.0f;
  // note: each thread re-reads in normalise_row exactly the elements it wrote here, so no barrier is needed
  // between the residual update and its read-back beyond the one inside block_sum.
  for (int64_t c = threadIdx.x * 8; c < dim; c += kThreads * 8) {
    float r[8], v[8];
    load8(res + c, r);
    load8(x + t * dim + c, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      r[i] = __fadd_rn(r[i], v[i]);
      sq += r[i] * r[i];
    }
    store8(res + c, r);
  }
  normalise_row(static_cast<const float*>(res), w, eps, dim, out + t * dim, block_sum(sq));
}

bool bad_shape(int64_t dim, int64_t max_tokens) {
  return dim < 8 || dim % 8 != 0 || max_tokens < 0 || max_tokens > INT_MAX;
}

}  // namespace

cudaError_t launch_rms_norm_f32(const float* x, const uint16_t* w, float eps, int64_t dim,
                                const int32_t* num_tokens, int64_t max_tokens, uint16_t* out,
                                cudaStream_t stream) {
  if (bad_shape(dim, max_tokens) || !x || !w || !out) return cudaErrorInvalidValue;
  if (max_tokens == 0) return cudaSuccess;
  return launch_pdl(rms_norm_kernel<float>, dim3(static_cast<unsigned>(max_tokens)), dim3(kThreads), 0,
                    stream, x, w, eps, dim, num_tokens, out);
}

cudaError_t launch_rms_norm_bf16(const uint16_t* x, const uint16_t* w, float eps, int64_t dim,
                                 const int32_t* num_tokens, int64_t max_tokens, uint16_t* out,
                                 cudaStream_t stream) {
  if (bad_shape(dim, max_tokens) || !x || !w || !out) return cudaErrorInvalidValue;
  if (max_tokens == 0) return cudaSuccess;
  return launch_pdl(rms_norm_kernel<uint16_t>, dim3(static_cast<unsigned>(max_tokens)), dim3(kThreads), 0,
                    stream, x, w, eps, dim, num_tokens, out);
}

cudaError_t launch_add_rms_norm(const uint16_t* x, float* residual, const uint16_t* w, float eps, int64_t dim,
                                const int32_t* num_tokens, int64_t max_tokens, uint16_t* out,
                                cudaStream_t stream) {
  if (bad_shape(dim, max_tokens) || !x || !residual || !w || !out) return cudaErrorInvalidValue;
  if (max_tokens == 0) return cudaSuccess;
  return launch_pdl(add_rms_norm_kernel, dim3(static_cast<unsigned>(max_tokens)), dim3(kThreads), 0, stream,
                    x, residual, w, eps, dim, num_tokens, out);
}

}  // namespace mxq::cuda
