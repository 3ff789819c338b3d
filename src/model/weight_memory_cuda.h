// WeightMemory (model/weight_memory.h) in CUDA device memory: live planes from cudaMalloc (allocated once,
// never moved), layout tables uploaded next to them, and the refit kernels (refit_plane.cu,
// refit_scatter.cu, xxh3_checksum.cu, refit_batch.cu) for writes, reads, sparse scatters with undo capture
// and checksums. Host spans given to it (pinned or pageable) are staged through a device buffer; device spans
// are used as they are. All work runs on one stream, in order; calls that return host-visible results
// (checksums, reads into host memory, sync) wait for it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "model/weight_memory.h"

namespace mxq::cuda {

struct CudaMemoryOptions {
  cudaStream_t stream = nullptr;  // null: the memory creates its own non-blocking stream
  // Bytes of scratch (undo logs, uploaded deltas) it will hand out in all; more is refused by name (tests
  // use a small limit to reach W-26 without exhausting the GPU).
  size_t scratch_limit = SIZE_MAX;
  // Scratch is stream-ordered (a pool of its own, cudaMallocFromPoolAsync / cudaFreeAsync on the memory's
  // stream): a span from allocate_scratch is valid on that stream from the call on (other streams: after a
  // sync), and free_scratch returns it without a device sync. Up to this many bytes of freed scratch stay
  // reserved for the next apply (no cudaMalloc / cudaFree per apply); more goes back to the driver at the
  // next sync, and all of it when a live plane's allocation would otherwise fail.
  size_t scratch_keep_bytes = size_t{2} << 30;
  // Full writes (write_tensors) hash the canonical bytes as the batched kernel writes them, from its
  // registers: that checks the delivered planes against the trainer's checksum in the same pass, while the
  // layout mapping itself is checked bitwise by the GPU tests. true: hash the live planes again after the
  // writes (one more read of every byte) instead.
  bool checksum_from_live = false;
  // Incremental checksums: every tensor the batched kernels take keeps its XXH3 block sums (64 bytes per
  // KiB of weights, 6.25% more device memory) current through full writes and sparse scatters (each changed
  // word adds its new term minus its old one), so a checksum after a sparse write runs only the chains and
  // the tails instead of re-reading every plane. A scatter without old bytes, or write_plane, drops a
  // tensor's sums until its next full hash.
  bool incremental_checksums = false;
  // Batched full writes stage each 64 KiB tile in shared memory with cp.async before it is hashed and stored
  // in whole lines (refit_batch.cu "Staged write"): same bytes and sums; measured 4.63 ms against 5.16 ms for
  // the plain kernel on 7.16 GB (bench/history/RESULTS-log.md,
  // "`mxq-bench refit`, NVIDIA H200, branch `refit5`"). false: the plain kernel.
  bool staged_full_write = true;
  // Batched full writes whose planes are all identity or GEMV transpose4 run one warp per 4 KiB with the
  // chains overlapped on side streams (refit_write_warp.cu) instead of one 4-warp block per 64 KiB tile: same
  // bytes and sums. Off by default: on the H200 it measured 4.22-4.40 ms for 7.163 GB against 4.14-4.28 for
  // the staged tile kernel (bench/history/RESULTS-log.md,
  // "Session 8 (lead) — full refit from device reaches 80%"). Takes precedence over staged_full_write.
  bool warp_full_write = false;
  // false: full writes and checksums take the per-plane kernels and the two-kernel hash of the previous
  // path (refit_plane.cu, xxh3_checksum.cu) instead of refit_batch.cu (a fallback; slower).
  bool batched_kernels = true;
  // Host canonical planes of a full write go through device staging in groups of about this many bytes.
  size_t host_stage_bytes = size_t{1} << 30;
};

Result<std::unique_ptr<WeightMemory>> cuda_weight_memory(const CudaMemoryOptions& options = {});

// The stream a CUDA weight memory runs on (null for any other memory).
cudaStream_t weight_memory_stream(const WeightMemory& memory);
// XXH3-64 (docs/refit-format.md) of canonical planes in device memory that `memory` (a CUDA weight memory)
// need not have allocated, e.g. a trainer's buffer or scratch: the checksum a tensor with these planes has.
struct CanonicalSumJob {
  std::span<const uint8_t> values, scales;
  uint64_t* out = nullptr;  // host memory
};
Status canonical_checksums(WeightMemory& memory, std::span<const CanonicalSumJob> jobs);
// CudaMemoryOptions::checksum_from_live of a live CUDA weight memory (no effect on any other memory).
void set_checksum_from_live(WeightMemory& memory, bool reread);
bool checksum_from_live(const WeightMemory& memory);
// CudaMemoryOptions::incremental_checksums of a live CUDA weight memory (off frees the kept sums).
void set_incremental_checksums(WeightMemory& memory, bool on);
// CudaMemoryOptions::staged_full_write of a live CUDA weight memory (no effect on any other memory).
void set_staged_full_write(WeightMemory& memory, bool on);
// CudaMemoryOptions::warp_full_write of a live CUDA weight memory (no effect on any other memory).
void set_warp_full_write(WeightMemory& memory, bool on);
// Scratch bytes of a CUDA weight memory handed out and not freed, and bytes its scratch pool holds reserved
// (handed out or kept for reuse); 0 for any other memory.
size_t scratch_in_use(const WeightMemory& memory);
size_t scratch_reserved(const WeightMemory& memory);

}  // namespace mxq::cuda
