// The W-05 rule for refit's new bytes on the device (model/weight_memory.h NewBytePolicy, in its order), for
// the sparse decode (sparse_decode.cu) and the whole-plane check (check_planes.cu). CPU twin:
// mxq::new_entry_refused (model/weight_memory.cpp).
#pragma once

#include <cstdint>

namespace mxq::cuda {

// Little-endian bytes of an entry, no alignment assumed.
__device__ __forceinline__ uint32_t load_le(const uint8_t* p, int bytes) {
  uint32_t w = 0;
  for (int b = 0; b < bytes; ++b) w |= uint32_t{p[b]} << (8 * b);
  return w;
}

__device__ __forceinline__ bool refused_word(uint8_t policy, uint32_t w) {
  switch (policy) {
    case 1:  // E4M3
      return (w & 0x7F) == 0x7F;
    case 2:  // E8M0
      return (w & 0xFF) == 0xFF;
    case 3: {  // f32 scale: finite and > 0
      const float f = __uint_as_float(w);
      return !(f > 0.0f && f <= 3.402823466e38f);
    }
    case 4:  // bf16: exponent all ones is NaN or Inf
      return (w >> 7 & 0xFF) == 0xFF;
    case 5:  // f16
      return (w >> 10 & 0x1F) == 0x1F;
    case 6:  // f32
      return (w >> 23 & 0xFF) == 0xFF;
    default:
      return false;
  }
}

// Entry bytes of each policy (kNone: 1).
__device__ __forceinline__ int policy_entry_bytes(uint8_t policy) {
  return policy == 3 || policy == 6 ? 4 : policy == 4 || policy == 5 ? 2 : 1;
}

__device__ __forceinline__ bool refused_entry(uint8_t policy, const uint8_t* e) {
  return refused_word(policy, load_le(e, policy_entry_bytes(policy)));
}

}  // namespace mxq::cuda
