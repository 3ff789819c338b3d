// Flash-decoding over a paged KV cache: out[s, h] = softmax(q[s, h] · K_s^T / sqrt(D)) · V_s for one query
// token per sequence, GQA (query head h reads KV head h / (Hq / Hkv)).
//   q, out       bf16 [max_seqs, Hq, D]
//   k/v_cache    bf16 [num_blocks, block_size, Hkv, D]; position p of sequence s is slot
//                block_tables[s][p / block_size] * block_size + p % block_size, entry at (slot * Hkv + h) * D
//   block_tables int32 [max_seqs, max_blocks]; seq_lens int32 [max_seqs] (0: padding, output zeroed)
//   workspace    f32: partial outputs [max_seqs, Hq, P, D], then (max, sum) pairs [max_seqs, Hq, P, 2], with
//                P = ceil(max_blocks * block_size / kPart)
// Kernel 1, grid (P, Hkv * head_splits, max_seqs): one CTA per (partition of kPart positions, KV head,
// sequence) serves up to 8 query heads of the group, so K and V are read once per group. Scores in f32 (dot ·
// 1/sqrt(D)), softmax in f32 with the partition max subtracted (expf). A sequence of one partition is written
// to `out` directly; longer ones leave (unnormalised partial, max, sum) per partition. Kernel 2, grid (Hq,
// max_seqs): log-sum-exp merge of the partitions, out = Σ e^(m_p - M) o_p / Σ e^(m_p - M) l_p.
#include <cuda_bf16.h>

#include "cuda/attention/paged_attention_decode.h"
#include "cuda/common/pdl.cuh"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int kPart =
    256;  // positions per partition (split-K unit; 256 gives a 4k-token sequence 16 x Hkv CTAs)
constexpr int kMaxHeads = 8;
constexpr int kUnroll = 4;  // positions a thread loads before using them    // query heads one CTA serves;
                            // larger groups split over grid.y

__device__ __forceinline__ void unpack8(uint4 r, float* f) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
}

int partitions(int max_blocks, int block_size) {
  return static_cast<int>((static_cast<int64_t>(max_blocks) * block_size + kPart - 1) / kPart);
}

// TPT threads share a position (8 elements of D each); NT positions are in flight per CTA pass.
template <int D, int G>
__global__ void __launch_bounds__(kThreads)
    decode_partition_kernel(const PagedDecodeArgs a, int head_splits, int num_parts) {
  constexpr int TPT = D / 8, NT = kThreads / TPT;
  __shared__ float probs[G][kPart];
  __shared__ float row_max[G], row_sum[G];
  __shared__ float red[NT][D];
  pdl::enter();
  const int s = blockIdx.z, part = blockIdx.x;
  const int kvh = blockIdx.y / head_splits, split = blockIdx.y % head_splits;
  const int len = a.seq_lens[s];
  const int start = part * kPart;
  if (start >= len) return;
  const int n = min(kPart, len - start);
  const int group = a.q_heads / a.kv_heads;
  const int heads_per_cta = (group + head_splits - 1) / head_splits;
  const int h0 = kvh * group + split * heads_per_cta;
  const int nh = min(heads_per_cta, group - split * heads_per_cta);
  const int c = threadIdx.x % TPT, tg = threadIdx.x / TPT;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));

  float qf[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (g < nh) {
      unpack8(
          *reinterpret_cast<const uint4*>(a.q + (static_cast<int64_t>(s) * a.q_heads + h0 + g) * D + 8 * c),
          qf[g]);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) qf[g][j] = 0.0f;
    }
  }
  const int32_t* table = a.block_tables + static_cast<int64_t>(s) * a.max_blocks;
  auto entry = [&](int pos) {
    const int64_t slot = static_cast<int64_t>(table[pos / a.block_size]) * a.block_size + pos % a.block_size;
    return (slot * a.kv_heads + kvh) * D + 8 * c;
  };

  // Scores: each position's TPT threads reduce their partial dots with shuffles (all lanes take part).
  // note: kUnroll positions' loads are issued before any math, so a thread keeps several 16-byte reads in
  // flight (one at a time left batch-1 decode latency-bound).
  for (int i0 = 0; i0 < n; i0 += NT * kUnroll) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * NT + tg;
      raw[u] = i < n ? *reinterpret_cast<const uint4*>(a.k_cache + entry(start + i)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * NT + tg;
      float kf[8];
      unpack8(raw[u], kf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) dot += qf[g][j] * kf[j];
#pragma unroll
        for (int o = TPT / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xFFFFFFFFu, dot, o);
        if (c == 0 && i < n && g < nh) probs[g][i] = dot * scale;
      }
    }
  }
  __syncthreads();

  // Softmax per head: one warp per head.
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int g = warp; g < nh; g += kWarps) {
    float m = -INFINITY;
    for (int i = lane; i < n; i += 32) m = fmaxf(m, probs[g][i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    float l = 0.0f;
    for (int i = lane; i < n; i += 32) {
      const float p = expf(probs[g][i] - m);
      probs[g][i] = p;
      l += p;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xFFFFFFFFu, l, o);
    if (lane == 0) row_max[g] = m, row_sum[g] = l;
  }
  __syncthreads();

  // P · V: thread (tg, c) accumulates dims [8c, 8c + 8) over positions tg, tg + NT, ...
  float acc[G][8] = {};
  for (int i0 = tg; i0 < n; i0 += NT * kUnroll) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * NT;
      raw[u] = i < n ? *reinterpret_cast<const uint4*>(a.v_cache + entry(start + i)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = i0 + u * NT;
      if (i >= n) break;
      float vf[8];
      unpack8(raw[u], vf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float p = g < nh ? probs[g][i] : 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g][j] += p * vf[j];
      }
    }
  }

  const bool single = len <= kPart;
  float* tmp = a.workspace;
  float* ml = a.workspace + static_cast<int64_t>(a.max_seqs) * a.q_heads * num_parts * D;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (g >= nh) break;
