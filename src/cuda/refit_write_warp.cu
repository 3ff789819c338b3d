// The full refit write by warps (launch_refit_warp, refit_launch.h): the write mode of the batched refit
// (refit_batch.cu) with one warp, a thread block of its own, per 4 KiB unit instead of one 4-warp block per
// 64 KiB tile. CPU twin: to_native (layout/layout.cpp) + canonical_checksum (model/weight_store.cpp,
// libxxhash), as refit_batch.cu.
//
// Why. A standalone study on the H200 (bench/RESULTS.md, session 7) moved 7.163 GB with the XXH3 lane sums
// computed and stored as here: 85.7% of cudaMemcpy with one 64 KiB tile per 4-warp block, 87.3% with 16 KiB
// tiles, 90.3% with one warp per 4 KiB; the plain copies 94-97%. A warp that does one unit and exits leaves
// its slot to the next at once, so the SM always has loads in flight; a block's warps wait for the slowest.
//
// Units. Tile g of the tile map (64 KiB of one plane, as refit_batch.cu) is units 16g..16g+15 of the grid;
// unit u of it is plane bytes [64 KiB·l + 4 KiB·u, +4 KiB), l the tensor's local tile. Lane l loads bytes
// 16l..16l+15 of each of the unit's 8 halves of 512 bytes (8 loads in flight, whole lines a warp
// instruction); half e is stripes 8(e % 2)..8(e % 2) + 7 of 1 KiB block e / 2, lane l holding words 2u and
// 2u + 1 (u = l % 4) of stripe l / 4 of it. XXH3's accumulate is a sum of per-word terms, so each lane adds
// its words' terms to two of the block's 8 lane sums, and 3 butterfly steps over the lanes of equal u give
// the block's sums to lanes 0..3 (two each), stored. Native side: identity, or the GEMV
// transpose4 (each 64-byte stripe's 4x4 transpose of 4-byte words: two butterfly exchanges in the quad)
// at the stripe's native address (one range for rows back to back, else row_off[r] + c). Planes of other
// layouts are not taken (the caller uses refit_batch.cu for a batch that has one).
//
// Chain. After its unit's sums (before its stores) a warp bumps its tile's counter (release); the warp that
// completes a tile bumps the tensor's, and the one that completes the tensor runs its scramble chain
// (warp_chain: the block sums through registers, lanes 0..7 scrambling), then refit_tile's chain_finish.
// Tensors are placed largest first in the grid (the caller sorts them), so the longest chains start first.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda/refit_launch.h"
#include "cuda/refit_tile.cuh"

