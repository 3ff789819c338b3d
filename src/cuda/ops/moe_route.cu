// Qwen3-MoE routing (HF Qwen3MoeTopKRouter: softmax in f32, top-k, norm_topk_prob) and the grouping a
// grouped expert linear needs: a routing kernel (one warp per token) and a single-CTA grouping kernel:
//   logits      [max_tokens, E] f32 or bf16
//   ids/weights [max_tokens, K] int32 / f32: descending weight, ties → lower expert (cpu
//   TopkTies::kLowerIndex) counts [E], offsets [E + 1], sorted_rows [max_tokens * K], row_of [max_tokens, K]
//   int32 (cpu/moe_route.h)
// Routing: lane l holds experts l, l + 32, ... (registers sized by E); softmax with the row max subtracted
// (expf, f32 warp sum: not the CPU's blocked order, so weights may differ in the last bits); K rounds of a
// warp arg-max (value desc, index asc); the renormalising sum in rank order as the CPU. Grouping: counts by
// shared-memory atomics, a serial scan (E <= 1024), then a stable placement by warp 0 in entry order, 32
// entries a step, ranks among equal experts from __match_any_sync.
// Combine: one CTA per token, its K choices sorted by expert id, f32 multiply-then-add into an f32
// accumulator from 0 (the CPU expert loop's rounding), one bf16 rounding at the end.
#include <cuda_bf16.h>

#include <climits>

#include "cuda/common/bf16_pack.cuh"
#include "cuda/ops/moe_route.h"

namespace mxq::cuda {
namespace {

constexpr int kRouteThreads = 256, kRouteWarps = kRouteThreads / 32;  // one warp per token
constexpr int kGroupThreads = 1024, kMaxExperts = 1024, kMaxK = 32;

// Lane l holds experts l, l + 32, ... (kPerLane of them, E <= 32 * kPerLane).
template <int kPerLane>
__global__ void __launch_bounds__(kRouteThreads) moe_route_kernel(const MoeRouteArgs a) {
  const int T = a.num_tokens ? min(*a.num_tokens, a.max_tokens) : a.max_tokens;
  const int E = a.experts, K = a.top_k;
  const int lane = threadIdx.x % 32;
  const int t = blockIdx.x * kRouteWarps + threadIdx.x / 32;
  if (t >= T) return;
  float p[kPerLane];
  float m = -INFINITY;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    const int e = lane + 32 * r;
    float v = -INFINITY;
    if (e < E)
      v = a.logits_f32
              ? a.logits_f32[static_cast<int64_t>(t) * E + e]
              : __uint_as_float(static_cast<uint32_t>(a.logits_bf16[static_cast<int64_t>(t) * E + e]) << 16);
    p[r] = v;
    m = fmaxf(m, v);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  float sum = 0.0f;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    p[r] = lane + 32 * r < E ? expf(p[r] - m) : 0.0f;
    sum += p[r];
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
  const float inv = 1.0f / sum;
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) p[r] = lane + 32 * r < E ? p[r] * inv : -1.0f;  // -1: not an expert
  float wsum = 0.0f;
  const int64_t row = static_cast<int64_t>(t) * K;
  for (int j = 0; j < K; ++j) {
    float bv = -2.0f;
    int bi = INT_MAX;
#pragma unroll
    for (int r = 0; r < kPerLane; ++r)
      if (p[r] > bv)
        bv = p[r], bi = lane + 32 * r;  // note: ascending r, so the lane's lowest index wins ties
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, o);
      const int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
#pragma unroll
    for (int r = 0; r < kPerLane; ++r)
      if (lane + 32 * r == bi) p[r] = -2.0f;  // taken
    // note: the warp holds identical (bv, bi) after the butterfly; lane j keeps the j-th choice
    if (lane == j) a.ids[row + j] = bi, a.weights[row + j] = bv;
    wsum += bv;  // in rank order, as the CPU's renormalising sum
  }
  __syncwarp();
  if (a.norm_topk_prob && lane < K) a.weights[row + lane] = a.weights[row + lane] / wsum;
}

