// The full refit write by warps (launch_refit_warp, refit_launch.h): the write mode of the batched refit
// (refit_batch.cu) with one warp, a thread block of its own, per 4 KiB unit instead of one 4-warp block per
// 64 KiB tile. CPU twin: to_native (layout/layout.cpp) + canonical_checksum (model/weight_store.cpp,
// libxxhash), as refit_batch.cu.
//
// Why. A standalone study on the H200 (bench/RESULTS.md, Refit write study) moved 7.163 GB with the XXH3 lane
// sums computed and stored as here: 85.7% of cudaMemcpy with one 64 KiB tile per 4-warp block, 87.3% with
// 16 KiB tiles, 90.3% with one warp per 4 KiB; the plain copies 94-97%. A warp that does one unit and exits
// leaves its slot to the next at once, so the SM always has loads in flight; a block's warps wait for the
// slowest.
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
// Chains. A tensor's XXH3 scramble chain is sequential (one step a 1 KiB block, ~0.95 ms for a 50 MB
// tensor); the write is not. Tensors come largest first (the caller sorts them) and go in segments of
// tensors of about one size (a segment ends where the size falls below 4/5 of its first tensor's; at most
// kSegments), one write launch each; after segment s is written, its tensors' chains run
// (launch_refit_chains, one block a tensor, tails read back from the live planes) on side stream s, of the
// highest priority, so they take SM slots as the next segments' warps leave them. Why size classes: a
// segment's chains take as long as its largest tensor's, so the big tensors' long chains overlap the rest
// of the write and the last segment, the smallest tensors, leaves the shortest tail; a model of the
// Qwen3-8B bench (7.163 GB: 108 tensors of 52 MB, 72 of 17, 72 of 4.3) finds no cut of up to 16
// segments better than its 3 size classes, and 8 equal segments ~0.35 ms worse.
// The other forms measured (bench/history/RESULTS-log.md, "Session 7 (lead) — full refit write forms"): the
// chain in the warp that completes a tensor, counted by atomics (5.1-7.0 ms for 7.163 GB), and the chains in
// one kernel after the whole write (5.1 ms: 3.90 write + 0.95 chains).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/refit/refit_launch.h"
#include "cuda/refit/refit_tile.cuh"

