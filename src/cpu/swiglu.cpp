#include "cpu/swiglu.h"

#include <cmath>

namespace mxq {

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  // note: g / (1 + exp(-g)) stays finite for every finite g: exp overflows to inf and g / inf = -0.
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace mxq
