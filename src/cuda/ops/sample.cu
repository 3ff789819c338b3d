// On-GPU sampling, vLLM's order as cpu/sampling: logits / temperature, min-p, top-k, top-p, one draw by
// inverse CDF over token ids; greedy = argmax (ties → lowest id). One CTA of 1024 threads per sequence.
//   logits f32 [max_seqs, vocab]; per-sequence params f32/int32/u64 [max_seqs]; outputs token int32,
//   logprob f32 (log_softmax of the unscaled logits), status int32 [max_seqs]
// The masks are found without sorting, as thresholds over an order key, one 8-bit radix digit a pass:
//   value key  ordered(v): the f32 bits mapped so unsigned order = float order (-0 folded into +0)
//   top-k      the k-th largest value key from per-digit counts (4 passes): tokens below it masked
//   top-p      order key (ordered(v) << 32) | (2^32 - 1 - id), the CPU's ascending sort with ties by
//              descending id; per-digit probability mass in 2^-40 fixed point (integer atomics: exact and
//              order-free) finds the first key whose inclusive mass exceeds 1 - top_p (8 passes); keys
//              below it are masked, never the largest key
//   draw       u = top 53 bits of philox_random_bits(seed, step) · 2^-53; weights exp(f64(v - max)) summed
//              in f64 over contiguous id chunks, a block scan of the chunk sums, the first id whose
//              cumulative weight exceeds u · total (zero weights skipped, as the CPU's draw).
// Equal to the CPU twin except where a sum's rounding order moves a mask or the draw across a boundary
// (f32 softmax sums; relative 1e-7 windows), which random logits hit with probability ~1e-6 per draw.
// note: the passes re-read the row (L2-resident) up to 14 times; a candidate pre-filter would cut that.
#include <cfloat>
#include <climits>

#include "cpu/philox.h"
#include "cuda/ops/sample.h"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 1024, kWarps = kThreads / 32;
constexpr float kGreedyTemperature = 1e-5f;  // vLLM's _SAMPLING_EPS, as cpu/sampling

__device__ __forceinline__ uint32_t ordered(float v) {
  const uint32_t b = __float_as_uint(v + 0.0f);  // note: -0 + 0 = +0, so ±0 tie as in the CPU's compare
  return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

// Block-wide reduction; every thread gets the result. `scratch` holds kWarps values of T.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  __syncthreads();  // note: scratch may still be read by the previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = scratch[0];
  for (int w = 1; w < kWarps; ++w) r = op(r, scratch[w]);
  return r;
}

struct Row {
  const float* x;
  int64_t vocab;
  float temperature, min_p, minp_threshold, m;  // m: max scaled logit
  float inv_sum1;                               // 1 / Σ exp(s - m) over all tokens (min-p)
  bool use_min_p, use_top_k;
  uint32_t kth;  // value key of the k-th largest (top-k)
  __device__ float scaled(int64_t i) const { return x[i] / temperature; }
  // The value after min-p and top-k, -inf when masked.
  __device__ float masked(int64_t i) const {
    const float v = scaled(i);
    if (use_min_p && expf(v - m) * inv_sum1 < minp_threshold) return -INFINITY;
    if (use_top_k && ordered(v) < kth) return -INFINITY;
    return v;
  }
};

