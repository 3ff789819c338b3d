// Batched full refit on the device: every tensor of a batch written (canonical -> native through its layout)
// or read (hash mode) in one kernel, the XXH3-64 block sums computed from the same registers, and each
// tensor's scramble chain run by the thread block that finishes its last tile. CPU twin: to_native
// (layout/layout.cpp) + canonical_checksum (model/weight_store.cpp, libxxhash); the XXH3 pieces are
// xxh3_device.cuh.
//
// Work split. A tensor's planes are cut into 64 KiB tiles (values tiles then scales tiles); one thread block
// (4 warps) takes one tile, found through a tile -> tensor map filled by a small kernel. Each lane pair owns
// one 1 KiB chunk (pair p of warp w: chunk 16w + p of the tile), and lane h of the pair owns its whole
// stripes s = 2k + h (k = 0..7): the 64 canonical bytes of a stripe sit in four 16-byte registers of one
// thread, so the block sums need no cross-lane reduction per stripe.
//   canonical: four 16-byte loads (write mode) per stripe; a warp instruction covers 16 lines of 128 bytes,
//              32 bytes of each (the two stripes of a pair).
//   native:    identity: the same offsets. GEMV MXFP8 (DevicePlane::transpose4): a stripe is one 64-byte
//              group of a row (row_bytes % 64 == 0), whose canonical word (j, t) is native word (t, j): the
//              four native 16-byte vectors are the 4x4 transpose of the four canonical ones, a renaming of
//              registers (no shuffles), at row_off[r] + c (r, c stepped along the stripes, one division per
//              thread). Other separable planes: per 16-byte unit, 16/R accesses of R bytes at
//              row_off[r] + cols[c/R + m] (int32 table).
//   The loads of the next stripes are in flight while one stripe is stored and hashed.
// Block sums. Values bytes are a multiple of 1 KiB (batch_eligible), so each chunk of either plane is exactly
// one 1 KiB block of the tensor's checksum stream (values then scales). A lane adds its stripes' terms to
// 8 lane sums (sum[i] += lo32(w_i ^ k)·hi32(w_i ^ k) + w_{i^1}, k = secret word s + i; the keys are
// constant-bank operands, the lane's parity picked by a mask); one exchange of 4 sums with its pair gives
// each lane 4 of the block's 8 sums, stored as 32 bytes. Blocks past full_blocks(len) (the tail of XXH3's
// long path) are not stored.
// Chain. After its tile a block bumps its tensor's counter (bar.sync, then one thread fences and adds: the
// cooperative-groups grid-sync pattern); the block that brings it to `tiles` runs the chain: warps 1..3
// stream the block sums into a 4-stage shared-memory ring with cp.async while lanes 0..7 of warp 0 scramble
// them (one 64-bit lane each, xxh3::scramble_add: one wide multiply-add on the dependent path per block),
// then the tail stripes and last stripe (read from the canonical sources in write mode, from the live planes
// in hash mode) and the merge. Tensors are placed largest first in the grid, so the longest chains start
// first and hide under the remaining traffic.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/refit/refit_launch.h"
#include "cuda/refit/refit_tile.cuh"

