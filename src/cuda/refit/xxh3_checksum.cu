// XXH3-64 of each tensor's canonical values-then-scales bytes, computed on the device where the live planes
// are, read through their layouts (no gathered copy of the canonical planes). CPU twin: canonical_checksum
// (model/weight_store.cpp, libxxhash); the math is xxh3_device.cuh. Two kernels per batch of tensors:
//   block sums: one warp per full 1024-byte block of any job; lane l reads words l, l+32, l+64, l+96 (its
//     stripe lane i = l % 8 in stripes l/8 + 4t), so each quarter block is one 256-byte coalesced read; the
//     16 stripes' lane shares are summed with two xor-shuffles and lanes 0..7 store the block's 8 sums.
//   finish: 8 threads per job run the scramble chain over the job's block sums (the only sequential part:
//     about 15 ns a block, so a 48 MB tensor takes ~0.75 ms, and all jobs of a batch run side by side), then
//     the tail stripes, the last stripe, the merge; a job of <= 240 bytes takes the short path on one thread.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/refit/refit_launch.h"
#include "cuda/refit/refit_plane.cuh"
#include "cuda/refit/xxh3_device.cuh"

namespace mxq::cuda {
namespace {

namespace x = xxh3;

__device__ __forceinline__ uint8_t canon_byte(const ChecksumJobDevice& j, uint64_t p) {
  const uint64_t vb = static_cast<uint64_t>(j.values.bytes());
  return p < vb ? j.values.native[native_offset(j.values, p)]
                : j.scales.native[native_offset(j.scales, p - vb)];
}

// Canonical stream bytes p..p+7 of a job (p + 8 <= len), any p.
__device__ __forceinline__ uint64_t canon_word(const ChecksumJobDevice& j, uint64_t p) {
  const uint64_t vb = static_cast<uint64_t>(j.values.bytes());
  if (p + 8 <= vb) return plane_word(j.values, p);
  if (p >= vb) return plane_word(j.scales, p - vb);
  uint64_t w = 0;
  for (int k = 0; k < 8; ++k) w |= uint64_t{canon_byte(j, p + k)} << (8 * k);
  return w;
}

// Job of global block g: the last job whose first_block <= g (jobs with no blocks never match a g).
__device__ __forceinline__ int find_job(const ChecksumJobDevice* jobs, int count, uint64_t g) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (jobs[mid].first_block <= g)
      lo = mid;
    else
      hi = mid - 1;
  }
  // note: jobs with zero blocks share first_block with the next job; step to the one that owns g.
  while (lo + 1 < count && jobs[lo + 1].first_block <= g) ++lo;
  return lo;
}

constexpr int kWarpsPerBlock = 8;

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    block_sums(const ChecksumJobDevice* jobs, int count, uint64_t total, uint64_t* sums) {
  const int lane = threadIdx.x & 31, i = lane & 7;
  uint64_t keys[4];
#pragma unroll
  for (int t = 0; t < 4; ++t) keys[t] = x::secret_word(lane / 8 + 4 * t + i);
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * kWarpsPerBlock;
  for (uint64_t g = static_cast<uint64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; g < total;
       g += warps) {
    const int k = find_job(jobs, count, g);
    const ChecksumJobDevice& j = jobs[k];
    const uint64_t base = (g - j.first_block) * x::kBlockBytes;
    const uint64_t vb = static_cast<uint64_t>(j.values.bytes());
    uint64_t words[4];
    // note: a block inside one plane walks rows by increment (one division per block); one that straddles
    // the values/scales boundary reads word by word.
    const bool in_values = base + x::kBlockBytes <= vb, in_scales = base >= vb;
    const DevicePlane& pl = in_values ? j.values : j.scales;
    if ((in_values || in_scales) && !pl.identity()) {
      uint64_t q = (in_values ? base : base - vb) + 8 * lane;
      int64_t r, c;
      row_col(pl, q, r, c);
      const int align = pl.run < 8 ? pl.run : 8;
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        words[t] = c % align == 0 && c + 8 <= pl.row_bytes ? row_word(pl, r, c) : bytewise_word(pl, q);
        q += 256;
        c += 256;
        while (c >= pl.row_bytes) c -= pl.row_bytes, ++r;
      }
    } else {
#pragma unroll
      for (int t = 0; t < 4; ++t) words[t] = canon_word(j, base + 8 * lane + 256 * t);
    }
    uint64_t vsum = 0, msum = 0;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const uint64_t key = words[t] ^ keys[t];
      vsum += words[t];
      msum += (key & 0xFFFFFFFFull) * (key >> 32);
    }
    for (int m = 8; m < 32; m *= 2) {
      vsum += __shfl_xor_sync(0xFFFFFFFFu, vsum, m);
      msum += __shfl_xor_sync(0xFFFFFFFFu, msum, m);
    }
    // lane sum i = its mul shares + the value words of lane i^1
    const uint64_t pair = __shfl_xor_sync(0xFFFFFFFFu, vsum, 1);
    if (lane < 8) sums[g * 8 + i] = msum + pair;
  }
}

