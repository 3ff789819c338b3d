// Causal GQA flash attention (FlashAttention-2 style) of variable-length query chunks over a paged KV cache.
//   q, out      bf16 [max_tokens, Hq, D]; rows of sequence s: [cu_seqlens[s], cu_seqlens[s + 1])
//   k/v_cache   bf16 [num_blocks, block_size, Hkv, D] (slot of position p: block_tables[s][p / block_size] *
//               block_size + p % block_size; entry at (slot * Hkv + h) * D)
//   seq_lens    int32 [max_seqs]: query i of s sits at position seq_lens[s] - q_len + i and sees keys
//               0 ..= that position (so a chunk after a cached prefix attends to the prefix too)
// Grid (ceil(max_tokens / 64) + max_seqs, Hq): a CTA takes the tile-th 64-row query tile of the batch (its
// sequence found by walking cu_seqlens), 4 warps x 16 rows; extra CTAs exit. Keys stream through shared
// memory in tiles of 64, gathered from the paged cache. Scores and P·V on mma.sync m16n8k16 (bf16 in, f32
// accumulate); online softmax in f32 with expf; P rounded to bf16 for the P·V product (as FlashAttention),
// the row sum l kept in f32; out = O / l rounded once to bf16. Scale 1/sqrt(D) applied to the f32 scores.
#include <cuda_bf16.h>

#include "cuda/attention/attention_prefill.h"
#include "cuda/common/bf16_pack.cuh"

namespace mxq::cuda {
namespace {

constexpr int kThreads = 128, BM = 64, BN = 64;

__device__ __forceinline__ void mma_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_u16(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
}

template <int D>
__global__ void __launch_bounds__(kThreads) attention_prefill_kernel(const PrefillArgs a) {
  constexpr int LD = D + 8;  // note: +16 bytes per row puts the 8 rows of a fragment load on distinct banks
  __shared__ __align__(16) uint16_t ks[BN][LD];
  __shared__ __align__(16) uint16_t vs[BN][LD];
  const int h = blockIdx.y;
  int tile = blockIdx.x, s = -1;
  for (int i = 0; i < a.max_seqs; ++i) {
    const int tiles = (a.cu_seqlens[i + 1] - a.cu_seqlens[i] + BM - 1) / BM;
    if (tile < tiles) {
      s = i;
      break;
    }
    tile -= tiles;
  }
  if (s < 0) return;
  const int q_len = a.cu_seqlens[s + 1] - a.cu_seqlens[s], ctx = a.seq_lens[s];
  const int q_first = a.cu_seqlens[s] + tile * BM, rows = min(BM, q_len - tile * BM);
  const int pos0 = ctx - q_len + tile * BM;  // position of the tile's row 0
  const int kvh = h / (a.q_heads / a.kv_heads);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int row_a = warp * 16 + g, row_b = row_a + 8;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));