namespace mxq::cuda {
namespace {

using namespace refit_tile;

constexpr int kUnitBytes = 4096, kUnitsPerTile = static_cast<int>(kBatchTileBytes / kUnitBytes);
constexpr int kHalves = kUnitBytes / 512;
constexpr int kSegments = 8;
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

// One 4 KiB unit at plane offset q0 (`bytes` in the plane): loaded from src, its 1 KiB blocks' lane sums
// stored into sums (stream blocks from stream_off, `len` stream bytes), stored at native `base + q` when
// kContiguous, else through plane p's row table.
template <bool kContiguous>
__device__ __forceinline__ void write_unit(const uint8_t* src, uint8_t* base, const DevicePlane* p,
                                           bool transpose, uint64_t bytes, uint64_t q0, uint64_t stream_off,
                                           uint64_t len, uint64_t* sums) {
  if (q0 >= bytes) return;
  const int lane = static_cast<int>(threadIdx.x), u = lane & 3;
  const uint64_t first = q0 + 16 * static_cast<uint64_t>(lane);
  const bool full = q0 + kUnitBytes <= bytes;
  uint4 v[kHalves];
#pragma unroll
  for (int e = 0; e < kHalves; ++e) {
    const uint64_t q = first + 512 * static_cast<uint64_t>(e);
    v[e] = full || q < bytes ? __ldcs(reinterpret_cast<const uint4*>(src + q)) : make_uint4(0, 0, 0, 0);
  }
  // Keys: half e = 2c + h of block c is stripes 8h.., lane l holds words 2u, 2u + 1 of stripe 8h + l/4:
  // secret words 8h + l/4 + 2u and the next.
  uint64_t key[2][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int j = 8 * h + (lane >> 2) + 2 * u;
    key[h][0] = x::secret_word(j), key[h][1] = x::secret_word(j + 1);
  }
  const uint64_t blocks = x::full_blocks(len);
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
      *reinterpret_cast<ulonglong2*>(sums + block * 8 + 2 * u) = make_ulonglong2(a0, a1);
  }
#pragma unroll
  for (int e = 0; e < kHalves; ++e) {
    uint4 w = v[e];
    if (transpose) quad_transpose(w, u);  // note: uniform over the warp (one plane a unit)
    const uint64_t q = first + 512 * static_cast<uint64_t>(e);
    if (!full && q >= bytes) continue;
    uint8_t* at;
    if constexpr (kContiguous) {
      at = base + q;
    } else {
      int64_t r, col;
      row_col(*p, q - 16 * static_cast<uint64_t>(u), r, col);
      at = p->native + p->row_off[r] + col + 16 * u;
    }
    __stcs(reinterpret_cast<uint4*>(at), w);
  }
}

// Native bytes of a plane from its first canonical byte when its rows sit back to back (or identity).
__device__ __host__ __forceinline__ bool plane_contiguous(const DevicePlane& p) {
  return p.identity() || p.rows_contiguous;
}

// The general write: grid tiles tile0.. through the tile map and the device descriptors.
__global__ void __launch_bounds__(32, 32)
    refit_write_warp(const BatchTensorDevice* tensors, const uint32_t* tile_map, uint32_t tile0) {
  const uint32_t tile = tile0 + blockIdx.x / kUnitsPerTile;
  const BatchTensorDevice& t = tensors[tile_map[tile]];
  const uint32_t local = tile - t.first_tile;
  const bool in_values = local < t.values_tiles;
  const DevicePlane& p = in_values ? t.values : t.scales;
  const uint64_t q0 = static_cast<uint64_t>(in_values ? local : local - t.values_tiles) * kBatchTileBytes +
                      static_cast<uint64_t>(blockIdx.x % kUnitsPerTile) * kUnitBytes;
  const uint64_t stream_off = in_values ? 0 : static_cast<uint64_t>(t.values.bytes());
  const uint8_t* src = in_values ? t.values_src : t.scales_src;
  if (plane_contiguous(p))
    write_unit<true>(src, p.native + (p.identity() ? 0 : p.row0), &p, p.transpose4,
                     static_cast<uint64_t>(p.bytes()), q0, stream_off, t.len, t.sums);
  else
    write_unit<false>(src, nullptr, &p, p.transpose4, static_cast<uint64_t>(p.bytes()), q0, stream_off, t.len,
                      t.sums);
}

// The fast write of up to kLaunchTensors tensors with contiguous planes: each warp finds its tensor and
// unit from blockIdx and the launch's parameters (constant bank: a division when the tensors have the same
// size, else a binary search over their first units), so its loads go out without first waiting for a tile
// map and a descriptor from global memory.
struct LaunchTensor {
  const uint8_t* src[2];
  uint8_t* native[2];  // first native byte of each plane (row_off[0] applied)
  uint64_t* sums;
  uint64_t bytes[2], len;
  uint32_t first_unit, values_units;
  uint32_t transpose;  // bit p: plane p is transpose4
};
constexpr int kLaunchTensors = 384;
struct LaunchParams {
  uint32_t count, uniform_units;  // uniform_units: units of every tensor when they are all alike, else 0
  LaunchTensor t[kLaunchTensors];
};
static_assert(sizeof(LaunchParams) <= 32764, "a launch's parameters (32 KB from CUDA 12.1, Volta and later)");

__global__ void __launch_bounds__(32, 32) refit_write_params(const __grid_constant__ LaunchParams s) {
  int k;
  if (s.uniform_units) {
    k = static_cast<int>(blockIdx.x / s.uniform_units);
  } else {
    int lo = 0, hi = static_cast<int>(s.count) - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (s.t[mid].first_unit <= blockIdx.x)
        lo = mid;
      else
        hi = mid - 1;
    }
    k = lo;
  }
  const LaunchTensor& t = s.t[k];
  const uint32_t unit = blockIdx.x - t.first_unit;
  const int pl = unit >= t.values_units ? 1 : 0;
  write_unit<true>(t.src[pl], t.native[pl], nullptr, (t.transpose >> pl) & 1, t.bytes[pl],
                   static_cast<uint64_t>(pl ? unit - t.values_units : unit) * kUnitBytes, pl ? t.bytes[0] : 0,
                   t.len, t.sums);
}

}  // namespace

struct WarpChainStreams {
  cudaStream_t side[kSegments] = {};
  cudaEvent_t written[kSegments] = {}, chained[kSegments] = {};
  LaunchParams params;  // refit_write_params' (the launch copies it)
};

void warp_chain_streams_destroy(WarpChainStreams* s) {
  if (!s) return;
  for (int k = 0; k < kSegments; ++k) {
    if (s->side[k]) cudaStreamDestroy(s->side[k]);
    if (s->written[k]) cudaEventDestroy(s->written[k]);
    if (s->chained[k]) cudaEventDestroy(s->chained[k]);
  }
  delete s;
}

cudaError_t warp_chain_streams_create(WarpChainStreams** out) {
  auto* s = new WarpChainStreams;
  int least = 0, greatest = 0;
  cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
  for (int k = 0; k < kSegments && e == cudaSuccess; ++k) {
    e = cudaStreamCreateWithPriority(&s->side[k], cudaStreamNonBlocking, greatest);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->written[k], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->chained[k], cudaEventDisableTiming);
  }
  if (e != cudaSuccess) {
    warp_chain_streams_destroy(s);
    return e;
  }
  *out = s;
  return cudaSuccess;
}

