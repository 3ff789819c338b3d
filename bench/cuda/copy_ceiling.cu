// The copy ceiling of a byte-moving kernel (refit's full write): a grid-stride loop where each thread keeps
// kUnroll 16-byte loads in flight, then stores them (streaming on both sides, or default-cached), so the data
// goes DRAM -> registers -> DRAM once. `mxq-bench refit` times
// it over the refit's byte count beside cudaMemcpy D2D: the rate an SM kernel (which the refit must be, to
// hash what it writes) can reach. Layout: src and dst device buffers of `bytes` bytes, 16-byte aligned,
// bytes % 16 == 0. Arch: sm_80+.
#include "bench/cuda/copy_ceiling.h"
#include "cuda/common/device_sms.h"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 512;

template <class T>
__device__ __forceinline__ T load16(const T* p, bool streaming) {
  return streaming ? __ldcs(p) : *p;
}
template <class T>
__device__ __forceinline__ void store16(T* p, T v, bool streaming) {
  if (streaming)
    __stcs(p, v);
  else
    *p = v;
}

template <int kUnroll, bool kStreaming>
__global__ void __launch_bounds__(kThreads)
    copy_ceiling_kernel(uint4* __restrict__ dst, const uint4* __restrict__ src, int64_t n16) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n16; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load16(src + i + u * stride, kStreaming);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) store16(dst + i + u * stride, v[u], kStreaming);
  }
  for (; i < n16; i += stride) store16(dst + i, load16(src + i, kStreaming), kStreaming);
}

}  // namespace

cudaError_t launch_copy_ceiling(uint8_t* dst, const uint8_t* src, int64_t bytes, int variant,
                                cudaStream_t stream) {
  const int sms = device_sms();
  if (sms == 0) return cudaErrorInvalidDevice;
  const int64_t n16 = bytes / 16;
  // note: variant 0: 4 loads in flight per thread, 4 blocks (2048 threads) per SM; 1: 8 loads, 2 blocks;
  // 2 and 3: the same with default-cached loads and stores instead of streaming ones.
  const int unroll = variant % 2 == 0 ? 4 : 8, per_sm = variant % 2 == 0 ? 4 : 2;
  const int64_t want =
      (n16 + static_cast<int64_t>(kThreads) * unroll - 1) / (static_cast<int64_t>(kThreads) * unroll);
  const unsigned grid = static_cast<unsigned>(want < sms * per_sm ? (want < 1 ? 1 : want) : sms * per_sm);
  auto* d = reinterpret_cast<uint4*>(dst);
  const auto* s = reinterpret_cast<const uint4*>(src);
  switch (variant) {
    case 0:
      copy_ceiling_kernel<4, true><<<grid, kThreads, 0, stream>>>(d, s, n16);
      break;
    case 1:
      copy_ceiling_kernel<8, true><<<grid, kThreads, 0, stream>>>(d, s, n16);
      break;
    case 2:
      copy_ceiling_kernel<4, false><<<grid, kThreads, 0, stream>>>(d, s, n16);
      break;
    default:
      copy_ceiling_kernel<8, false><<<grid, kThreads, 0, stream>>>(d, s, n16);
  }
  return cudaGetLastError();
}

}  // namespace mxq::cuda
