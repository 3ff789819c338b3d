// Batched full refit on the device: every tensor of a batch written (canonical -> native through its layout)
// or read (hash mode) in one kernel, the XXH3-64 block sums computed from the same registers, and each
// tensor's scramble chain run by the thread block that finishes its last tile. CPU twin: to_native
// (layout/layout.cpp) + canonical_checksum (model/weight_store.cpp, libxxhash); the XXH3 pieces are
// xxh3_device.cuh.
//
// Work split. A tensor's planes are cut into 32 KiB tiles (values tiles then scales tiles); one thread block
// (8 warps) takes one tile, found through a tile -> tensor map filled by a small kernel. A warp takes 1 KiB
// chunks (warp w: chunks w, w + 8, w + 16, w + 24 of the tile) as two halves of 512 bytes, lane l owning the
// 16-byte unit at 16·l of each half, so both sides are 16-byte accesses:
//   canonical: one 16-byte load (write mode) per unit, a warp reads 512 contiguous bytes.
//   native:    identity: one 16-byte access at the same offset. GEMV MXFP8 (DevicePlane::transpose4): the
//              4 lanes of one 64-byte group exchange 4-byte words (a 4x4 transpose through shuffles) and
//              each accesses one 16-byte native vector. Other separable planes: 16/R accesses of R bytes at
//              row_off[r] + cols[c/R + m] (int32 table, coalesced within the row).
//   Every unit's loads of the whole tile are issued before its first store (8 x 16 bytes per thread in
//   flight).
// Block sums. Values bytes are a multiple of 1 KiB (batch_eligible), so each chunk of either plane is exactly
// one 1 KiB block of the tensor's checksum stream (values then scales). Unit (half h, lane l) holds stripe
// s = 8h + l/4, words i = 2(l%4) and i + 1, and XXH3's lane sums are additive:
//   sum[i]   += lo32(w_i ^ k_i)·hi32(w_i ^ k_i) + w_{i+1}
//   sum[i+1] += lo32(w_{i+1} ^ k_{i+1})·hi32(...) + w_i          (k = secret at 8s + 8i, 8s + 8i + 8)
// so a xor-shuffle over lanes with equal l%4 gives the block's 8 sums, stored by lanes 0..3 (16 bytes
// each). Blocks past full_blocks(len) (the tail of XXH3's long path) are not stored.
// Chain. After its tile a block bumps its tensor's counter (threadfence first); the block that brings it to
// `tiles` runs the chain: warps 1..7 stage the next 128 blocks' sums into shared memory while lanes 0..7 of
// warp 0 scramble the current 128 (one 64-bit lane each), then the tail stripes and last stripe (read from
// the canonical sources in write mode, from the live planes in hash mode) and the merge. Tensors are placed
// largest first in the grid, so the longest chains start first and hide under the remaining traffic.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/refit_launch.h"
#include "cuda/refit_plane.cuh"
#include "cuda/xxh3_device.cuh"

