// Fused attention prologue (HF self_attn.q_norm / k_norm, apply_rotary_pos_emb, past_key_values.update) over
// the qkv projection output of one step. One CTA per token, one warp per head.
//   qkv        bf16 [max_tokens, (Hq + 2 Hkv) * D] row-major: per token Hq q heads, then Hkv k, then Hkv v;
//              or, with k_in / v_in set, q [max_tokens, Hq * D], k and v [max_tokens, Hkv * D] apart (same
//              element order per head; the engine's three projections write there with no copy)
//   q_norm/k_norm bf16 [D], shared by all heads; inv_freq f32 [D / 2] (the CPU's table, so equal angles)
//   positions  int32 [max_tokens]; slot_mapping int32 [max_tokens] (vLLM: block * block_size + offset, < 0
//              skips the KV write: padding tokens of a graph bucket)
//   q_out      bf16 [max_tokens, Hq, D]; k_cache / v_cache bf16 [num_blocks, block_size, Hkv, D], i.e. entry
//              (slot, h) at (slot * Hkv + h) * D: the block size never enters the address
// Numerics (per q/k head, f32): x * 1/sqrt(mean(x^2) + eps) * w, then RoPE (rotate_half: i pairs with
// i + D/2) with angle = f32(position) * inv_freq[i] and sincosf (full-range, not __sinf), rounded once to
// bf16. v is copied bit for bit.
#include <cuda_bf16.h>

#include <climits>

#include "cuda/attention/qk_norm_rope_cache.h"
#include "cuda/common/pdl.cuh"

namespace mxq::cuda {
namespace {

// note: 16 warps: Qwen3-8B has 48 heads a token, 3 per warp, so a small decode step is not a serial loop
constexpr int kWarps = 16;

template <int D>
__global__ void __launch_bounds__(kWarps * 32) qk_norm_rope_cache_kernel(const QkNormRopeArgs a) {
  constexpr int E =
      D / 32;  // elements per lane: lane l holds [l * E, l * E + E); lane l ^ 16 the partner half
  pdl::enter();
  const int64_t t = blockIdx.x;
  if (a.num_tokens && t >= *a.num_tokens) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int heads = a.q_heads + 2 * a.kv_heads;
  const int32_t slot = a.slot_mapping[t];
  const bool write_kv = slot >= 0 && slot < a.num_slots;
  if (slot >= a.num_slots && threadIdx.x == 0) atomicMin(a.bad_token, static_cast<int32_t>(t));
  const float pos = static_cast<float>(a.positions[t]);
  for (int h = warp; h < heads; h += kWarps) {
    const uint16_t* src;
    if (!a.k_in)
      src = a.qkv + (t * heads + h) * D;
    else if (h < a.q_heads)
      src = a.qkv + (t * a.q_heads + h) * D;
    else if (h < a.q_heads + a.kv_heads)
      src = a.k_in + (t * a.kv_heads + h - a.q_heads) * D;
    else
      src = a.v_in + (t * a.kv_heads + h - a.q_heads - a.kv_heads) * D;
    src += lane * E;
    uint16_t raw[E];
    if constexpr (E == 4) {
      *reinterpret_cast<uint2*>(raw) = *reinterpret_cast<const uint2*>(src);
    } else {
      *reinterpret_cast<uint32_t*>(raw) = *reinterpret_cast<const uint32_t*>(src);
    }
    if (h >= a.q_heads + a.kv_heads) {  // v: copy into the cache
      if (!write_kv) continue;
      uint16_t* dst =
          a.v_cache + (static_cast<int64_t>(slot) * a.kv_heads + (h - a.q_heads - a.kv_heads)) * D;
      if constexpr (E == 4) {
        *reinterpret_cast<uint2*>(dst + lane * E) = *reinterpret_cast<uint2*>(raw);
      } else {
        *reinterpret_cast<uint32_t*>(dst + lane * E) = *reinterpret_cast<uint32_t*>(raw);
      }
      continue;
    }
    const bool is_q = h < a.q_heads;
    if (!is_q && !write_kv) continue;
    const uint16_t* w = is_q ? a.q_norm : a.k_norm;
    float x[E], sq = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      x[e] = __uint_as_float(static_cast<uint32_t>(raw[e]) << 16);
      sq += x[e] * x[e];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xFFFFFFFFu, sq, o);
    const float inv = 1.0f / sqrtf(sq / static_cast<float>(D) + a.eps);
    const bool lo = lane < 16;
    uint16_t res[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float wf = __uint_as_float(static_cast<uint32_t>(w[lane * E + e]) << 16);
      const float n = wf * (x[e] * inv);
      const float other = __shfl_xor_sync(0xFFFFFFFFu, n, 16);
      float s, c;
      sincosf(pos * a.inv_freq[(lane & 15) * E + e], &s, &c);
      const float r = lo ? n * c - other * s : n * c + other * s;
      res[e] = __bfloat16_as_ushort(__float2bfloat16_rn(r));
    }
    uint16_t* dst = is_q ? a.q_out + (t * a.q_heads + h) * D
                         : a.k_cache + (static_cast<int64_t>(slot) * a.kv_heads + (h - a.q_heads)) * D;
    if constexpr (E == 4) {
      *reinterpret_cast<uint2*>(dst + lane * E) = *reinterpret_cast<uint2*>(res);
    } else {
      *reinterpret_cast<uint32_t*>(dst + lane * E) = *reinterpret_cast<uint32_t*>(res);
    }
  }
}

}  // namespace

cudaError_t launch_qk_norm_rope_cache(const QkNormRopeArgs& a, cudaStream_t stream) {
  if ((a.head_dim != 64 && a.head_dim != 128) || a.q_heads < 1 || a.kv_heads < 1 || a.max_tokens < 0 ||
      a.max_tokens > INT_MAX || a.num_slots < 0 || !a.qkv || !a.q_norm || !a.k_norm || !a.inv_freq ||
      !a.positions || !a.slot_mapping || !a.q_out || !a.k_cache || !a.v_cache || !a.bad_token ||
      !a.k_in != !a.v_in)
    return cudaErrorInvalidValue;
  if (a.max_tokens == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(a.max_tokens);
  return launch_pdl(a.head_dim == 64 ? qk_norm_rope_cache_kernel<64> : qk_norm_rope_cache_kernel<128>,
                    dim3(grid), dim3(kWarps * 32), 0, stream, a);
}

}  // namespace mxq::cuda
