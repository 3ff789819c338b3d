// The PDL switch and the device check (pdl.h).
#include "cuda/common/pdl.h"

#include <cuda_runtime_api.h>

#include <atomic>

namespace mxq::cuda {
namespace {

std::atomic<bool> g_on{true};

}  // namespace

void set_pdl(bool on) { g_on.store(on, std::memory_order_relaxed); }

bool pdl_active() {
  if (!g_on.load(std::memory_order_relaxed)) return false;
  // note: mxq runs on one device per process; its major version is read once.
  static const bool sm90 = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    return major >= 9;
  }();
  return sm90;
}

}  // namespace mxq::cuda
