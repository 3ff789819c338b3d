// linear: y[M, N] = x[M, K] · W[N, K]^T (+ bias[N]) with W held in its format, dequantized block by block.
#pragma once

#include <cstdint>

#include "base/error.h"
#include "cpu/parallel.h"
#include "cpu/weight_view.h"

namespace mxq {

// x: f32 [m, w.cols] row-major; bias: f32 [w.rows] or nullptr; y: f32 [m, w.rows] row-major.
// Refuses a weight check_weight_view refuses. Accumulates in f32.
// note: every row of y is summed in one order (cpu/linear.cpp dot_pair) whatever m is and whatever the other
// rows are, and independently of the thread count: a row alone equals its row in a batch, bit for bit
// (tests/cpu/linear_test.cpp). m > 1 dequantizes tiles once and streams every row of x past them.
Status linear(const float* x, int64_t m, const WeightView& w, const float* bias, float* y,
              ThreadPool& pool = default_pool());

}  // namespace mxq