// Single CTA: counts, offsets and a stable placement of the entries in entry order.
__global__ void __launch_bounds__(kGroupThreads) moe_group_kernel(const MoeRouteArgs a) {
  __shared__ int counts[kMaxExperts];
  __shared__ int cursor[kMaxExperts];
  const int T = a.num_tokens ? min(*a.num_tokens, a.max_tokens) : a.max_tokens;
  const int E = a.experts, n = T * a.top_k;
  for (int e = threadIdx.x; e < E; e += kGroupThreads) counts[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += kGroupThreads) atomicAdd(&counts[a.ids[i]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0, na = 0;
    for (int e = 0; e < E; ++e) {
      a.counts[e] = counts[e];
      a.offsets[e] = run;
      cursor[e] = run;
      run += counts[e];
      if (a.active && counts[e] > 0) a.active[na++] = e;
    }
    a.offsets[E] = run;
    if (a.active)
      for (; na < E; ++na) a.active[na] = -1;
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  for (int base = 0; base < n; base += 32) {
    const int i = base + lane;
    const int e = i < n ? a.ids[i] : -1;
    const unsigned peers = __match_any_sync(0xFFFFFFFFu, e);
    const int rank = __popc(peers & ((1u << lane) - 1));
    if (e >= 0) {
      const int pos = cursor[e] + rank;
      a.sorted_rows[pos] = i;
      a.row_of[i] = pos;
    }
    __syncwarp();
    if (e >= 0 && rank == 0) cursor[e] += __popc(peers);
    __syncwarp();
  }
}

constexpr int kCombineThreads = 128;

__global__ void __launch_bounds__(kCombineThreads)
    moe_combine_kernel(const uint16_t* __restrict__ y, int64_t width, const int32_t* __restrict__ ids,
                       const float* __restrict__ weights, const int32_t* __restrict__ row_of,
                       const int32_t* __restrict__ num_tokens, int K, uint16_t* __restrict__ out) {
  __shared__ int order[kMaxK];
  const int64_t t = blockIdx.x;
  if (num_tokens && t >= *num_tokens) return;
  if (threadIdx.x == 0) {  // insertion sort of the K choices by expert id
    for (int j = 0; j < K; ++j) {
      int k = j;
      while (k > 0 && ids[t * K + order[k - 1]] > ids[t * K + j]) order[k] = order[k - 1], --k;
      order[k] = j;
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x * 8; c < width; c += kCombineThreads * 8) {
    float acc[8] = {};
    for (int jj = 0; jj < K; ++jj) {
      const int64_t i = t * K + order[jj];
      const float w = weights[i];
      const uint4 r = *reinterpret_cast<const uint4*>(y + static_cast<int64_t>(row_of[i]) * width + c);
      const uint32_t words[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        acc[2 * q] = __fadd_rn(acc[2 * q], __fmul_rn(__uint_as_float(words[q] << 16), w));
        acc[2 * q + 1] = __fadd_rn(acc[2 * q + 1], __fmul_rn(__uint_as_float(words[q] & 0xFFFF0000u), w));
      }
    }
    uint32_t packed[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) packed[q] = pack_bf16x2(acc[2 * q], acc[2 * q + 1]);
    *reinterpret_cast<uint4*>(out + t * width + c) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

}  // namespace

cudaError_t launch_moe_route(const MoeRouteArgs& a, cudaStream_t stream) {
  if (a.experts < 1 || a.experts > kMaxExperts || a.top_k < 1 || a.top_k > kMaxK || a.top_k > a.experts ||
      a.max_tokens < 0 || a.max_tokens > INT_MAX / kMaxK ||
      (a.logits_f32 == nullptr) == (a.logits_bf16 == nullptr) || !a.ids || !a.weights || !a.counts ||
      !a.offsets || !a.sorted_rows || !a.row_of)
    return cudaErrorInvalidValue;
  if (a.max_tokens == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>((a.max_tokens + kRouteWarps - 1) / kRouteWarps);
  const int per_lane = (a.experts + 31) / 32;
  if (per_lane <= 1)
    moe_route_kernel<1><<<grid, kRouteThreads, 0, stream>>>(a);
  else if (per_lane <= 2)
    moe_route_kernel<2><<<grid, kRouteThreads, 0, stream>>>(a);
  else if (per_lane <= 4)
    moe_route_kernel<4><<<grid, kRouteThreads, 0, stream>>>(a);
  else if (per_lane <= 8)
    moe_route_kernel<8><<<grid, kRouteThreads, 0, stream>>>(a);
  else if (per_lane <= 16)
    moe_route_kernel<16><<<grid, kRouteThreads, 0, stream>>>(a);
  else
    moe_route_kernel<32><<<grid, kRouteThreads, 0, stream>>>(a);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  moe_group_kernel<<<1, kGroupThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_moe_combine(const uint16_t* y, int64_t width, const int32_t* ids, const float* weights,
                               const int32_t* row_of, const int32_t* num_tokens, int max_tokens, int top_k,
                               uint16_t* out, cudaStream_t stream) {
  if (width < 8 || width % 8 != 0 || top_k < 1 || top_k > kMaxK || max_tokens < 0 || !y || !ids || !weights ||
      !row_of || !out)
    return cudaErrorInvalidValue;
  if (max_tokens == 0) return cudaSuccess;
  moe_combine_kernel<<<static_cast<unsigned>(max_tokens), kCombineThreads, 0, stream>>>(
      y, width, ids, weights, row_of, num_tokens, top_k, out);
  return cudaGetLastError();
}

}  // namespace mxq::cuda