namespace mxq::cuda {
namespace {

namespace x = xxh3;

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kChunks = static_cast<int>(kBatchTileBytes / 1024 / kWarps);  // per warp and tile
constexpr int kUnits = 2 * kChunks;                                         // 16-byte units per thread
constexpr int kChainBatch = 128;                                            // blocks staged at a time

__device__ __forceinline__ uint32_t pick4(const uint32_t v[4], int k) {
  uint32_t r = v[0];
  r = k == 1 ? v[1] : r;
  r = k == 2 ? v[2] : r;
  return k == 3 ? v[3] : r;
}

// 4x4 transpose of 4-byte words across the 4 lanes of a quad: lane x gets word y of lane y's word x.
// note: every lane of the warp must call it (full-mask shuffles); round r sends M[x][(x - r) & 3] and
// receives M[(x + r) & 3][x].
__device__ __forceinline__ uint4 quad_transpose(uint4 m, int lane) {
  const uint32_t in[4] = {m.x, m.y, m.z, m.w};
  uint32_t out[4] = {0, 0, 0, 0};
  const int xq = lane & 3;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int src = (xq + r) & 3;
    const uint32_t got = __shfl_sync(0xFFFFFFFFu, pick4(in, (xq - r) & 3), (lane & ~3) | src);
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = src == k ? got : out[k];
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// One 16-byte canonical unit of a separable plane through its `cols` table, row base `nrow`, column c.
template <int R, bool kWrite>
__device__ __forceinline__ void move_parts(const DevicePlane& p, uint8_t* nrow, int64_t c, uint4& v) {
  using T = typename Unit<R>::T;
  T* parts = reinterpret_cast<T*>(&v);
  const int32_t* cols = p.cols + c / R;
#pragma unroll
  for (int m = 0; m < 16 / R; ++m) {
    T* at = reinterpret_cast<T*>(nrow + cols[m]);
    if constexpr (kWrite)
      *at = parts[m];
    else
      parts[m] = *at;
  }
}

template <bool kWrite>
__device__ __forceinline__ void move_separable(const DevicePlane& p, uint8_t* nrow, int64_t c, uint4& v) {
  switch (p.run) {
    case 16:
      move_parts<16, kWrite>(p, nrow, c, v);
      break;
    case 8:
      move_parts<8, kWrite>(p, nrow, c, v);
      break;
    case 4:
      move_parts<4, kWrite>(p, nrow, c, v);
      break;
    case 2:
      move_parts<2, kWrite>(p, nrow, c, v);
      break;
    default:
      move_parts<1, kWrite>(p, nrow, c, v);
  }
}

// Canonical stream bytes p..p+7 of a tensor (p % 8 == 0): from the sources (write mode) or the live planes.
__device__ __forceinline__ uint64_t stream_word(const BatchTensorDevice& t, bool write, uint64_t p) {
  const auto vb = static_cast<uint64_t>(t.values.bytes());
  if (write) return *reinterpret_cast<const uint64_t*>(p < vb ? t.values_src + p : t.scales_src + (p - vb));
  return p < vb ? plane_word(t.values, p) : plane_word(t.scales, p - vb);
}

// Lanes 0..7 of warp 0 of the block finish tensor t; every thread of the block calls it.
__device__ void chain(const BatchTensorDevice& t, bool write, uint64_t* out) {
  __shared__ uint64_t stage[2][kChainBatch * 8];
  const int tid = threadIdx.x, i = tid & 7;
  const uint64_t blocks = x::full_blocks(t.len);
  const uint64_t* s = t.sums;
  const uint64_t batches = (blocks + kChainBatch - 1) / kChainBatch;
  auto load = [&](uint64_t b, int buf, int from, int step) {
    const uint64_t first = b * kChainBatch * 8;
    const uint64_t n = (blocks - b * kChainBatch < kChainBatch ? blocks - b * kChainBatch : kChainBatch) * 8;
    for (uint64_t e = static_cast<uint64_t>(from); e < n; e += static_cast<uint64_t>(step))
      stage[buf][e] = __ldcg(s + first + e);
  };
  uint64_t acc = x::init_acc(i);
  const uint64_t key = x::scramble_key(i);
  if (batches > 0) load(0, 0, tid, kThreads);
  __syncthreads();
  for (uint64_t b = 0; b < batches; ++b) {
    if (tid >= 32 && b + 1 < batches) load(b + 1, static_cast<int>((b + 1) & 1), tid - 32, kThreads - 32);
    if (tid < 8) {
      const uint64_t* cur = stage[b & 1];
      const uint64_t n = blocks - b * kChainBatch < kChainBatch ? blocks - b * kChainBatch : kChainBatch;
      if (n == kChainBatch) {
#pragma unroll 16
        for (int a = 0; a < kChainBatch; ++a) acc = x::scramble(acc + cur[a * 8 + i], key);
      } else {
        for (uint64_t a = 0; a < n; ++a) acc = x::scramble(acc + cur[a * 8 + i], key);
      }
    }
    __syncthreads();
  }
  if (tid >= 8) return;
  const uint64_t tail = blocks * x::kBlockBytes;
  for (int st = 0; st < x::tail_stripes(t.len); ++st) {
    const uint64_t p = tail + static_cast<uint64_t>(st) * x::kStripeBytes;
    acc +=
        x::stripe_lane(stream_word(t, write, p + 8 * i), stream_word(t, write, p + 8 * (i ^ 1)), i, 8 * st);
  }
  const uint64_t last = t.len - x::kStripeBytes;
  acc += x::stripe_lane(stream_word(t, write, last + 8 * i), stream_word(t, write, last + 8 * (i ^ 1)), i,
                        x::kLastStripeSecret);
  uint64_t all[8];
#pragma unroll
  for (int l = 0; l < 8; ++l) all[l] = __shfl_sync(0xFFu, acc, l, 8);
  if (i == 0) *out = x::merge(all, t.len);
}

template <bool kWrite>
__global__ void __launch_bounds__(kThreads)
    refit_batch(const BatchTensorDevice* tensors, const uint32_t* tile_map, unsigned* counters,
                uint64_t* out) {
  __shared__ int is_last;
  const uint32_t tile = blockIdx.x;
  const int k = static_cast<int>(tile_map[tile]);
  const BatchTensorDevice& t = tensors[k];
  const uint32_t local = tile - t.first_tile;
  const bool in_values = local < t.values_tiles;
  const DevicePlane p = in_values ? t.values : t.scales;
  const uint8_t* src = in_values ? t.values_src : t.scales_src;
  const uint64_t stream_off = in_values ? 0 : static_cast<uint64_t>(t.values.bytes());
  const uint64_t tile_q = static_cast<uint64_t>(in_values ? local : local - t.values_tiles) * kBatchTileBytes;
  const auto bytes = static_cast<uint64_t>(p.bytes());
  const uint64_t blocks = x::full_blocks(t.len);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // The 16-byte units of this thread: chunk j (tile chunk warp + 8j), half h.
  uint4 v[kUnits];
  bool ok[kUnits];
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const uint64_t q =
        tile_q + static_cast<uint64_t>(warp + kWarps * (u / 2)) * 1024 + (u % 2) * 512 + 16 * lane;
    ok[u] = q < bytes;
    v[u] = make_uint4(0, 0, 0, 0);
    if constexpr (kWrite) {
      if (ok[u]) v[u] = __ldcs(reinterpret_cast<const uint4*>(src + q));
    } else if (p.identity()) {
      if (ok[u]) v[u] = *reinterpret_cast<const uint4*>(p.native + q);
    } else {
      int64_t r, c;
      row_col(p, q, r, c);
      uint8_t* nrow = p.native + p.row_off[ok[u] ? r : 0];
      if (p.transpose4) {
        if (ok[u]) v[u] = *reinterpret_cast<const uint4*>(nrow + (c & ~int64_t{63}) + 16 * (lane & 3));
        v[u] = quad_transpose(v[u], lane);
      } else if (ok[u]) {
        move_separable<false>(p, nrow, c, v[u]);
      }
    }
  }
  if constexpr (kWrite) {
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const uint64_t q =
          tile_q + static_cast<uint64_t>(warp + kWarps * (u / 2)) * 1024 + (u % 2) * 512 + 16 * lane;
      if (p.identity()) {
        if (ok[u]) __stcs(reinterpret_cast<uint4*>(p.native + q), v[u]);
        continue;
      }
      int64_t r, c;
      row_col(p, q, r, c);
      uint8_t* nrow = p.native + p.row_off[ok[u] ? r : 0];
      if (p.transpose4) {
        const uint4 w = quad_transpose(v[u], lane);
        if (ok[u]) __stcs(reinterpret_cast<uint4*>(nrow + (c & ~int64_t{63}) + 16 * (lane & 3)), w);
      } else if (ok[u]) {
        move_separable<true>(p, nrow, c, v[u]);
      }
    }
  }
  // Block sums of this tile's chunks.
  const int i = 2 * (lane & 3);
  uint64_t ka[2], kb[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int s = 8 * h + lane / 4;
    ka[h] = x::secret_word(s + i);
    kb[h] = x::secret_word(s + i + 1);
  }
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    uint64_t a = 0, b = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4& w = v[2 * j + h];
      const uint64_t w0 = uint64_t{w.x} | uint64_t{w.y} << 32, w1 = uint64_t{w.z} | uint64_t{w.w} << 32;
      x::unit_terms(w0, w1, ka[h], kb[h], a, b);
    }
#pragma unroll
    for (int m = 4; m < 32; m *= 2) {
      a += __shfl_xor_sync(0xFFFFFFFFu, a, m);
      b += __shfl_xor_sync(0xFFFFFFFFu, b, m);
    }
    const uint64_t cq = tile_q + static_cast<uint64_t>(warp + kWarps * j) * 1024;
    const uint64_t block = (stream_off + cq) / 1024;
    // note: a chunk past the plane's end holds zeros and no block; the stream's last (partial or tail) block
    // is read by the chain itself.
    if (lane < 4 && cq < bytes && block < blocks)
      *reinterpret_cast<ulonglong2*>(t.sums + block * 8 + i) = make_ulonglong2(a, b);
  }
  // note: every thread that stored sums fences before the count (the CUDA threadFenceReduction pattern).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    is_last = atomicAdd(counters + k, 1u) == t.tiles - 1;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  chain(t, kWrite, out + k);
}

