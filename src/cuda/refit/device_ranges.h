// Where a source pointer lives: device (or managed) memory, or host memory. A full refit asks this of every
// source plane; DeviceRanges answers later pointers inside a device allocation already seen without a driver
// query (a 7.16 GB full refit measured ~0.24 ms outside its kernels, with two cudaPointerGetAttributes calls
// a tensor among the suspects: bench/history/RESULTS-log.md, "Session 7 (lead) — full refit write forms").
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace mxq::cuda {

// True for device and managed memory (cudaPointerGetAttributes); false for null, host and unknown pointers.
bool is_device(const void* p);

// is_device over the pointers of one call: once a pointer is found in device memory, its allocation's range
// (cuMemGetAddressRange) answers for every later pointer inside it, so sources that share a few allocations
// (a trainer's flat buckets, the bench's one buffer) cost a few queries instead of two a tensor. Host
// pointers are asked every time. Valid for one call only: an allocation may be freed after it.
class DeviceRanges {
 public:
  bool is_device(const void* p);
  size_t ranges() const { return ranges_.size(); }

 private:
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges_;  // [base, base + size) of device allocations seen
};

}  // namespace mxq::cuda