#pragma unroll
    for (int j = 0; j < 8; ++j) red[tg][8 * c + j] = acc[g][j];
    __syncthreads();
    const int64_t sh = static_cast<int64_t>(s) * a.q_heads + h0 + g;
    for (int d = threadIdx.x; d < D; d += kThreads) {
      float v = 0.0f;
#pragma unroll
      for (int t = 0; t < NT; ++t) v += red[t][d];
      if (single)
        a.out[sh * D + d] = __bfloat16_as_ushort(__float2bfloat16_rn(v / row_sum[g]));
      else
        tmp[(sh * num_parts + part) * D + d] = v;
    }
    if (!single && threadIdx.x == 0) {
      ml[(sh * num_parts + part) * 2] = row_max[g];
      ml[(sh * num_parts + part) * 2 + 1] = row_sum[g];
    }
    __syncthreads();
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads) decode_merge_kernel(const PagedDecodeArgs a, int num_parts) {
  pdl::enter();
  const int h = blockIdx.x, s = blockIdx.y;
  const int64_t sh = static_cast<int64_t>(s) * a.q_heads + h;
  const int len = a.seq_lens[s];
  if (len <= 0) {
    for (int d = threadIdx.x; d < D; d += kThreads) a.out[sh * D + d] = 0;
    return;
  }
  const int np = (len + kPart - 1) / kPart;
  if (np == 1) return;  // written by the partition kernel
  const float* tmp = a.workspace + sh * num_parts * D;
  const float* ml =
      a.workspace + static_cast<int64_t>(a.max_seqs) * a.q_heads * num_parts * D + sh * num_parts * 2;
  float m = -INFINITY;
  for (int p = 0; p < np; ++p) m = fmaxf(m, ml[2 * p]);
  float l = 0.0f;
  for (int p = 0; p < np; ++p) l += expf(ml[2 * p] - m) * ml[2 * p + 1];
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float v = 0.0f;
    for (int p = 0; p < np; ++p) v += expf(ml[2 * p] - m) * tmp[p * D + d];
    a.out[sh * D + d] = __bfloat16_as_ushort(__float2bfloat16_rn(v / l));
  }
}

template <int D>
cudaError_t launch_d(const PagedDecodeArgs& a, cudaStream_t stream) {
  const int group = a.q_heads / a.kv_heads;
  const int splits = (group + kMaxHeads - 1) / kMaxHeads;
  const int per_cta = (group + splits - 1) / splits;
  const int np = partitions(a.max_blocks, a.block_size);
  const dim3 grid(static_cast<unsigned>(np), static_cast<unsigned>(a.kv_heads * splits),
                  static_cast<unsigned>(a.max_seqs));
  auto* part = per_cta <= 1   ? decode_partition_kernel<D, 1>
               : per_cta <= 2 ? decode_partition_kernel<D, 2>
               : per_cta <= 4 ? decode_partition_kernel<D, 4>
                              : decode_partition_kernel<D, 8>;
  if (const cudaError_t e = launch_pdl(part, grid, dim3(kThreads), 0, stream, a, splits, np); e != cudaSuccess)
    return e;
  return launch_pdl(decode_merge_kernel<D>, dim3(static_cast<unsigned>(a.q_heads), static_cast<unsigned>(a.max_seqs)),
                    dim3(kThreads), 0, stream, a, np);
}

}  // namespace

size_t paged_attention_decode_workspace_bytes(int max_seqs, int q_heads, int head_dim, int max_blocks,
                                              int block_size) {
  return static_cast<size_t>(max_seqs) * q_heads * partitions(max_blocks, block_size) * (head_dim + 2) *
         sizeof(float);
}

cudaError_t launch_paged_attention_decode(const PagedDecodeArgs& a, cudaStream_t stream) {
  if ((a.head_dim != 64 && a.head_dim != 128) || a.q_heads < 1 || a.kv_heads < 1 ||
      a.q_heads % a.kv_heads != 0 || a.max_seqs < 1 || a.max_seqs > 65535 || a.max_blocks < 1 ||
      a.block_size < 1 || !a.q || !a.k_cache || !a.v_cache || !a.block_tables || !a.seq_lens ||
      !a.workspace || !a.out)
    return cudaErrorInvalidValue;
  return a.head_dim == 64 ? launch_d<64>(a, stream) : launch_d<128>(a, stream);
}

}  // namespace mxq::cuda
