// Token embedding lookup: rows of an embedding table gathered into f32.
#pragma once

#include <cstdint>

#include "base/error.h"
#include "cpu/weight_view.h"

namespace mxq {

// out[i, :] = table[ids[i], :] for i < count; table: [vocab, dim] in any format check_weight_view accepts
// (bf16 / f32 in practice), out: f32 [count, dim]. Refuses an id outside [0, vocab) by position and value.
Status embedding(const int32_t* ids, int64_t count, const WeightView& table, float* out);

}  // namespace mxq
