#include "cuda/refit/device_ranges.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

namespace mxq::cuda {
namespace {

// The driver's cuMemGetAddressRange (null when the driver lacks it: then nothing is cached).
PFN_cuMemGetAddressRange_v3020 address_range_fn() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q) !=
          cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(fn);
}

}  // namespace

bool is_device(const void* p) {
  if (!p) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // note: older drivers flag plain host pointers; clear it
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

bool DeviceRanges::is_device(const void* p) {
  if (!p) return false;
  const auto at = reinterpret_cast<uintptr_t>(p);
  for (const auto& [lo, hi] : ranges_)
    if (at >= lo && at < hi) return true;
  if (!mxq::cuda::is_device(p)) return false;
  static const PFN_cuMemGetAddressRange_v3020 range = address_range_fn();
  CUdeviceptr base = 0;
  size_t size = 0;
  if (range && range(&base, &size, static_cast<CUdeviceptr>(at)) == CUDA_SUCCESS && size > 0)
    ranges_.emplace_back(static_cast<uintptr_t>(base), static_cast<uintptr_t>(base) + size);
  return true;
}

}  // namespace mxq::cuda