namespace mxq::cuda {
namespace {

using namespace refit_tile;

constexpr int kUnitBytes = 4096, kUnitsPerTile = static_cast<int>(kBatchTileBytes / kUnitBytes);
constexpr int kHalves = kUnitBytes / 512;
static_assert(kUnitsPerTile == 16, "a tile is 16 units");

// The 4x4 transpose of 4-byte words across the quad of lanes holding one stripe (t = lane % 4): lane t ends
// with word t of each lane's vector, in lane order (canonical vector j, word t -> native vector t, word j).
__device__ __forceinline__ void quad_transpose(uint4& v, int t) {
  const bool b = t & 1, c = t & 2;
  uint32_t s0 = b ? v.x : v.y, s1 = b ? v.z : v.w;
  uint32_t r0 = __shfl_xor_sync(0xFFFFFFFFu, s0, 1), r1 = __shfl_xor_sync(0xFFFFFFFFu, s1, 1);
  if (b)
    v.x = r0, v.z = r1;
  else
    v.y = r0, v.w = r1;
  s0 = c ? v.x : v.z, s1 = c ? v.y : v.w;
  r0 = __shfl_xor_sync(0xFFFFFFFFu, s0, 2), r1 = __shfl_xor_sync(0xFFFFFFFFu, s1, 2);
  if (c)
    v.x = r0, v.y = r1;
  else
    v.z = r0, v.w = r1;
}

// Tensor t's chain by one warp (every lane calls it), from its block sums; lane 0 writes *out. No shared
// memory (a ring of it in every warp's block cost ~5 points of the write, session 7): the warp keeps 16 rows
// of 4 blocks' sums in registers (lane l holds word l % 8 of block 4·row + l / 8), 64 blocks (~1.4 us of
// steps) ahead of the step that uses them; a step takes its word from lane 8q + i by a shuffle, off the
// dependent path. Lanes 8..31 run copies of lanes 0..7's steps.
constexpr int kRows = 16, kRowBlocks = 4, kBatchBlocks = kRows * kRowBlocks;
__device__ __forceinline__ uint64_t sum_word(const BatchTensorDevice& t, uint64_t blocks, uint64_t b,
                                             int lane) {
  const uint64_t blk = b + static_cast<uint64_t>(lane >> 3);
  return blk < blocks ? __ldcg(t.sums + blk * 8 + (lane & 7)) : 0;
}
// The pre-image of y under XXH3's scramble (x -> ((x ^ x >> 47) ^ key)·P mod 2^64): P odd, so P^-1 mod 2^64
// by Newton's iteration (each step doubles the correct low bits: 3 -> 96), and x ^ x >> 47 is its own
// inverse.
__device__ __forceinline__ uint64_t unscramble(uint64_t y, uint64_t key) {
  const uint64_t p = x::kPrime32_1;
  uint64_t inv = p;
  for (int k = 0; k < 5; ++k) inv *= 2 - p * inv;
  const uint64_t z = (y * inv) ^ key;
  return z ^ (z >> 47);
}

__device__ __forceinline__ void warp_chain(const BatchTensorDevice& t, uint64_t* out) {
  const int lane = static_cast<int>(threadIdx.x), i = lane & 7;
  const uint64_t blocks = x::full_blocks(t.len);
  uint64_t row[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) row[r] = sum_word(t, blocks, static_cast<uint64_t>(r) * kRowBlocks, lane);
  const uint64_t key = x::scramble_key(i);
  // note: every block is one scramble_add step (v = scramble(v) + sum: shift, xor, one wide multiply-add on
  // the dependent path) from v = the pre-image of the initial accumulator, so the first block needs no case
  // of its own; the accumulator after the last block is scramble(v) (session 7's first form, acc =
  // scramble(acc + sum), ran ~2x slower than the ring chain).
  uint64_t v = unscramble(x::init_acc(i), key);
  uint64_t b = 0;
  for (; b + kBatchBlocks <= blocks; b += kBatchBlocks) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      uint64_t w[kRowBlocks];
#pragma unroll
      for (int q = 0; q < kRowBlocks; ++q) w[q] = __shfl_sync(0xFFFFFFFFu, row[r], 8 * q + i);
      row[r] = sum_word(t, blocks, b + kBatchBlocks + static_cast<uint64_t>(r) * kRowBlocks, lane);
#pragma unroll
      for (int q = 0; q < kRowBlocks; ++q) v = x::scramble_add(v, key, w[q]);
    }
  }
  // The last partial batch: its rows are loaded (zeros past the end); steps only for real blocks.
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int q = 0; q < kRowBlocks; ++q) {
      const uint64_t w = __shfl_sync(0xFFFFFFFFu, row[r], 8 * q + i);
      if (b + static_cast<uint64_t>(r * kRowBlocks + q) < blocks) v = x::scramble_add(v, key, w);
    }
  }
  const uint64_t acc = x::scramble_add(v, key, 0);
  if (lane < 8) chain_finish(t, true, acc, i, out);
}

// Study variant (MXQ_REFIT_WARP_CHAIN=ring): the chain through a 6-stage shared-memory ring fed by cp.async.
constexpr int kRingStages = 6, kRingBlocks = 16;
__device__ __forceinline__ void ring_chain(const BatchTensorDevice& t, uint64_t* out,
                                           uint64_t (*ring)[kRingBlocks * 8]) {
  const int lane = static_cast<int>(threadIdx.x), i = lane & 7;
  const uint64_t blocks = x::full_blocks(t.len);
  const uint64_t stages = (blocks + kRingBlocks - 1) / kRingBlocks;
  auto stage_blocks = [&](uint64_t b) {
    const uint64_t left = blocks - b * kRingBlocks;
    return static_cast<int>(left < kRingBlocks ? left : kRingBlocks);
  };
  auto issue = [&](uint64_t b) {
    if (b < stages) {
      const int pieces = stage_blocks(b) * 4;
      const uint64_t* from = t.sums + b * kRingBlocks * 8;
      uint64_t* to = ring[b % kRingStages];
      for (int e = lane; e < pieces; e += 32) cp_async16(to + 2 * e, from + 2 * e);
    }
    cp_async_commit();
  };
  for (int b = 0; b < kRingStages - 1; ++b) issue(static_cast<uint64_t>(b));
  uint64_t acc = x::init_acc(i);
  const uint64_t key = x::scramble_key(i);
  for (uint64_t b = 0; b < stages; ++b) {
    cp_async_wait<kRingStages - 2>();
    __syncwarp();
    issue(b + kRingStages - 1);
    const uint64_t* cur = ring[b % kRingStages] + i;
    const int n = stage_blocks(b);
    uint64_t v = acc + cur[0];
    if (n == kRingBlocks) {
#pragma unroll
      for (int a = 1; a < kRingBlocks; ++a) v = x::scramble_add(v, key, cur[a * 8]);
    } else {
      for (int a = 1; a < n; ++a) v = x::scramble_add(v, key, cur[a * 8]);
    }
    acc = x::scramble_add(v, key, 0);
  }
  cp_async_wait<0>();
  if (lane < 8) chain_finish(t, true, acc, i, out);
}

