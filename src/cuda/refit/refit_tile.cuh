// Device pieces shared by the batched full-refit kernels (refit_batch.cu: one tile per block, the chain run
// by the block that finishes a tensor, or the chains alone; refit_write_warp.cu: one warp a 4 KiB unit,
// chains in a kernel of their own): the XXH3 lane sums of whole stripes, the layout moves of one 16-byte
// unit, the per-lane stripe loop, the scramble chain over a tensor's block sums with its tail and merge.
// Layouts and the work split: refit_batch.cu. Included by .cu files only (it defines __constant__ tables, one
// copy per file).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/refit/refit_launch.h"
#include "cuda/refit/refit_plane.cuh"
#include "cuda/refit/xxh3_device.cuh"

namespace mxq::cuda::refit_tile {

namespace x = xxh3;

constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kPairs = 16;   // 1 KiB chunks per warp and tile, one per lane pair
constexpr int kStripes = 8;  // stripes per lane: 2k + h
static_assert(kBatchTileBytes == uint64_t{kWarps} * kPairs * 1024, "a tile is one chunk per lane pair");
constexpr int kStageBlocks = 64, kStages = 4;  // chain: block sums staged per ring slot, ring slots (default)

// Secret words for keys whose index is known at compile time (after unrolling): constant-bank operands.
// kStep[j] = kWord[j] ^ kWord[j + 1]: the odd lane of a pair gets word j + 1 as kWord[j] ^ (mask & kStep[j]).
#define MXQ_W(j) x::secret_le64(8 * (j))
#define MXQ_S(j) (x::secret_le64(8 * (j)) ^ x::secret_le64(8 * (j) + 8))
static __constant__ uint64_t kWord[23] = {MXQ_W(0),  MXQ_W(1),  MXQ_W(2),  MXQ_W(3),  MXQ_W(4),  MXQ_W(5),
                                          MXQ_W(6),  MXQ_W(7),  MXQ_W(8),  MXQ_W(9),  MXQ_W(10), MXQ_W(11),
                                          MXQ_W(12), MXQ_W(13), MXQ_W(14), MXQ_W(15), MXQ_W(16), MXQ_W(17),
                                          MXQ_W(18), MXQ_W(19), MXQ_W(20), MXQ_W(21), MXQ_W(22)};
static __constant__ uint64_t kStep[22] = {MXQ_S(0),  MXQ_S(1),  MXQ_S(2),  MXQ_S(3),  MXQ_S(4),  MXQ_S(5),
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

// A stripe's 4 canonical vectors stored transposed at the cursor's next native address (GEMV planes).
__device__ __forceinline__ void store_stripe_transposed(StripeCursor& cur, const DevicePlane& p,
                                                        const uint4 (&v)[4]) {
  uint4 w[4] = {v[0], v[1], v[2], v[3]};
  transpose4(w);
  uint8_t* at = cur.next(p);
#pragma unroll
  for (int m = 0; m < 4; ++m) __stcs(reinterpret_cast<uint4*>(at + 16 * m), w[m]);
}

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
      if (kFull || q < bytes) store_stripe_transposed(cur, p, v);
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

// Lanes 0..7 of a warp (lane i holds XXH3 accumulator i after the scrambles of every full block): the tail
// stripes and the last stripe (from the canonical sources in write mode, the live planes otherwise), the
// merge, the checksum into *out by lane 0.
__device__ __forceinline__ void chain_finish(const BatchTensorDevice& t, bool write, uint64_t acc, int i,
                                             uint64_t* out) {
  const uint64_t blocks = x::full_blocks(t.len);
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

// Lanes 0..7 of warp 0 of the block finish tensor t; every thread of the block calls it.
// Ring: stage b (kStageBlocks blocks' sums) sits in slot b % kSt; warps 1..3 keep kSt - 1 stages in
// flight (cp.async groups, one per stage, empty past the end), a barrier per stage hands a slot over.
// note: a chain that runs beside a write at full bandwidth sees loads of several microseconds (the write
// keeps ~17 MB in flight: ~4 us at 4 TB/s); 3 stages ahead (~3.6 us of steps) ran its chains at half speed
// (session 8), hence deeper rings where shared memory allows (kSt).
constexpr size_t kRingSlotBytes = sizeof(uint64_t) * kStageBlocks * 8;  // one ring slot
template <int kSt = kStages>
__device__ __forceinline__ void chain(const BatchTensorDevice& t, bool write, uint64_t* out,
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
      uint64_t* to = ring[b % kSt];
      for (int e = tid - 32; e < pieces; e += kThreads - 32) cp_async16(to + 2 * e, from + 2 * e);
    }
    cp_async_commit();
  };
  if (tid >= 32)
    for (int b = 0; b < kSt - 1; ++b) issue(static_cast<uint64_t>(b));
  uint64_t acc = x::init_acc(i);
  const uint64_t key = x::scramble_key(i);
  for (uint64_t b = 0; b < stages; ++b) {
    if (tid >= 32) cp_async_wait<kSt - 2>();
    __syncthreads();
    if (tid >= 32) {
      issue(b + kSt - 1);
    } else if (tid < 8) {
      const uint64_t* cur = ring[b % kSt] + i;
      const int n = stage_blocks(b);
      // note: scramble_add folds the next block's sum into the multiply of this one (the dependent path is
      // shift, xor, one wide multiply-add); the stage's last scramble adds nothing. (Reading a stage's sums
      // into registers 16 at a time ahead of their steps measured no faster: bench/history/RESULTS-log.md,
      // "Session 6 final whole-tree runs".)
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
  chain_finish(t, write, acc, i, out);
}

// The pair's exchange of its lane sums (lane h keeps sums 4h..4h+3 and adds its partner's share of them) and
// the chunk's block sums stored; every thread of the warp.
__device__ __forceinline__ void store_pair_sums(const BatchTensorDevice& t, uint64_t stream_off, uint64_t bq,
                                                uint64_t bytes, int h, const uint64_t (&acc)[8]) {
  const uint64_t blocks = x::full_blocks(t.len);
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
}

}  // namespace mxq::cuda::refit_tile
