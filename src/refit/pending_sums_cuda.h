// XXH3-64 of canonical planes in device memory (cuda::canonical_checksums' sums), computed on a stream of
// their own beside the caller's: the stream first waits for what `after` has queued so far (the planes'
// producer), then the caller's stream goes on (refit/tensor_update_cuda.cpp: the undo log, the write and the
// re-read of the live planes) while these chains run. The scramble chain is sequential per tensor (15-23 ns
// per KiB block on the H200: a 1.2 GB embedding takes ~25 ms), so two chains side by side cost one.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

#include "base/error.h"
#include "model/weight_memory_cuda.h"

namespace mxq::cuda {

class PendingSums {
 public:
  // Queues the sums of `jobs` (device planes, any alignment; *out is written by wait()) behind `after`'s
  // work.
  static Result<PendingSums> start(std::span<const CanonicalSumJob> jobs, cudaStream_t after);
  // Blocks until the sums are in place; an error of the queued work is returned here. Call once.
  Status wait();

  PendingSums(PendingSums&& o) noexcept;
  PendingSums& operator=(PendingSums&&) = delete;
  PendingSums(const PendingSums&) = delete;
  PendingSums& operator=(const PendingSums&) = delete;
  ~PendingSums();  // waits for the queued work, frees its memory

 private:
  PendingSums() = default;
  cudaStream_t stream_ = nullptr;
  void* device_ = nullptr;       // block sums, jobs and results (stream-ordered allocation on stream_)
  uint64_t* host_ = nullptr;     // results (pinned)
  std::vector<uint64_t*> outs_;  // where wait() puts them
};

}  // namespace mxq::cuda