__device__ __forceinline__ unsigned add_release(unsigned* at) {
  unsigned before;
  asm volatile("atom.release.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(at) : "memory");
  return before;
}

// counters: count tensor counters, then one a tile. kChain: 0 register rows, 1 ring, 2 none (no counting
// either: the chains run after, launch_refit_chains).
template <int kChain>
__global__ void __launch_bounds__(32, 32)
    refit_write_warp(const BatchTensorDevice* tensors, int count, const uint32_t* tile_map,
                     unsigned* counters, uint64_t* out) {
  const uint32_t tile = blockIdx.x / kUnitsPerTile;
  const int k = static_cast<int>(tile_map[tile]);
  const BatchTensorDevice& t = tensors[k];
  const uint32_t local = tile - t.first_tile;
  const bool in_values = local < t.values_tiles;
  const DevicePlane& p = in_values ? t.values : t.scales;
  const uint8_t* src = in_values ? t.values_src : t.scales_src;
  const uint64_t stream_off = in_values ? 0 : static_cast<uint64_t>(t.values.bytes());
  const uint64_t q0 = static_cast<uint64_t>(in_values ? local : local - t.values_tiles) * kBatchTileBytes +
                      static_cast<uint64_t>(blockIdx.x % kUnitsPerTile) * kUnitBytes;
  const auto bytes = static_cast<uint64_t>(p.bytes());
  const int lane = static_cast<int>(threadIdx.x), u = lane & 3;
  const uint64_t first = q0 + 16 * static_cast<uint64_t>(lane);
  const bool full = q0 + kUnitBytes <= bytes;
  uint4 v[kHalves];
  if (q0 < bytes) {
    // Keys: half e = 2c + h of block c is stripes 8h.., lane l holds words 2u, 2u + 1 of stripe 8h + l/4:
    // secret words 8h + l/4 + 2u and the next.
    uint64_t key[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = 8 * h + (lane >> 2) + 2 * u;
      key[h][0] = x::secret_word(j), key[h][1] = x::secret_word(j + 1);
    }
#pragma unroll
    for (int e = 0; e < kHalves; ++e) {
      const uint64_t q = first + 512 * static_cast<uint64_t>(e);
      v[e] = full || q < bytes ? __ldcs(reinterpret_cast<const uint4*>(src + q)) : make_uint4(0, 0, 0, 0);
    }
    const uint64_t blocks = x::full_blocks(t.len);
#pragma unroll
    for (int c = 0; c < kHalves / 2; ++c) {
      uint64_t a0 = 0, a1 = 0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4& w = v[2 * c + h];
        x::unit_terms(uint64_t{w.x} | uint64_t{w.y} << 32, uint64_t{w.z} | uint64_t{w.w} << 32, key[h][0],
                      key[h][1], a0, a1);
      }
#pragma unroll
      for (int m = 4; m < 32; m *= 2) {
        a0 += __shfl_xor_sync(0xFFFFFFFFu, a0, m);
        a1 += __shfl_xor_sync(0xFFFFFFFFu, a1, m);
      }
      // note: a block past the plane's end holds zeros and is no full block; the stream's last (partial or
      // tail) block is read by the chain itself.
      const uint64_t cq = q0 + 1024 * static_cast<uint64_t>(c);
      const uint64_t block = (stream_off + cq) / 1024;
      if (lane < 4 && cq < bytes && block < blocks)
        *reinterpret_cast<ulonglong2*>(t.sums + block * 8 + 2 * u) = make_ulonglong2(a0, a1);
    }
  }
  // note: the count comes before the unit's stores: the chain reads only the block sums (and the canonical
  // sources), so the release add waits for the 4 lanes' sum stores alone, not for the 4 KiB of stores (a
  // warp that counted after them lived ~2x longer: 6.3-7.0 ms against 4.4 for the staged kernel, session
  // 7). __syncwarp orders every lane's sums before lane 0's release (as the block barrier does in
  // refit_batch.cu); the warp that finishes the tensor acquires with its fence. Two levels, so that a
  // tensor's warps do not all add to one word: a tile's 16 warps count on the tile's word, the warp that
  // completes a tile adds to the tensor's (16 sub-counters a tensor measured 5.7-6.0 ms, session 7).
  __syncwarp();
  unsigned before = 0;
  if (kChain != 2 && lane == 0) before = add_release(counters + count + tile);
  if (q0 < bytes) {
    const bool contiguous = p.identity() || p.rows_contiguous;
    uint8_t* base = p.native + (p.identity() ? 0 : (contiguous ? p.row_off[0] : 0));
#pragma unroll
    for (int e = 0; e < kHalves; ++e) {
      uint4 w = v[e];
      if (p.transpose4) quad_transpose(w, u);  // note: uniform over the warp (one plane a unit)
      const uint64_t q = first + 512 * static_cast<uint64_t>(e);
      if (!full && q >= bytes) continue;
      uint8_t* at;
      if (contiguous) {
        at = base + q;
      } else {
        int64_t r, col;
        row_col(p, q - 16 * static_cast<uint64_t>(u), r, col);
        at = p.native + p.row_off[r] + col + 16 * u;
      }
      __stcs(reinterpret_cast<uint4*>(at), w);
    }
  }
  if (kChain == 2) return;
  before = __shfl_sync(0xFFFFFFFFu, before, 0);
  if (before != kUnitsPerTile - 1) return;
  __threadfence();
  if (lane == 0) before = add_release(counters + k);
  before = __shfl_sync(0xFFFFFFFFu, before, 0);
  if (before != t.tiles - 1) return;
  __threadfence();
  if constexpr (kChain == 1) {
    __shared__ __align__(16) uint64_t ring[kRingStages][kRingBlocks * 8];
    ring_chain(t, out + k, ring);
  } else {
    warp_chain(t, out + k);
  }
}

}  // namespace