// The fast launches of tensors [begin, end) (contiguous planes), kLaunchTensors at a time.
static cudaError_t launch_params(const BatchTensorDevice* host, int begin, int end, LaunchParams& params,
                                 cudaStream_t stream) {
  for (int at = begin; at < end; at += kLaunchTensors) {
    const int n = std::min(end - at, kLaunchTensors);
    uint64_t units = 0;
    params.count = static_cast<uint32_t>(n);
    params.uniform_units = 0;
    bool alike = true;
    for (int k = 0; k < n; ++k) {
      const BatchTensorDevice& h = host[at + k];
      LaunchTensor& t = params.t[k];
      const DevicePlane* planes[2] = {&h.values, &h.scales};
      t.src[0] = h.values_src, t.src[1] = h.scales_src;
      t.transpose = 0;
      for (int p = 0; p < 2; ++p) {
        const DevicePlane& d = *planes[p];
        t.native[p] = d.native + (d.identity() ? 0 : d.row0);
        t.bytes[p] = static_cast<uint64_t>(d.bytes());
        t.transpose |= d.transpose4 ? 1u << p : 0u;
      }
      t.sums = h.sums, t.len = h.len;
      t.first_unit = static_cast<uint32_t>(units);
      t.values_units = static_cast<uint32_t>((t.bytes[0] + kUnitBytes - 1) / kUnitBytes);
      units += t.values_units + (t.bytes[1] + kUnitBytes - 1) / kUnitBytes;
      alike = alike && t.bytes[0] == params.t[0].bytes[0] && t.bytes[1] == params.t[0].bytes[1];
      if (units > 0x7FFFFFFFull) return cudaErrorInvalidValue;
    }
    if (alike) params.uniform_units = static_cast<uint32_t>(units / static_cast<uint64_t>(n));
    refit_write_params<<<static_cast<unsigned>(units), 32, 0, stream>>>(params);
    if (cudaError_t e = cudaGetLastError()) return e;
  }
  return cudaSuccess;
}

cudaError_t launch_refit_warp(const BatchTensorDevice* tensors, const BatchTensorDevice* host, int count,
                              uint32_t total_tiles, uint32_t* tile_map, uint64_t* out, WarpChainStreams* side,
                              cudaStream_t stream) {
  if (count == 0 || total_tiles == 0) return cudaSuccess;
  if (total_tiles > kMaxWarpTiles || !side) return cudaErrorInvalidValue;
  auto fast = [&](int k) { return plane_contiguous(host[k].values) && plane_contiguous(host[k].scales); };
  bool mapped = false;
  for (int k = 0; k < count; ++k) mapped = mapped || !fast(k);
  if (mapped)
    if (cudaError_t e = launch_fill_tile_map(tensors, count, total_tiles, tile_map, stream)) return e;
  // Segment s (tensors of about one size) is written on `stream` (runs of contiguous tensors by
  // refit_write_params, others through the tile map), then its chains run on side stream s (highest
  // priority) while `stream` writes the next segments.
  int segments = 0;
  for (int begin = 0; begin < count; ++segments) {
    int end = begin + 1;
    while (end < count && (segments == kSegments - 1 || 5 * host[end].len > 4 * host[begin].len)) ++end;
    for (int k = begin; k < end;) {
      int run = k + 1;
      while (run < end && fast(run) == fast(k)) ++run;
      if (fast(k)) {
        if (cudaError_t e = launch_params(host, k, run, side->params, stream)) return e;
      } else {
        const uint32_t t0 = host[k].first_tile, t1 = run < count ? host[run].first_tile : total_tiles;
        refit_write_warp<<<(t1 - t0) * kUnitsPerTile, 32, 0, stream>>>(tensors, tile_map, t0);
        if (cudaError_t e = cudaGetLastError()) return e;
      }
      k = run;
    }
    if (cudaError_t e = cudaEventRecord(side->written[segments], stream)) return e;
    if (cudaError_t e = cudaStreamWaitEvent(side->side[segments], side->written[segments])) return e;
    if (cudaError_t e = launch_refit_chains(tensors + begin, end - begin, out + begin, side->side[segments]))
      return e;
    if (cudaError_t e = cudaEventRecord(side->chained[segments], side->side[segments])) return e;
    begin = end;
  }
  // note: only after every segment's write is queued, or `stream` would wait for a chain before writing on.
  for (int s = 0; s < segments; ++s)
    if (cudaError_t e = cudaStreamWaitEvent(stream, side->chained[s])) return e;
  return cudaSuccess;
}

}  // namespace mxq::cuda
