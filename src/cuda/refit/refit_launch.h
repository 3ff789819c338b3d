// Launchers of the refit kernels (refit_plane.cu, refit_scatter.cu, xxh3_checksum.cu), used by
// weight_memory_cuda.cpp. Plain C++ (no base/error.h): every launcher returns the cudaError_t of its launch.
// A DevicePlane is one live plane in device memory with its Layout (layout/layout.h) tables on the device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#if defined(__CUDACC__)
#define MXQ_REFIT_HD __host__ __device__
#else
#define MXQ_REFIT_HD
#endif

namespace mxq::cuda {

struct DevicePlane {
  uint8_t* native = nullptr;         // live bytes (device)
  const int64_t* row_off = nullptr;  // separable tables (device); both null for an identity plane
  const int64_t* col_off = nullptr;
  int64_t rows = 0, row_bytes = 0;  // canonical geometry (identity: any split of its bytes)
  // Bytes that move together: for c % run == 0, canonical bytes c..c+run-1 of a row sit at native
  // row_off + col_off[c] + 0..run-1, and that offset is a multiple of run (1, 2, 4, 8 or 16; 16 for
  // identity).
  int run = 1;
  // Per run of R = `run` canonical bytes of a row (c % R == 0), its native column offset col_off[c] as int32,
  // in column order (row_bytes / R entries); null when the plane has none (row_bytes % 16 != 0 or offsets
  // past 2^31). The batched kernels (refit_batch.cu) need it for a separable plane.
  const int32_t* cols = nullptr;
  // The GEMV MXFP8 permutation (gemv_layout.h): inside every 64-byte group of a row, canonical 4-byte word
  // (j, t) (byte 16j + 4t) sits at native word (t, j); row_bytes % 64 == 0 and row offsets 16-aligned. The
  // batched kernels then move whole 16-byte vectors on both sides: one thread holds a whole 64-byte group
  // (one XXH3 stripe) and transposes it in registers.
  bool transpose4 = false;
  // Rows back to back: row_off[r] == row_off[0] + r·row_bytes for every row (then canonical byte q of a
  // transpose4 plane's 64-byte group g sits inside native bytes row_off[0] + [64g, 64g + 64)).
  bool rows_contiguous = false;
  int64_t row0 = 0;  // row_off[0] (from the host's copy of the table), for rows_contiguous planes
  MXQ_REFIT_HD int64_t bytes() const { return rows * row_bytes; }
  MXQ_REFIT_HD bool identity() const { return row_off == nullptr; }
};

// Full plane, canonical (device, `bytes()` bytes) -> native, separable planes only (identity is a memcpy).
// Native padding is not touched (the caller zeroes it).
cudaError_t launch_plane_write(const DevicePlane& p, const uint8_t* canonical, cudaStream_t stream);
// Full plane, native -> canonical (device), separable planes only.
cudaError_t launch_plane_read(const DevicePlane& p, uint8_t* canonical, cudaStream_t stream);

// Sparse entries. The check writes min(call << 32 | j) into *status (initially ~0) for the first entry j
// outside [0, entries) or not above its predecessor; the scatter writes nothing when *status != ~0.
// Indices are int64 (index_bytes 8) or int32 (index_bytes 4: the applier's compact upload).
cudaError_t launch_sparse_check(const void* indices, int index_bytes, int64_t count, int64_t entries,
                                uint32_t call, unsigned long long* status, cudaStream_t stream);
// Entry j: canonical bytes indices[j]·entry_bytes + b <- bytes[j·entry_bytes + b], old byte saved into
// undo[j·entry_bytes + b] first when undo is not null.
cudaError_t launch_sparse_scatter(const DevicePlane& p, const void* indices, int index_bytes, int64_t count,
                                  int entry_bytes, const uint8_t* bytes, uint8_t* undo,
                                  const unsigned long long* status, cudaStream_t stream);

// One tensor's XXH3-64 over its canonical values then scales bytes, read through the planes' layouts.
struct ChecksumJobDevice {
  DevicePlane values, scales;
  uint64_t len = 0;          // values.bytes() + scales.bytes()
  uint64_t first_block = 0;  // its first full block in the block-sum array (jobs in order, prefix sums)
};
// Blocks of a job in the block-sum array: the full 1024-byte blocks of a long (> 240 byte) input, else 0.
uint64_t xxh3_job_blocks(uint64_t len);
// Pass 1: 8 lane sums of every full block of every job (sums: total_blocks·8 words). jobs: device array.
cudaError_t launch_xxh3_block_sums(const ChecksumJobDevice* jobs, int job_count, uint64_t total_blocks,
                                   uint64_t* sums, cudaStream_t stream);
// Pass 2: per job, the scramble chain over its block sums, its tail, the merge (or the short path): out[k].
cudaError_t launch_xxh3_finish(const ChecksumJobDevice* jobs, int job_count, const uint64_t* sums,
                               uint64_t* out, cudaStream_t stream);

// ---- Batched full write / hash (refit_batch.cu) -------------------------------------------------------
// One tensor of a batch: both planes, in write mode their canonical sources (device memory, 16-byte
// aligned), and where its tiles and block sums sit. A batch's tensors must pass batch_eligible().
struct BatchTensorDevice {
  DevicePlane values, scales;
  const uint8_t* values_src = nullptr;  // write mode only
  const uint8_t* scales_src = nullptr;
  uint64_t len = 0;          // values.bytes() + scales.bytes()
  uint64_t* sums = nullptr;  // its xxh3_job_blocks(len) block sums, 8 words each (scratch or kept per tensor)
  uint32_t first_tile = 0;   // its tiles: values tiles then scales tiles, consecutive in the grid
  uint32_t values_tiles = 0, tiles = 0;
};
inline constexpr uint64_t kBatchTileBytes = 64 * 1024;  // plane bytes one thread block moves / hashes
MXQ_REFIT_HD inline uint32_t batch_tiles(int64_t plane_bytes) {
  return static_cast<uint32_t>((static_cast<uint64_t>(plane_bytes) + kBatchTileBytes - 1) / kBatchTileBytes);
}
// A plane the batched kernels take: 16-byte units (bytes % 16 == 0), identity or separable with `cols`.
MXQ_REFIT_HD inline bool batch_plane_ok(const DevicePlane& p) {
  return p.bytes() % 16 == 0 && (p.bytes() == 0 || p.identity() || p.cols != nullptr);
}
// A tensor the batched kernels take: its values plane a whole number of 1 KiB XXH3 blocks (so each 1 KiB of
// either plane is one block of the checksum stream) and both planes batch_plane_ok.
MXQ_REFIT_HD inline bool batch_eligible(const DevicePlane& values, const DevicePlane& scales) {
  return values.bytes() > 0 && values.bytes() % 1024 == 0 && batch_plane_ok(values) && batch_plane_ok(scales);
}
// write: native <- canonical sources for every tensor and out[k] = XXH3-64 of the bytes written (the block
// sums come from the registers the kernel stores; no re-read). Otherwise (hash mode): out[k] = XXH3-64 of
// the live planes, read through their layouts. tensors: device array of `count`, first_tile in order with
// total_tiles in all; scratch: tile_map (total_tiles words), counters (count words, zeroed by this call).
// Each tensor's block sums go to its `sums`. In each tensor the thread block that finishes its last tile
// runs its scramble chain, tail and merge, so chains overlap the other tensors' traffic.
// staged (write mode only): the tile goes through shared memory, half of every 1 KiB chunk at a time
// (refit_batch.cu "Staged write"); same bytes, same sums.
cudaError_t launch_refit_batch(bool write, bool staged, const BatchTensorDevice* tensors, int count,
                               uint32_t total_tiles, uint32_t* tile_map, unsigned* counters, uint64_t* out,
                               cudaStream_t stream);
// The write mode of launch_refit_batch by warps (refit_write_warp.cu): one warp a 4 KiB unit, 16 a tile;
// the same bytes, sums and checksums. Every plane identity or transpose4 (batch_warp_plane_ok); at most
// kMaxWarpTiles tiles (the grid is 16 blocks a tile). host: the same `count` descriptors in host memory
// (the launcher cuts the batch into segments of whole tensors). The chains run on the side streams, joined
// back into `stream` before it returns; no counters.
inline constexpr uint32_t kMaxWarpTiles = 0x7FFFFFFFu / 16;
MXQ_REFIT_HD inline bool batch_warp_plane_ok(const DevicePlane& p) {
  return p.bytes() == 0 || p.identity() || p.transpose4;
}
struct WarpChainStreams;  // the side streams and events of launch_refit_warp, made once by its owner
cudaError_t warp_chain_streams_create(WarpChainStreams** out);
void warp_chain_streams_destroy(WarpChainStreams* s);
cudaError_t launch_refit_warp(const BatchTensorDevice* tensors, const BatchTensorDevice* host, int count,
                              uint32_t total_tiles, uint32_t* tile_map, uint64_t* out, WarpChainStreams* side,
                              cudaStream_t stream);
// tile_map[g] = the tensor whose tiles hold grid tile g (tensors in first_tile order), for the kernels above.
cudaError_t launch_fill_tile_map(const BatchTensorDevice* tensors, int count, uint32_t total_tiles,
                                 uint32_t* tile_map, cudaStream_t stream);
// Chains only (hash mode, tails from the live planes): out[k] from tensors[k].sums as they stand (the
// incremental checksum: sums kept current by launch_sum_delta). One thread block per tensor.
cudaError_t launch_refit_chains(const BatchTensorDevice* tensors, int count, uint64_t* out,
                                cudaStream_t stream);

// Incremental checksum (sum_delta.cu): after a sparse scatter into plane p (stream bytes from stream_off of
// a tensor of `len` bytes), adds to its kept block sums each changed word's new contribution minus its old
// one (old bytes from undo). Indices as in launch_sparse_scatter; does nothing when *status != ~0.
cudaError_t launch_sum_delta(const DevicePlane& p, const void* indices, int index_bytes, int64_t count,
                             int entry_bytes, const uint8_t* undo, uint64_t stream_off, uint64_t len,
                             uint64_t* sums, const unsigned long long* status, cudaStream_t stream);

}  // namespace mxq::cuda
