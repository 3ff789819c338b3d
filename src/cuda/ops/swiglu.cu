// SwiGLU: out[t, i] = silu(gate[t, i]) * up[t, i], silu(g) = g / (1 + exp(-g)), in f32, rounded once to bf16.
//   gate, up  bf16, row t of each at gate + t * stride, up + t * stride (stride = 2 * width for the fused
//             [gate | up] row, width for separate buffers)
//   out       bf16 [max_tokens, width] row-major; width % 8 == 0 (16-byte vectors)
//   num_tokens int32 [1] on device (null = max_tokens); rows at or past it are untouched.
// Same formula and operation order as cpu/swiglu (expf, IEEE division), so only the bf16 inputs and the final
// rounding separate it from the twin run on the same f32 values.
#include <cuda_bf16.h>

#include <climits>

#include "cuda/common/bf16_pack.cuh"
#include "cuda/common/pdl.cuh"
#include "cuda/ops/swiglu.h"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ uint32_t silu_mul2(uint32_t g, uint32_t u) {
  const float g0 = __uint_as_float(g << 16), g1 = __uint_as_float(g & 0xFFFF0000u);
  const float u0 = __uint_as_float(u << 16), u1 = __uint_as_float(u & 0xFFFF0000u);
  const float r0 = g0 / (1.0f + expf(-g0)) * u0, r1 = g1 / (1.0f + expf(-g1)) * u1;
  return pack_bf16x2(r0, r1);
}

// grid (max_tokens, ceil(width / (8 * kThreads)))
__global__ void __launch_bounds__(kThreads)
    swiglu_kernel(const uint16_t* __restrict__ gate, const uint16_t* __restrict__ up, int64_t stride,
                  int64_t width, const int32_t* __restrict__ num_tokens, uint16_t* __restrict__ out) {
  pdl::enter();
  const int64_t t = blockIdx.x;
  if (num_tokens && t >= *num_tokens) return;
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x) * 8;
  if (c >= width) return;
  const uint4 g = *reinterpret_cast<const uint4*>(gate + t * stride + c);
  const uint4 u = *reinterpret_cast<const uint4*>(up + t * stride + c);
  *reinterpret_cast<uint4*>(out + t * width + c) =
      make_uint4(silu_mul2(g.x, u.x), silu_mul2(g.y, u.y), silu_mul2(g.z, u.z), silu_mul2(g.w, u.w));
}

cudaError_t launch(const uint16_t* gate, const uint16_t* up, int64_t stride, int64_t width,
                   const int32_t* num_tokens, int64_t max_tokens, uint16_t* out, cudaStream_t stream) {
  if (width < 8 || width % 8 != 0 || max_tokens < 0 || max_tokens > INT_MAX || !gate || !up || !out)
    return cudaErrorInvalidValue;
  if (max_tokens == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(max_tokens),
                  static_cast<unsigned>((width / 8 + kThreads - 1) / kThreads));
  return launch_pdl(swiglu_kernel, grid, dim3(kThreads), 0, stream, gate, up, stride, width, num_tokens, out);
}

}  // namespace

cudaError_t launch_swiglu_fused(const uint16_t* gate_up, int64_t width, const int32_t* num_tokens,
                                int64_t max_tokens, uint16_t* out, cudaStream_t stream) {
  if (!gate_up) return cudaErrorInvalidValue;
  return launch(gate_up, gate_up + width, 2 * width, width, num_tokens, max_tokens, out, stream);
}

cudaError_t launch_swiglu(const uint16_t* gate, const uint16_t* up, int64_t width, const int32_t* num_tokens,
                          int64_t max_tokens, uint16_t* out, cudaStream_t stream) {
  return launch(gate, up, width, width, num_tokens, max_tokens, out, stream);
}

}  // namespace mxq::cuda
