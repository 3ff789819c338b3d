// linear: y[M, N] = x[M, K] · W[N, K]^T (+ bias[N]) with W held in its format, dequantized block by block.
#pragma once

#include <cstdint>

#include "base/error.h"
#include "cpu/parallel.h"
#include "cpu/weight_view.h"

namespace mxq {

// x: f32 [m, w.cols] row-major; bias: f32 [w.rows] or nullptr; y: f32 [m, w.rows] row-major.
// Refuses a weight check_weight_view refuses. Accumulates in f32.
Status linear(const float* x, int64_t m, const WeightView& w, const float* bias, float* y,
              ThreadPool& pool = default_pool());

}  // namespace mxq
