// Incremental checksums' state (CudaWeightMemory, weight_memory_cuda.cpp): each batched tensor may keep
// its XXH3 block sums (64 bytes per KiB of its canonical stream, xxh3_device.cuh) in device memory next to
// its planes, current after every full write or hash and every sparse write that saves the old bytes, so
// a sparse refit re-runs only the scramble chains. Records are found by either plane's live address.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <unordered_map>
#include <utility>

#include "cuda/common/check.h"

namespace mxq::cuda {

struct SumRecord {
  DeviceBuffer sums;
  const uint8_t* values = nullptr;
  const uint8_t* scales = nullptr;
  uint64_t len = 0;
  bool valid = false;
};

class KeptSums {
 public:
  // The record of the tensor with these planes (values_bytes, len: its values plane and whole stream),
  // created on first use and remade when its geometry changed; null when its memory cannot be had (the
  // batch then uses scratch, as without the option).
  SumRecord* record_for(const uint8_t* values, const uint8_t* scales, uint64_t values_bytes, uint64_t len,
                        cudaStream_t stream);
  // The record a plane belongs to, with the plane's offset in the tensor's stream; null if none.
  SumRecord* record_of(const uint8_t* plane, uint64_t& stream_off);
  // Drops the record of the tensor whose values plane is `values` (after `stream` drains: queued kernels
  // may still use its sums).
  void forget(const uint8_t* values, cudaStream_t stream);
  void forget_all(cudaStream_t stream);
  // Marks the record of the tensor that holds `plane` stale (a write that bypassed the sums).
  void invalidate(const uint8_t* plane);

 private:
  // note: hashed, not ordered: a full refit looks up every plane (~500 for Qwen3-8B) in the host time the
  // refit bench counts.
  std::unordered_map<const uint8_t*, SumRecord> records_;  // by values plane
  std::unordered_map<const uint8_t*, std::pair<const uint8_t*, uint64_t>>
      owner_;  // plane -> (values plane, stream offset)
};

}  // namespace mxq::cuda
