// Device half and launcher of programmatic dependent launch; the contract is in pdl.h.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/common/pdl.h"

namespace mxq::cuda {
namespace pdl {

// Waits until the previous kernel of the stream has completed and its writes are visible (no-op when the
// kernel was launched without PDL, or before sm_90).
__device__ __forceinline__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel of the stream be scheduled once every block of this one has called it or exited.
// note: called right after wait(), so at most two kernels of a step are resident at once.
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Both, for kernels that have nothing to do before their input is ready.
__device__ __forceinline__ void enter() {
  wait();
  launch_dependents();
}

}  // namespace pdl

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic stream serialization attribute when
// pdl_active().
template <class... Params, class... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_active() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace mxq::cuda
