// The Qwen3 MLP activation: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
#pragma once

#include <cstdint>

namespace mxq {

// gate, up, out: n elements each (out may alias either input).
void swiglu(const float* gate, const float* up, int64_t n, float* out);

}  // namespace mxq
