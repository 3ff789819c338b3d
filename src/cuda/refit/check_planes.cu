// The W-05 check of whole new planes on the device (a full update from a device buffer: refit's resident
// anchors). CPU twin: WeightMemory::check_planes (model/weight_memory.cpp); the GPU test compares refusals.
// One thread per 16-byte chunk of a plane (a grid-stride loop over the chunks of all planes): a 16-byte
// aligned full chunk is one vector load, any other (a plane's short tail, an unaligned plane) byte loads.
#include <cuda_runtime.h>

#include "cuda/refit/check_planes_launch.h"
#include "cuda/refit/new_byte_policy.cuh"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int job_of(const PlaneCheckDevice* jobs, int n, uint64_t chunk) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (jobs[mid].first_chunk <= chunk)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

__global__ void __launch_bounds__(kThreads)
    check_planes(const PlaneCheckDevice* jobs, int n, uint64_t total, unsigned long long* error) {
  for (uint64_t c = blockIdx.x * static_cast<uint64_t>(kThreads) + threadIdx.x; c < total;
       c += static_cast<uint64_t>(gridDim.x) * kThreads) {
    const int j = job_of(jobs, n, c);
    const PlaneCheckDevice job = jobs[j];
    const uint64_t at = (c - job.first_chunk) * 16;
    const uint8_t* p = job.bytes + at;
    const int len = job.size - at < 16 ? static_cast<int>(job.size - at) : 16;
    const int eb = policy_entry_bytes(job.policy);
    uint32_t w[4];
    if (len == 16 && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
      const uint4 v = *reinterpret_cast<const uint4*>(p);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
      for (int k = 0; k < 4; ++k) w[k] = load_le(p + 4 * k, len > 4 * k ? (len - 4 * k < 4 ? len - 4 * k : 4) : 0);
    }
    // note: entries are 1, 2 or 4 bytes and chunks start at multiples of 16, so no entry straddles two.
    for (int e = 0; e * eb < len; ++e) {
      const uint32_t word = w[e * eb / 4] >> (8 * (e * eb % 4));
      if (refused_word(job.policy, eb == 4 ? word : word & ((1u << (8 * eb)) - 1))) {
        const uint64_t entry = at / eb + e;
        atomicMin(error, static_cast<unsigned long long>(j) << kCheckPositionBits | entry);
        break;
      }
    }
  }
}

}  // namespace

cudaError_t launch_check_planes(const PlaneCheckDevice* jobs, int job_count, uint64_t total_chunks,
                                unsigned long long* error, cudaStream_t stream) {
  if (job_count == 0 || total_chunks == 0) return cudaSuccess;
  const uint64_t blocks = (total_chunks + kThreads - 1) / kThreads;
  const auto grid = static_cast<unsigned>(blocks < 132 * 32 ? blocks : 132 * 32);
  check_planes<<<grid, kThreads, 0, stream>>>(jobs, job_count, total_chunks, error);
  return cudaGetLastError();
}

}  // namespace mxq::cuda
