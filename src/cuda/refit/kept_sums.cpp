#include "cuda/refit/kept_sums.h"

#include <algorithm>

#include "cuda/refit/refit_launch.h"

namespace mxq::cuda {

SumRecord* KeptSums::record_for(const uint8_t* values, const uint8_t* scales, uint64_t values_bytes,
                                uint64_t len, cudaStream_t stream) {
  auto it = records_.find(values);
  if (it != records_.end() && (it->second.scales != scales || it->second.len != len)) {
    forget(values, stream);
    it = records_.end();
  }
  if (it == records_.end()) {
    auto buf = DeviceBuffer::alloc(std::max<size_t>(16, xxh3_job_blocks(len) * 64));
    if (!buf) return nullptr;
    SumRecord r;
    r.sums = std::move(*buf), r.values = values, r.scales = scales, r.len = len;
    it = records_.emplace(values, std::move(r)).first;
    owner_[values] = {values, 0};
    if (scales) owner_[scales] = {values, values_bytes};
  }
  return &it->second;
}

SumRecord* KeptSums::record_of(const uint8_t* plane, uint64_t& stream_off) {
  auto it = owner_.find(plane);
  if (it == owner_.end()) return nullptr;
  stream_off = it->second.second;
  return &records_.find(it->second.first)->second;
}

void KeptSums::forget(const uint8_t* values, cudaStream_t stream) {
  auto it = records_.find(values);
  if (it == records_.end()) return;
  cudaStreamSynchronize(stream);
  owner_.erase(it->second.values);
  if (it->second.scales) owner_.erase(it->second.scales);
  records_.erase(it);
}

void KeptSums::forget_all(cudaStream_t stream) {
  while (!records_.empty()) forget(records_.begin()->first, stream);
}

void KeptSums::invalidate(const uint8_t* plane) {
  uint64_t off = 0;
  if (SumRecord* r = record_of(plane, off)) r->valid = false;
}

}  // namespace mxq::cuda
