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

#include "cuda/refit_launch.h"
#include "cuda/refit_plane.cuh"
#include "cuda/xxh3_device.cuh"

namespace mxq::cuda {
namespace {

namespace x = xxh3;

constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kPairs = 16;   // 1 KiB chunks per warp and tile, one per lane pair
constexpr int kStripes = 8;  // stripes per lane: 2k + h
static_assert(kBatchTileBytes == uint64_t{kWarps} * kPairs * 1024, "a tile is one chunk per lane pair");
constexpr int kStageBlocks = 64, kStages = 4;  // chain: block sums staged per ring slot, ring slots

// Secret words for keys whose index is known at compile time (after unrolling): constant-bank operands.
// kStep[j] = kWord[j] ^ kWord[j + 1]: the odd lane of a pair gets word j + 1 as kWord[j] ^ (mask & kStep[j]).
#define MXQ_W(j) x::secret_le64(8 * (j))
#define MXQ_S(j) (x::secret_le64(8 * (j)) ^ x::secret_le64(8 * (j) + 8))
__constant__ uint64_t kWord[23] = {MXQ_W(0),  MXQ_W(1),  MXQ_W(2),  MXQ_W(3),  MXQ_W(4),  MXQ_W(5),
                                   MXQ_W(6),  MXQ_W(7),  MXQ_W(8),  MXQ_W(9),  MXQ_W(10), MXQ_W(11),
                                   MXQ_W(12), MXQ_W(13), MXQ_W(14), MXQ_W(15), MXQ_W(16), MXQ_W(17),
                                   MXQ_W(18), MXQ_W(19), MXQ_W(20), MXQ_W(21), MXQ_W(22)};
__constant__ uint64_t kStep[22] = {MXQ_S(0),  MXQ_S(1),  MXQ_S(2),  MXQ_S(3),  MXQ_S(4),  MXQ_S(5),
                                   MXQ_S(6),  MXQ_S(7),  MXQ_S(8),  MXQ_S(9),  MXQ_S(10), MXQ_S(11),
                                   MXQ_S(12), MXQ_S(13), MXQ_S(14), MXQ_S(15), MXQ_S(16), MXQ_S(17),
                                   MXQ_S(18), MXQ_S(19), MXQ_S(20), MXQ_S(21)};
#undef MXQ_W
#undef MXQ_S

// The 4x4 transpose of 4-byte words between a canonical 64-byte group and its GEMV MXFP8 native form
// (its own inverse): out vector t, word j = in vector j, word t.
__device__ __forceinline__ void transpose4(uint4 (&v)[4]) {
  const uint4 a = v[0], b = v[1], c = v[2], d = v[3];
  v[0] = make_uint4(a.x, b.x, c.x, d.x);
  v[1] = make_uint4(a.y, b.y, c.y, d.y);
  v[2] = make_uint4(a.z, b.z, c.z, d.z);
  v[3] = make_uint4(a.w, b.w, c.w, d.w);
}

// Stripe 2k + h of a block (canonical words in v) into the lane sums; hm = h ? ~0 : 0.
__device__ __forceinline__ void add_stripe(const uint4 (&v)[4], int k, uint64_t hm_in, uint64_t (&acc)[8]) {
  // note: an opaque copy of the mask per stripe, so the compiler forms each key where it is used instead of
  // keeping all 23 lane keys live across the tile (46 registers).
  uint64_t hm;
  asm volatile("mov.b64 %0, %1;" : "=l"(hm) : "l"(hm_in));
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const uint64_t w0 = uint64_t{v[u].x} | uint64_t{v[u].y} << 32;
    const uint64_t w1 = uint64_t{v[u].z} | uint64_t{v[u].w} << 32;
    const int j = 2 * k + 2 * u;  // secret word of lane i = 2u of stripe 2k (+ h)
    x::unit_terms(w0, w1, kWord[j] ^ (hm & kStep[j]), kWord[j + 1] ^ (hm & kStep[j + 1]), acc[2 * u],
                  acc[2 * u + 1]);
  }
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
__device__ __forceinline__ void move_separable(const DevicePlane& p, uint64_t q, uint4& v) {
  int64_t r, c;
  row_col(p, q, r, c);
  uint8_t* nrow = p.native + p.row_off[r];
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

enum Kind { kIdentity, kTranspose4, kSeparable };

// The GEMV native address of successive stripes of a lane (transpose4 planes): row r, column c of the
// next stripe, stepped by 128 canonical bytes (rows are >= 64 bytes, so at most 2 rows at a step), and the
// row's base, reloaded only when the row changes.
struct StripeCursor {
  int64_t r = -1, c = 0;
  int64_t row = -1;
  uint8_t* base = nullptr;
  __device__ __forceinline__ uint8_t* next(const DevicePlane& p) {
    if (r != row) row = r, base = p.native + p.row_off[r];
    uint8_t* at = base + c;
    c += 128;
    while (c >= p.row_bytes) c -= p.row_bytes, ++r;
    return at;
  }
};

// The lane's 8 stripes of the block at plane offset bq: loaded (canonical sources in write mode, the live
// plane in hash mode), stored through the layout (write mode), added to the lane sums. Units at or past
// `bytes` are zeros and not stored (their block is the stream's last, never a full block).
template <Kind kKind, bool kWrite, bool kFull>
__device__ __forceinline__ void lane_stripes(const DevicePlane& p, const uint8_t* src, uint64_t bq, int h,
                                             uint64_t bytes, uint64_t (&acc)[8]) {
  const uint64_t hm = 0ull - static_cast<uint64_t>(h);
  const uint64_t q0 = bq + 64 * static_cast<uint64_t>(h);
  // note: stripes of a transpose4 plane are whole (bytes % 64 == 0); the cursor serves the native side,
  // which is the loads in hash mode and the stores in write mode, in stripe order either way. Hash-mode
  // reads of the live planes go through the read-only path (__ldg: the planes do not change during the
  // kernel; a plain dereference compiled to generic LD).
  StripeCursor cur;
  if constexpr (kKind == kTranspose4) row_col(p, q0, cur.r, cur.c);
  auto load = [&](int k, uint4(&v)[4]) {
    const uint64_t q = q0 + 128 * static_cast<uint64_t>(k);
    if constexpr (!kWrite && kKind == kTranspose4) {
      if (kFull || q < bytes) {
        const uint8_t* at = cur.next(p);
#pragma unroll
        for (int m = 0; m < 4; ++m) v[m] = __ldg(reinterpret_cast<const uint4*>(at + 16 * m));
        transpose4(v);
      } else {
#pragma unroll
        for (int m = 0; m < 4; ++m) v[m] = make_uint4(0, 0, 0, 0);
      }
    } else {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        v[m] = make_uint4(0, 0, 0, 0);
        const bool ok = kFull || q + 16 * m < bytes;
        if constexpr (kWrite) {
          if (ok) v[m] = __ldcs(reinterpret_cast<const uint4*>(src + q + 16 * m));
        } else if constexpr (kKind == kIdentity) {
          if (ok) v[m] = __ldg(reinterpret_cast<const uint4*>(p.native + q + 16 * m));
        } else {
          if (ok) move_separable<false>(p, q + 16 * m, v[m]);
        }
      }
    }
  };
  auto store = [&](int k, const uint4(&v)[4]) {
    const uint64_t q = q0 + 128 * static_cast<uint64_t>(k);
    if constexpr (kKind == kTranspose4) {
      if (kFull || q < bytes) {
        uint4 w[4] = {v[0], v[1], v[2], v[3]};
        transpose4(w);
        uint8_t* at = cur.next(p);
#pragma unroll
        for (int m = 0; m < 4; ++m) __stcs(reinterpret_cast<uint4*>(at + 16 * m), w[m]);
      }
    } else {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        if (!kFull && q + 16 * m >= bytes) continue;
        uint4 w = v[m];
        if constexpr (kKind == kIdentity)
          __stcs(reinterpret_cast<uint4*>(p.native + q + 16 * m), w);
        else
          move_separable<true>(p, q + 16 * m, w);
      }
    }
  };
  // note: kAhead stripes of loads in flight while one is stored and hashed; each load is issued before the
  // earlier stripe's stores (the compiler cannot move loads above stores that may alias).
  if constexpr (kKind == kSeparable) {
    // note: the slow path (layouts the bench does not use): one stripe at a time, not unrolled, so its
    // per-unit run switch does not multiply the kernel's code.
#pragma unroll 1
    for (int k = 0; k < kStripes; ++k) {
      uint4 v[4];
      load(k, v);
      if constexpr (kWrite) store(k, v);
      add_stripe(v, k, hm, acc);
    }
    return;
  }
  constexpr int kAhead = 2;
  uint4 v[kStripes][4];
#pragma unroll
  for (int k = 0; k < kAhead; ++k) load(k, v[k]);
#pragma unroll
  for (int k = 0; k < kStripes; ++k) {
    if (k + kAhead < kStripes) load(k + kAhead, v[k + kAhead]);
    if constexpr (kWrite) store(k, v[k]);
    add_stripe(v[k], k, hm, acc);
  }
}

// 16-byte asynchronous copy global -> shared (L2 only), and its group waits.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Canonical stream bytes p..p+7 of a tensor (p % 8 == 0): from the sources (write mode) or the live planes.
__device__ __forceinline__ uint64_t stream_word(const BatchTensorDevice& t, bool write, uint64_t p) {
  const auto vb = static_cast<uint64_t>(t.values.bytes());
  if (write) return *reinterpret_cast<const uint64_t*>(p < vb ? t.values_src + p : t.scales_src + (p - vb));
  return p < vb ? plane_word(t.values, p) : plane_word(t.scales, p - vb);
}

// Lanes 0..7 of warp 0 of the block finish tensor t; every thread of the block calls it.
// Ring: stage b (kStageBlocks blocks' sums) sits in slot b % kStages; warps 1..3 keep kStages - 1 stages in
// flight (cp.async groups, one per stage, empty past the end), a barrier per stage hands a slot over.
constexpr size_t kRingBytes = sizeof(uint64_t) * kStages * kStageBlocks * 8;
__device__ void chain(const BatchTensorDevice& t, bool write, uint64_t* out,
                      uint64_t (*ring)[kStageBlocks * 8]) {
  const int tid = threadIdx.x, i = tid & 7;
  const uint64_t blocks = x::full_blocks(t.len);
  const uint64_t* s = t.sums;
  const uint64_t stages = (blocks + kStageBlocks - 1) / kStageBlocks;
  auto stage_blocks = [&](uint64_t b) {
    const uint64_t left = blocks - b * kStageBlocks;
    return static_cast<int>(left < kStageBlocks ? left : kStageBlocks);
  };
  auto issue = [&](uint64_t b) {  // threads >= 32 only
    if (b < stages) {
      const int pieces = stage_blocks(b) * 4;  // 16-byte pieces: 4 per block
      const uint64_t* from = s + b * kStageBlocks * 8;
      uint64_t* to = ring[b % kStages];
      for (int e = tid - 32; e < pieces; e += kThreads - 32) cp_async16(to + 2 * e, from + 2 * e);
    }
    cp_async_commit();
  };
  if (tid >= 32)
    for (int b = 0; b < kStages - 1; ++b) issue(static_cast<uint64_t>(b));
  uint64_t acc = x::init_acc(i);
  const uint64_t key = x::scramble_key(i);
  for (uint64_t b = 0; b < stages; ++b) {
    if (tid >= 32) cp_async_wait<kStages - 2>();
    __syncthreads();
    if (tid >= 32) {
      issue(b + kStages - 1);
    } else if (tid < 8) {
      const uint64_t* cur = ring[b % kStages] + i;
      const int n = stage_blocks(b);
      // note: scramble_add folds the next block's sum into the multiply of this one (the dependent path is
      // shift, xor, one wide multiply-add); the stage's last scramble adds nothing. (Reading a stage's sums
      // into registers 16 at a time ahead of their steps measured no faster: bench/RESULTS.md, session 6.)
      uint64_t v = acc + cur[0];
      if (n == kStageBlocks) {
#pragma unroll 16
        for (int a = 1; a < kStageBlocks; ++a) v = x::scramble_add(v, key, cur[a * 8]);
      } else {
        for (int a = 1; a < n; ++a) v = x::scramble_add(v, key, cur[a * 8]);
      }
      acc = x::scramble_add(v, key, 0);
    }
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

// The end of a tile, every thread: the pair's exchange of its lane sums, the block's sums stored, the
// tensor's counter bumped, and the chain run by the block that finishes the tensor's last tile.
__device__ __forceinline__ void finish_tile(const BatchTensorDevice& t, int k, bool write,
                                            uint64_t stream_off, uint64_t bq, uint64_t bytes, int h,
                                            const uint64_t (&acc)[8], unsigned* counters, uint64_t* out,
                                            uint64_t (*ring)[kStageBlocks * 8]) {
  __shared__ int is_last;
  const uint64_t blocks = x::full_blocks(t.len);
  // The pair's exchange: lane h keeps sums 4h..4h+3 and adds its partner's share of them.
  uint64_t mine[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint64_t give = h ? acc[j] : acc[4 + j], keep = h ? acc[4 + j] : acc[j];
    mine[j] = keep + __shfl_xor_sync(0xFFFFFFFFu, give, 1);
  }
  const uint64_t block = (stream_off + bq) / 1024;
  // note: a chunk past the plane's end holds zeros and no block; the stream's last (partial or tail) block
  // is read by the chain itself.
  if (bq < bytes && block < blocks) {
    auto* at = reinterpret_cast<ulonglong2*>(t.sums + block * 8 + 4 * h);
    at[0] = make_ulonglong2(mine[0], mine[1]);
    at[1] = make_ulonglong2(mine[2], mine[3]);
  }
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
  chain(t, write, out + k, ring);
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
// (66.5 KB, 3 blocks) measured 4.47-4.74 ms against this form's 4.45-4.48 ms (bench/RESULTS.md, session 5).
// The chain's ring reuses the buffer once the tile is stored.
constexpr int kChunkUnits = 1024 / 16, kHalfSkewUnits = kChunkUnits / 2 + 1, kTileChunks = kWarps * kPairs;
constexpr size_t kStagedSmem = sizeof(uint4) * kTileChunks * kHalfSkewUnits;
static_assert(kStagedSmem >= kRingBytes, "the chain's ring fits in the half tile's shared memory");

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
      if (kFull || q < bytes) {
        uint4 w[4] = {v[0], v[1], v[2], v[3]};
        transpose4(w);
        uint8_t* at = cur.next(p);
#pragma unroll
        for (int m = 0; m < 4; ++m) __stcs(reinterpret_cast<uint4*>(at + 16 * m), w[m]);
      }
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
  finish_tile(t, k, true, stream_off, bq, bytes, h, acc, counters, out,
              reinterpret_cast<uint64_t(*)[kStageBlocks * 8]>(staged));
}

__global__ void __launch_bounds__(kThreads) chains_only(const BatchTensorDevice* tensors, uint64_t* out) {
  __shared__ __align__(16) uint64_t ring[kStages][kStageBlocks * 8];
  chain(tensors[blockIdx.x], false, out + blockIdx.x, ring);
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

cudaError_t launch_refit_batch(bool write, bool staged, const BatchTensorDevice* tensors, int count,
                               uint32_t total_tiles, uint32_t* tile_map, unsigned* counters, uint64_t* out,
                               cudaStream_t stream) {
  if (count == 0 || total_tiles == 0) return cudaSuccess;
  if (cudaError_t e = cudaMemsetAsync(counters, 0, sizeof(unsigned) * static_cast<size_t>(count), stream))
    return e;
  fill_tile_map<<<(total_tiles + 255) / 256, 256, 0, stream>>>(tensors, count, total_tiles, tile_map);
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
