// A plain device copy kernel: the same-size reference of `mxq-bench quantize --device cuda` (a quantize
// launch of a few MB cannot reach the 2 GiB copy rate; this says what a copy of its bytes reaches).
// Layout: 16-byte elements; a CTA covers 4 x 256 consecutive elements, thread t elements t + 256j (a warp
// reads and writes 512 contiguous bytes per pass), all four loads in flight before the first store. PDL as
// the quantizers (pdl.cuh).
#include "cuda/common/pdl.cuh"
#include "cuda/quantize/quantize_launch.h"

namespace mxq::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    copy16_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t n) {
  pdl::enter();
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * 4 + threadIdx.x;
  uint4 r[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    r[j] = base + j * kThreads < n ? __ldg(src + base + j * kThreads) : make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (base + j * kThreads < n) dst[base + j * kThreads] = r[j];
}

}  // namespace

cudaError_t launch_copy16(const void* src, void* dst, int64_t bytes, cudaStream_t stream) {
  const int64_t n = bytes / 16;
  if (n == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((n + kThreads * 4 - 1) / (kThreads * 4)));
  return launch_pdl(copy16_kernel, grid, kThreads, 0, stream, static_cast<const uint4*>(src),
                    static_cast<uint4*>(dst), n);
}

}  // namespace mxq::cuda