__global__ void __launch_bounds__(kThreads) sample_kernel(const SampleArgs a) {
  __shared__ float f_scratch[kWarps];
  __shared__ double d_scratch[kWarps];
  __shared__ unsigned long long u_scratch[kWarps];
  __shared__ int i_scratch[kWarps];
  __shared__ int count_hist[256];
  __shared__ unsigned long long mass_hist[256];
  __shared__ int digit, carried;
  __shared__ unsigned long long u_carried;
  const int s = blockIdx.x;
  if (a.num_seqs && s >= *a.num_seqs) return;
  const int64_t V = a.vocab;
  const float* x = a.logits + s * V;
  const int tid = threadIdx.x;

  // Raw max, first argmax, bad logits.
  float mx = -INFINITY;
  int best = INT_MAX;
  int bad = 0;
  for (int64_t i = tid; i < V; i += kThreads) {
    const float v = x[i];
    if (isnan(v) || v == INFINITY) bad = 1;
    if (v > mx) mx = v, best = static_cast<int>(i);
  }
  bad = block_reduce(
      bad, [](int p, int q) { return p | q; }, i_scratch);
  const float m_raw = block_reduce(
      mx, [](float p, float q) { return fmaxf(p, q); }, f_scratch);
  if (bad || m_raw == -INFINITY) {
    if (tid == 0) a.token[s] = -1, a.logprob[s] = NAN, a.status[s] = bad ? kSampleBadLogit : kSampleAllMasked;
    return;
  }
  const int argmax = block_reduce(
      mx == m_raw ? best : INT_MAX, [](int p, int q) { return min(p, q); }, i_scratch);
  float se = 0.0f;
  for (int64_t i = tid; i < V; i += kThreads) se += expf(x[i] - m_raw);
  const float log_sum = logf(block_reduce(
      se, [](float p, float q) { return p + q; }, f_scratch));

  int token = argmax;
  const float temperature = a.temperature[s];
  if (!(temperature < kGreedyTemperature)) {
    Row r{x, V, temperature, a.min_p[s], 0.0f, 0.0f, 1.0f, false, false, 0u};
    r.m = m_raw / temperature;  // note: x / t is monotone in x, so the scaled max is the max's scaled value
    r.use_min_p = r.min_p > 0.0f;
    if (r.use_min_p) {
      float s1 = 0.0f;
      for (int64_t i = tid; i < V; i += kThreads) s1 += expf(r.scaled(i) - r.m);
      r.inv_sum1 = 1.0f / block_reduce(
                              s1, [](float p, float q) { return p + q; }, f_scratch);
      r.minp_threshold = r.min_p * (1.0f * r.inv_sum1);  // the CPU's min_p * max(probs)
    }
    const int top_k = a.top_k[s];
    if (top_k > 0 && top_k < V) {
      // k-th largest value key, one 8-bit digit a pass from the top: count the candidates per digit, walk the
      // digits downwards until k is reached.
      uint32_t prefix = 0;
      int remaining = top_k;
      for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += kThreads) count_hist[b] = 0;
        __syncthreads();
        const uint32_t high = shift == 24 ? 0u : prefix >> (shift + 8);
        for (int64_t i = tid; i < V; i += kThreads) {
          const uint32_t key = ordered(r.masked(i));
          if ((shift == 24 || key >> (shift + 8) == high)) atomicAdd(&count_hist[(key >> shift) & 255u], 1);
        }
        __syncthreads();
        if (tid == 0) {
          int d = 255;
          for (; d > 0 && count_hist[d] < remaining; --d) remaining -= count_hist[d];
          digit = d;
          carried = remaining;
        }
        __syncthreads();
        prefix |= static_cast<uint32_t>(digit) << shift;
        remaining = carried;
      }
      r.kth = prefix;
      r.use_top_k = true;
    }
    // top-p: the masked row's probabilities in 2^-40 fixed point (integer sums: order-free, deterministic),
    // then the order key of the first token whose inclusive ascending cumulative exceeds 1 - top_p, one 8-bit
    // digit of the 64-bit key a pass; every key below it is masked, never the last (largest) key.
    const float top_p = a.top_p[s];
    unsigned long long cross_key = 0, last_key = 0;
    const bool use_top_p = top_p < 1.0f;
    if (use_top_p) {
      float s2 = 0.0f;
      unsigned long long kmax = 0;
      for (int64_t i = tid; i < V; i += kThreads) {
        const float v = r.masked(i);
        s2 += expf(v - r.m);
        const unsigned long long key = static_cast<unsigned long long>(ordered(v)) << 32 | (0xFFFFFFFFu - i);
        kmax = key > kmax ? key : kmax;
      }
      const float inv_sum2 = 1.0f / block_reduce(
                                        s2, [](float p, float q) { return p + q; }, f_scratch);
      last_key = block_reduce(
          kmax, [](unsigned long long p, unsigned long long q) { return p > q ? p : q; }, u_scratch);
      const unsigned long long cut = __float2ull_rn((1.0f - top_p) * 0x1p40f);
      unsigned long long prefix = 0, below = 0;  // below: mass of keys under the current digit range
      bool crossing = true;
      for (int shift = 56; shift >= 0 && crossing; shift -= 8) {
        for (int b = tid; b < 256; b += kThreads) mass_hist[b] = 0;
        __syncthreads();
        for (int64_t i = tid; i < V; i += kThreads) {
          const float v = r.masked(i);
          if (v == -INFINITY) continue;  // note: zero mass
          const unsigned long long key =
              static_cast<unsigned long long>(ordered(v)) << 32 | (0xFFFFFFFFu - i);
          if (shift == 56 || key >> (shift + 8) == prefix >> (shift + 8))
            atomicAdd(&mass_hist[(key >> shift) & 255u], __float2ull_rn(expf(v - r.m) * inv_sum2 * 0x1p40f));
        }
        __syncthreads();
        if (tid == 0) {
          // the digit holding the crossing token: the first whose mass takes the running sum past the cut
          unsigned long long run = below;
          int d = 255;
          bool found = false;
          for (int b = 0; b < 256 && !found; ++b) {
            if (run + mass_hist[b] > cut) {
              d = b;
              found = true;
            } else {
              run += mass_hist[b];
            }
          }
          digit = d;
          u_carried = run;  // mass under digit d
          carried = found;
        }
        __syncthreads();
        if (shift == 56 && !carried) crossing = false;  // the whole row's mass <= cut: keep only the last
        prefix |= static_cast<unsigned long long>(digit) << shift;
        below = u_carried;
      }
      cross_key = crossing ? prefix : last_key;
    }
    auto final_value = [&](int64_t i) {
      const float v = r.masked(i);
      if (use_top_p) {
        const unsigned long long key = static_cast<unsigned long long>(ordered(v)) << 32 | (0xFFFFFFFFu - i);
        if (key < cross_key && key != last_key) return -INFINITY;
      }
      return v;
    };
    // Draw: contiguous chunks per thread so a block scan of chunk sums gives id-ordered prefixes.
    const int64_t chunk = (V + kThreads - 1) / kThreads, lo = tid * chunk, hi = min(V, lo + chunk);
    double part = 0.0;
    int last_kept = -1;
    for (int64_t i = lo; i < hi; ++i) {
      const double w = exp(static_cast<double>(final_value(i) - r.m));
      part += w;
      if (w != 0.0) last_kept = static_cast<int>(i);
    }
    // exclusive scan of `part` over threads (warp scan, then warp totals)
    double incl = part;
    const int lane = tid % 32, warp = tid / 32;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(0xFFFFFFFFu, incl, o);
      if (lane >= o) incl += y;
    }
    __syncthreads();
    if (lane == 31) d_scratch[warp] = incl;
    __syncthreads();
    double before = 0.0, total = 0.0;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) before += d_scratch[w];
      total += d_scratch[w];
    }
    const double prefix = before + incl - part;
    const double target =
        static_cast<double>(philox_random_bits(a.seed[s], a.step[s]) >> 11) * 0x1p-53 * total;
    // note: every chunk the target does not lie past scans to its first hit and the minimum wins, so a target
    // that rounding leaves just past its chunk's own scan still lands on the next kept id, as the CPU's loop.
    int found = INT_MAX;
    if (target < prefix + part) {
      double c = prefix;
      for (int64_t i = lo; i < hi; ++i) {
        const double w = exp(static_cast<double>(final_value(i) - r.m));
        if (w == 0.0) continue;
        c += w;
        if (target < c) {
          found = static_cast<int>(i);
          break;
        }
      }
    }
    found = block_reduce(
        found, [](int p, int q) { return min(p, q); }, i_scratch);
    // note: rounding can leave target at or past the last cumulative: the CPU then takes the last kept id.
    const int last = block_reduce(
        last_kept, [](int p, int q) { return max(p, q); }, i_scratch);
    token = found != INT_MAX ? found : last;
  }
  if (tid == 0) {
    a.token[s] = token;
    a.logprob[s] = x[token] - m_raw - log_sum;
    a.status[s] = kSampleOk;
  }
}

}  // namespace

cudaError_t launch_sample(const SampleArgs& a, cudaStream_t stream) {
  if (a.vocab < 1 || a.vocab > INT_MAX || a.max_seqs < 1 || !a.logits || !a.temperature || !a.top_k ||
      !a.top_p || !a.min_p || !a.seed || !a.step || !a.token || !a.logprob || !a.status)
    return cudaErrorInvalidValue;
  sample_kernel<<<static_cast<unsigned>(a.max_seqs), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace mxq::cuda
