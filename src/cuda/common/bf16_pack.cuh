// Two f32 values as one bf16x2 word, the packed form the kernels store and feed to MMAs.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace mxq::cuda {

// lo in bits 0-15, hi in bits 16-31, each rounded to nearest even.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace mxq::cuda
