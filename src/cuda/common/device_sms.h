// The SM count of the current device, read once per device (launchers that size grids by it would otherwise
// ask the driver at every launch); 0 when the runtime cannot tell.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

namespace mxq::cuda {

inline int device_sms() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
  static std::atomic<int> sms_of[16] = {};
  const int slot = dev >= 0 && dev < 16 ? dev : -1;
  int sms = slot >= 0 ? sms_of[slot].load(std::memory_order_relaxed) : 0;
  if (sms < 1) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms < 1) return 0;
    if (slot >= 0) sms_of[slot].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

}  // namespace mxq::cuda