constexpr int kFinishThreads = 128;  // 16 jobs per block

__global__ void __launch_bounds__(kFinishThreads)
    finish(const ChecksumJobDevice* jobs, int count, const uint64_t* sums, uint64_t* out) {
  const int tid = blockIdx.x * kFinishThreads + threadIdx.x;
  const int k = tid / 8, i = tid & 7;
  if (k >= count) return;  // note: whole 8-lane groups leave together, the shuffles below stay in-group
  const unsigned mask = 0xFFu << (threadIdx.x & 24);
  const ChecksumJobDevice& j = jobs[k];
  const uint64_t len = j.len;
  if (len <= x::kShortMax) {
    if (i == 0) {
      uint8_t buf[x::kShortMax];
      for (uint64_t p = 0; p < len; ++p) buf[p] = canon_byte(j, p);
      out[k] = x::hash_short(buf, len);
    }
    return;
  }
  uint64_t acc = x::init_acc(i);
  const uint64_t key = x::scramble_key(i);
  const uint64_t blocks = x::full_blocks(len);
  const uint64_t* s = sums + j.first_block * 8 + i;
  // note: the loads do not depend on the chain: batch k+1 is fetched while batch k is chained, so only the
  // scramble is serial (a batch of loads alone would leave the chain waiting on memory latency).
  constexpr int kAhead = 32;
  uint64_t n = 0;
  if (blocks >= kAhead) {
    uint64_t cur[kAhead], next[kAhead];
#pragma unroll
    for (int a = 0; a < kAhead; ++a) cur[a] = s[a * 8];
    for (; n + 2 * kAhead <= blocks; n += kAhead) {
#pragma unroll
      for (int a = 0; a < kAhead; ++a) next[a] = s[(n + kAhead + a) * 8];
#pragma unroll
      for (int a = 0; a < kAhead; ++a) acc = x::scramble(acc + cur[a], key);
#pragma unroll
      for (int a = 0; a < kAhead; ++a) cur[a] = next[a];
    }
#pragma unroll
    for (int a = 0; a < kAhead; ++a) acc = x::scramble(acc + cur[a], key);
    n += kAhead;
  }
  for (; n < blocks; ++n) acc = x::scramble(acc + s[n * 8], key);
  const uint64_t tail = blocks * x::kBlockBytes;
  for (int st = 0; st < x::tail_stripes(len); ++st) {
    const uint64_t p = tail + st * x::kStripeBytes;
    acc += x::stripe_lane(canon_word(j, p + 8 * i), canon_word(j, p + 8 * (i ^ 1)), i, 8 * st);
  }
  const uint64_t last = len - x::kStripeBytes;
  acc +=
      x::stripe_lane(canon_word(j, last + 8 * i), canon_word(j, last + 8 * (i ^ 1)), i, x::kLastStripeSecret);
  uint64_t all[8];
#pragma unroll
  for (int l = 0; l < 8; ++l) all[l] = __shfl_sync(mask, acc, l, 8);
  if (i == 0) out[k] = x::merge(all, len);
}

}  // namespace

uint64_t xxh3_job_blocks(uint64_t len) { return len > x::kShortMax ? x::full_blocks(len) : 0; }

cudaError_t launch_xxh3_block_sums(const ChecksumJobDevice* jobs, int job_count, uint64_t total_blocks,
                                   uint64_t* sums, cudaStream_t stream) {
  if (total_blocks == 0) return cudaSuccess;
  const uint64_t want = (total_blocks + kWarpsPerBlock - 1) / kWarpsPerBlock;
  // note: 132 SMs x 8 resident blocks x 4 waves; more blocks only add binary searches.
  const unsigned grid = static_cast<unsigned>(want < 132 * 32 ? want : 132 * 32);
  block_sums<<<grid, kWarpsPerBlock * 32, 0, stream>>>(jobs, job_count, total_blocks, sums);
  return cudaGetLastError();
}

cudaError_t launch_xxh3_finish(const ChecksumJobDevice* jobs, int job_count, const uint64_t* sums,
                               uint64_t* out, cudaStream_t stream) {
  if (job_count == 0) return cudaSuccess;
  const int blocks = (job_count * 8 + kFinishThreads - 1) / kFinishThreads;
  finish<<<blocks, kFinishThreads, 0, stream>>>(jobs, job_count, sums, out);
  return cudaGetLastError();
}

}  // namespace mxq::cuda