  uint32_t qa[D / 16][4];
  {
    const uint16_t* qa_row = a.q + (static_cast<int64_t>(q_first + row_a) * a.q_heads + h) * D;
    const uint16_t* qb_row = a.q + (static_cast<int64_t>(q_first + row_b) * a.q_heads + h) * D;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int col = kk * 16 + 2 * t;
      qa[kk][0] = row_a < rows ? *reinterpret_cast<const uint32_t*>(qa_row + col) : 0u;
      qa[kk][1] = row_b < rows ? *reinterpret_cast<const uint32_t*>(qb_row + col) : 0u;
      qa[kk][2] = row_a < rows ? *reinterpret_cast<const uint32_t*>(qa_row + col + 8) : 0u;
      qa[kk][3] = row_b < rows ? *reinterpret_cast<const uint32_t*>(qb_row + col + 8) : 0u;
    }
  }
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int32_t* table = a.block_tables + static_cast<int64_t>(s) * a.max_blocks;
  const int kv_end = min(ctx, pos0 + rows);  // keys the last valid row sees

  for (int n0 = 0; n0 < kv_end; n0 += BN) {
    for (int idx = threadIdx.x; idx < BN * (D / 8); idx += kThreads) {
      const int r = idx / (D / 8), ch = idx % (D / 8), key = n0 + r;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
      if (key < kv_end) {
        const int64_t slot =
            static_cast<int64_t>(table[key / a.block_size]) * a.block_size + key % a.block_size;
        const int64_t off = (slot * a.kv_heads + kvh) * D + ch * 8;
        kv = *reinterpret_cast<const uint4*>(a.k_cache + off);
        vv = *reinterpret_cast<const uint4*>(a.v_cache + off);
      }
      *reinterpret_cast<uint4*>(&ks[r][ch * 8]) = kv;
      *reinterpret_cast<uint4*>(&vs[r][ch * 8]) = vv;
    }
    __syncthreads();

    float sc[BN / 8][4] = {};
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(&ks[j * 8 + g][kk * 16 + 2 * t]);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(&ks[j * 8 + g][kk * 16 + 2 * t + 8]);
        mma_bf16(sc[j], qa[kk], b0, b1);
      }
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e < 2 ? 0 : 1, key = n0 + j * 8 + 2 * t + (e & 1);
        const int qpos = pos0 + (r ? row_b : row_a);
        const float v = key <= qpos && key < kv_end ? sc[j][e] * scale : -INFINITY;
        sc[j][e] = v;
        tile_max[r] = fmaxf(tile_max[r], v);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xFFFFFFFFu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xFFFFFFFFu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // note: a row with nothing visible yet stays 0
      const float alpha = expf(m[r] - m_use);
      m[r] = m_new;
      l[r] *= alpha;
#pragma unroll
      for (int jd = 0; jd < D / 8; ++jd) o[jd][2 * r] *= alpha, o[jd][2 * r + 1] *= alpha;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          sc[j][e] = expf(sc[j][e] - m_use);
          l[r] += sc[j][e];
        }
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16x2(sc[2 * kk][0], sc[2 * kk][1]),
                              pack_bf16x2(sc[2 * kk][2], sc[2 * kk][3]),
                              pack_bf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack_bf16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
      const int k0 = kk * 16 + 2 * t;
#pragma unroll
      for (int jd = 0; jd < D / 8; ++jd) {
        const int col = jd * 8 + g;
        const uint32_t b0 = pack_u16(vs[k0][col], vs[k0 + 1][col]);
        const uint32_t b1 = pack_u16(vs[k0 + 8][col], vs[k0 + 9][col]);
        mma_bf16(o[jd], pa, b0, b1);
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 1);
    l[r] += __shfl_xor_sync(0xFFFFFFFFu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r ? row_b : row_a;
    if (row >= rows) continue;
    uint16_t* dst = a.out + (static_cast<int64_t>(q_first + row) * a.q_heads + h) * D + 2 * t;
    const float inv = 1.0f / l[r];
#pragma unroll
    for (int jd = 0; jd < D / 8; ++jd)
      *reinterpret_cast<uint32_t*>(dst + jd * 8) = pack_bf16x2(o[jd][2 * r] * inv, o[jd][2 * r + 1] * inv);
  }
}

}  // namespace

cudaError_t launch_attention_prefill(const PrefillArgs& a, cudaStream_t stream) {
  if ((a.head_dim != 64 && a.head_dim != 128) || a.q_heads < 1 || a.kv_heads < 1 ||
      a.q_heads % a.kv_heads != 0 || a.max_tokens < 1 || a.max_seqs < 1 || a.max_blocks < 1 ||
      a.block_size < 1 || a.q_heads > 65535 || !a.q || !a.k_cache || !a.v_cache || !a.block_tables ||
      !a.cu_seqlens || !a.seq_lens || !a.out)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((a.max_tokens + BM - 1) / BM + a.max_seqs),
                  static_cast<unsigned>(a.q_heads));
  if (a.head_dim == 64)
    attention_prefill_kernel<64><<<grid, kThreads, 0, stream>>>(a);
  else
    attention_prefill_kernel<128><<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace mxq::cuda