cudaError_t launch_refit_warp(const BatchTensorDevice* tensors, int count, uint32_t total_tiles,
                              uint32_t* tile_map, unsigned* counters, uint64_t* out, cudaStream_t stream) {
  if (count == 0 || total_tiles == 0) return cudaSuccess;
  if (total_tiles > kMaxWarpTiles) return cudaErrorInvalidValue;
  if (cudaError_t e =
          cudaMemsetAsync(counters, 0, sizeof(unsigned) * (static_cast<size_t>(count) + total_tiles), stream))
    return e;
  if (cudaError_t e = launch_fill_tile_map(tensors, count, total_tiles, tile_map, stream)) return e;
  // Study switch (session 7): MXQ_REFIT_WARP_CHAIN = rows (default) | ring | after.
  static const int chain = [] {
    const char* e = std::getenv("MXQ_REFIT_WARP_CHAIN");
    return !e ? 0 : std::strcmp(e, "ring") == 0 ? 1 : std::strcmp(e, "after") == 0 ? 2 : 0;
  }();
  const unsigned grid = total_tiles * kUnitsPerTile;
  // Study (session 7): MXQ_REFIT_WARP_TIME with chain == after prints the write and the chains apart.
  static const bool timed = std::getenv("MXQ_REFIT_WARP_TIME") != nullptr;
  if (timed && chain == 2) {
    cudaEvent_t ev[3];
    for (auto& e : ev) cudaEventCreate(&e);
    cudaEventRecord(ev[0], stream);
    refit_write_warp<2><<<grid, 32, 0, stream>>>(tensors, count, tile_map, counters, out);
    cudaEventRecord(ev[1], stream);
    cudaError_t rc = launch_refit_chains(tensors, count, out, stream);
    cudaEventRecord(ev[2], stream);
    cudaEventSynchronize(ev[2]);
    float w = 0, c = 0;
    cudaEventElapsedTime(&w, ev[0], ev[1]);
    cudaEventElapsedTime(&c, ev[1], ev[2]);
    std::fprintf(stderr, "study: warp write %.3f ms, chains-only kernel %.3f ms\n", w, c);
    for (auto& e : ev) cudaEventDestroy(e);
    return rc;
  }
  if (chain == 1)
    refit_write_warp<1><<<grid, 32, 0, stream>>>(tensors, count, tile_map, counters, out);
  else if (chain == 2)
    refit_write_warp<2><<<grid, 32, 0, stream>>>(tensors, count, tile_map, counters, out);
  else
    refit_write_warp<0><<<grid, 32, 0, stream>>>(tensors, count, tile_map, counters, out);
  if (cudaError_t e = cudaGetLastError()) return e;
  if (chain == 2) return launch_refit_chains(tensors, count, out, stream);
  return cudaSuccess;
}

}  // namespace mxq::cuda
