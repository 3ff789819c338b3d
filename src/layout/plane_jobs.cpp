#include "layout/plane_jobs.h"

#include <cstring>
#include <limits>

namespace mxq {

bool new_entry_refused(NewBytePolicy policy, const uint8_t* e) {
  uint32_t w = 0;
  switch (policy) {
    case NewBytePolicy::kE4M3:
      return (e[0] & 0x7F) == 0x7F;
    case NewBytePolicy::kE8M0:
      return e[0] == 0xFF;
    case NewBytePolicy::kF32Scale: {
      float f = 0;
      std::memcpy(&f, e, 4);
      return !(f > 0.0f && f <= std::numeric_limits<float>::max());
    }
    case NewBytePolicy::kBF16:
      return ((e[0] | e[1] << 8) >> 7 & 0xFF) == 0xFF;
    case NewBytePolicy::kF16:
      return ((e[0] | e[1] << 8) >> 10 & 0x1F) == 0x1F;
    case NewBytePolicy::kF32:
      std::memcpy(&w, e, 4);
      return (w >> 23 & 0xFF) == 0xFF;
    case NewBytePolicy::kNone:
      return false;
  }
  return false;
}

}  // namespace mxq