namespace mxq::cuda {
namespace {

using namespace refit_tile;

// The end of a tile, every thread: the pair's exchange of its lane sums, the block's sums stored, the
// tensor's counter bumped, and the chain run by the block that finishes the tensor's last tile.
template <int kSt = kStages>
__device__ __forceinline__ void finish_tile(const BatchTensorDevice& t, int k, bool write,
                                            uint64_t stream_off, uint64_t bq, uint64_t bytes, int h,
                                            const uint64_t (&acc)[8], unsigned* counters, uint64_t* out,
                                            uint64_t (*ring)[kStageBlocks * 8]) {
  __shared__ int is_last;
  store_pair_sums(t, stream_off, bq, bytes, h, acc);
  // note: the cooperative-groups grid-sync pattern: the barrier orders every thread's sums before thread 0's
  // release (cumulative), so only thread 0 waits for the stores to land before the count. A release add,
  // not fence.sc + add: no MEMBAR.SC and no L1 invalidation (CCTL.IVALL) in every block; the last block
  // acquires with its own fence below.
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned before;
    asm volatile("atom.release.gpu.global.add.u32 %0, [%1], 1;"
                 : "=r"(before)
                 : "l"(counters + k)
                 : "memory");
    is_last = before == t.tiles - 1;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  chain<kSt>(t, write, out + k, ring);
}

// note: 4 blocks per SM (128 registers): ptxas would take ~150 for the write mode and run 3.
template <bool kWrite>
__global__ void __launch_bounds__(kThreads, 4)
    refit_batch(const BatchTensorDevice* tensors, const uint32_t* tile_map, unsigned* counters,
                uint64_t* out) {
  __shared__ __align__(16) uint64_t ring[kStages][kStageBlocks * 8];
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
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, h = lane & 1;
  const uint64_t bq = tile_q + static_cast<uint64_t>(warp * kPairs + (lane >> 1)) * 1024;  // the pair's chunk
  uint64_t acc[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0;
  if (bq < bytes) {
    // note: a whole chunk (every one but a plane's last) takes the unpredicated copy.
    const bool full = bq + 1024 <= bytes;
    if (p.identity()) {
      if (full)
        lane_stripes<kIdentity, kWrite, true>(p, src, bq, h, bytes, acc);
      else
        lane_stripes<kIdentity, kWrite, false>(p, src, bq, h, bytes, acc);
    } else if (p.transpose4) {
      if (full)
        lane_stripes<kTranspose4, kWrite, true>(p, src, bq, h, bytes, acc);
      else
        lane_stripes<kTranspose4, kWrite, false>(p, src, bq, h, bytes, acc);
    } else {
      lane_stripes<kSeparable, kWrite, false>(p, src, bq, h, bytes, acc);
    }
  }
  finish_tile(t, k, kWrite, stream_off, bq, bytes, h, acc, counters, out, ring);
}

// ---- Staged write (launch_refit_batch with staged = true)
// -------------------------------------------------- The same write, with the canonical tile copied into
// shared memory first, one half of every 1 KiB chunk at a time (half 0 = its first 512 bytes, then half 1):
// every thread issues its share of the half tile's 32 KiB as 16-byte cp.async (a warp copies 512 contiguous
// bytes a step: whole lines); then each lane reads its stripes of the half back from shared memory (chunks
// skewed by 16 bytes: a quarter-warp's 16-byte reads hit 8 distinct bank groups) and adds them to its lane
// sums as above. When the tile's native image is one contiguous range (identity; transpose4 with rows back
// to back, as the GEMV layout has them) the lane puts its stripes back in native order (transposed in place:
// a stripe's native bytes are the same 64-byte range) and, after a barrier, the block stores the half in
// whole lines (the plain kernel's stores cover half of 32 sectors per instruction); otherwise the lane
// stores its stripes through the layout. Other separable planes take the per-unit path of the plain kernel.
// 33 KB of shared memory a block, so 4 blocks fit an SM (16 warps, register-bound); the whole-tile form
// (66.5 KB, 3 blocks) measured 4.47-4.74 ms against this form's 4.45-4.48 ms (bench/history/RESULTS-log.md,
// "Full refit: the half-buffer staged write").
// The chain's ring reuses the buffer once the tile is stored.
constexpr int kChunkUnits = 1024 / 16, kHalfSkewUnits = kChunkUnits / 2 + 1, kTileChunks = kWarps * kPairs;
constexpr size_t kStagedSmem = sizeof(uint4) * kTileChunks * kHalfSkewUnits;
constexpr int kStagedRing = 8;  // the chain's ring slots in the staged buffer (twice the plain kernel's)
static_assert(kStagedSmem >= kRingSlotBytes * kStagedRing,
              "the chain's ring fits in the half tile's shared memory");

// Half `half` (units 32·half .. 32·half + 31 of every chunk) of the tile at g (len bytes there, a multiple
// of 16) into `tile` (32 units a chunk); units past len are zeros. One cp.async group.
__device__ __forceinline__ void stage_half(const uint8_t* g, uint64_t len, uint4* tile, int half) {
#pragma unroll 4
  for (int i = 0; i < kTileChunks * 32 / kThreads; ++i) {
    const int u = i * kThreads + static_cast<int>(threadIdx.x);
    const int c = u >> 5, w = (u & 31) + 32 * half;
    const uint64_t off = static_cast<uint64_t>(c) * 1024 + 16 * static_cast<uint64_t>(w);
    uint4* dst = tile + c * kHalfSkewUnits + (u & 31);
    if (off < len)
      cp_async16(dst, g + off);
    else
      *dst = make_uint4(0, 0, 0, 0);
  }
  cp_async_commit();
}

// Stripes 2k + h, k = k0..k0+3, of the lane's chunk (unit 8·k0 of it staged at `chunk`) hashed, and stored
// through the layout (kBack false) or, for a plane whose native tile is one contiguous range (identity, or
// transpose4 with rows back to back), put back into shared memory in native order (transpose4: transposed in
// place) for store_out_half.
template <Kind kKind, bool kFull, bool kBack>
__device__ __forceinline__ void staged_stripes(const DevicePlane& p, uint4* chunk, uint64_t bq, int h, int k0,
                                               uint64_t bytes, StripeCursor& cur, uint64_t (&acc)[8]) {
  const uint64_t hm = 0ull - static_cast<uint64_t>(h);
#pragma unroll
  for (int k = k0; k < k0 + 4; ++k) {
    const uint64_t q = bq + 64 * static_cast<uint64_t>(h) + 128 * static_cast<uint64_t>(k);
    uint4 v[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) v[m] = chunk[8 * (k - k0) + 4 * h + m];
    if constexpr (kBack) {
      if constexpr (kKind == kTranspose4) {
        uint4 w[4] = {v[0], v[1], v[2], v[3]};
        transpose4(w);
#pragma unroll
        for (int m = 0; m < 4; ++m) chunk[8 * (k - k0) + 4 * h + m] = w[m];
      }
    } else if constexpr (kKind == kTranspose4) {
      if (kFull || q < bytes) store_stripe_transposed(cur, p, v);
    } else {
#pragma unroll
      for (int m = 0; m < 4; ++m)
        if (kFull || q + 16 * m < bytes) __stcs(reinterpret_cast<uint4*>(p.native + q + 16 * m), v[m]);
    }
    add_stripe(v, k, hm, acc);
  }
}

template <Kind kKind, bool kBack>
__device__ __forceinline__ void staged_half(const DevicePlane& p, uint4* chunk, uint64_t bq, int h, int k0,
                                            uint64_t bytes, StripeCursor& cur, uint64_t (&acc)[8]) {
  if (bq + 1024 <= bytes)
    staged_stripes<kKind, true, kBack>(p, chunk, bq, h, k0, bytes, cur, acc);
  else
    staged_stripes<kKind, false, kBack>(p, chunk, bq, h, k0, bytes, cur, acc);
}

// Half `half` of every chunk of the tile from shared memory to native bytes at `to`: a warp
// stores 512 contiguous bytes a step.
__device__ __forceinline__ void store_out_half(const uint4* tile, uint8_t* to, uint64_t len, int half) {
#pragma unroll 4
  for (int i = 0; i < kTileChunks * 32 / kThreads; ++i) {
    const int u = i * kThreads + static_cast<int>(threadIdx.x);
    const int c = u >> 5, w = u & 31;
    const uint64_t off = static_cast<uint64_t>(c) * 1024 + 512 * static_cast<uint64_t>(half) + 16 * w;
    if (off < len) __stcs(reinterpret_cast<uint4*>(to + off), tile[c * kHalfSkewUnits + w]);
  }
}

__global__ void __launch_bounds__(kThreads, 4)
    refit_write_staged(const BatchTensorDevice* tensors, const uint32_t* tile_map, unsigned* counters,
                       uint64_t* out) {
  extern __shared__ __align__(16) uint4 staged[];
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
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, h = lane & 1;
  const int pair_chunk = warp * kPairs + (lane >> 1);
  const uint64_t bq = tile_q + static_cast<uint64_t>(pair_chunk) * 1024;
  uint64_t acc[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0;
  // note: the kind is the same for the whole block (one plane per tile), so the barriers below are uniform.
  if (!p.identity() && !p.transpose4) {
    if (bq < bytes) lane_stripes<kSeparable, true, false>(p, src, bq, h, bytes, acc);
  } else {
    const uint64_t len = bytes - tile_q < kBatchTileBytes ? bytes - tile_q : kBatchTileBytes;
    // note: back: the native tile is one contiguous range, written by store_out_half in whole lines;
    // otherwise (transpose4 rows apart) each lane stores its stripes through the cursor.
    const bool back = p.identity() || p.rows_contiguous;
    StripeCursor cur;
    if (!back && bq < bytes) row_col(p, bq + 64 * static_cast<uint64_t>(h), cur.r, cur.c);
    auto hash_half = [&](uint4* chunk, int half) {
      if (bq >= bytes) return;
      if (p.identity())
        staged_half<kIdentity, true>(p, chunk, bq, h, 4 * half, bytes, cur, acc);
      else if (back)
        staged_half<kTranspose4, true>(p, chunk, bq, h, 4 * half, bytes, cur, acc);
      else
        staged_half<kTranspose4, false>(p, chunk, bq, h, 4 * half, bytes, cur, acc);
    };
    const int64_t base = p.identity() ? 0 : (back ? p.row_off[0] : 0);
    uint4* chunk = staged + pair_chunk * kHalfSkewUnits;
    for (int half = 0; half < 2; ++half) {
      stage_half(src + tile_q, len, staged, half);
      cp_async_wait<0>();
      __syncthreads();
      hash_half(chunk, half);
      if (back) {
        __syncthreads();
        store_out_half(staged, p.native + base + tile_q, len, half);
      }
      __syncthreads();  // note: the next half (or the chain's ring) reuses the buffer
    }
  }
  finish_tile<kStagedRing>(t, k, true, stream_off, bq, bytes, h, acc, counters, out,
                           reinterpret_cast<uint64_t(*)[kStageBlocks * 8]>(staged));
}

// note: 12 ring slots (48 KiB, the static limit): these chains run beside the warp write at full
// bandwidth (refit_write_warp.cu).
constexpr int kChainsRing = 12;
__global__ void __launch_bounds__(kThreads) chains_only(const BatchTensorDevice* tensors, uint64_t* out) {
  __shared__ __align__(16) uint64_t ring[kChainsRing][kStageBlocks * 8];
  chain<kChainsRing>(tensors[blockIdx.x], false, out + blockIdx.x, ring);
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

cudaError_t launch_fill_tile_map(const BatchTensorDevice* tensors, int count, uint32_t total_tiles,
                                 uint32_t* tile_map, cudaStream_t stream) {
  fill_tile_map<<<(total_tiles + 255) / 256, 256, 0, stream>>>(tensors, count, total_tiles, tile_map);
  return cudaGetLastError();
}

cudaError_t launch_refit_chains(const BatchTensorDevice* tensors, int count, uint64_t* out,
                                cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  chains_only<<<count, kThreads, 0, stream>>>(tensors, out);
  return cudaGetLastError();
}

cudaError_t launch_refit_batch(bool write, bool staged, const BatchTensorDevice* tensors, int count,
                               uint32_t total_tiles, uint32_t* tile_map, unsigned* counters, uint64_t* out,
                               cudaStream_t stream) {
  if (count == 0 || total_tiles == 0) return cudaSuccess;
  if (cudaError_t e = cudaMemsetAsync(counters, 0, sizeof(unsigned) * static_cast<size_t>(count), stream))
    return e;
  if (cudaError_t e = launch_fill_tile_map(tensors, count, total_tiles, tile_map, stream)) return e;
  if (write && staged) {
    // note: more than the 48 KB of shared memory a launch gets by default; set once per process (the
    // attribute is per function and device: a second device would need it too).
    static const cudaError_t attr = cudaFuncSetAttribute(
        refit_write_staged, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kStagedSmem));
    if (attr != cudaSuccess) return attr;
    refit_write_staged<<<total_tiles, kThreads, kStagedSmem, stream>>>(tensors, tile_map, counters, out);
  } else if (write)
    refit_batch<true><<<total_tiles, kThreads, 0, stream>>>(tensors, tile_map, counters, out);
  else
    refit_batch<false><<<total_tiles, kThreads, 0, stream>>>(tensors, tile_map, counters, out);
  return cudaGetLastError();
}

}  // namespace mxq::cuda