__global__ void __launch_bounds__(kThreads) chains_only(const BatchTensorDevice* tensors, uint64_t* out) {
  chain(tensors[blockIdx.x], false, out + blockIdx.x);
}

__global__ void fill_tile_map(const BatchTensorDevice* tensors, int count, uint32_t total, uint32_t* map) {
  const uint32_t tile = blockIdx.x * 256u + threadIdx.x;
  if (tile >= total) return;
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tensors[mid].first_tile <= tile)
      lo = mid;
    else
      hi = mid - 1;
  }
  map[tile] = static_cast<uint32_t>(lo);
}

}  // namespace

cudaError_t launch_refit_chains(const BatchTensorDevice* tensors, int count, uint64_t* out,
                                cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  chains_only<<<count, kThreads, 0, stream>>>(tensors, out);
  return cudaGetLastError();
}

cudaError_t launch_refit_batch(bool write, const BatchTensorDevice* tensors, int count, uint32_t total_tiles,
                               uint32_t* tile_map, unsigned* counters, uint64_t* out, cudaStream_t stream) {
  if (count == 0 || total_tiles == 0) return cudaSuccess;
  if (cudaError_t e = cudaMemsetAsync(counters, 0, sizeof(unsigned) * static_cast<size_t>(count), stream))
    return e;
  fill_tile_map<<<(total_tiles + 255) / 256, 256, 0, stream>>>(tensors, count, total_tiles, tile_map);
  if (write)
    refit_batch<true><<<total_tiles, kThreads, 0, stream>>>(tensors, tile_map, counters, out);
  else
    refit_batch<false><<<total_tiles, kThreads, 0, stream>>>(tensors, tile_map, counters, out);
  return cudaGetLastError();
}

}  // namespace mxq::cuda
