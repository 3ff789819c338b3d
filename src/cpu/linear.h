// linear: y[M, N] = x[M, K] · W[N, K]^T (+ bias[N]) with W held in its format, dequantized block by block.
#pragma once

#include <cstdint>

#include "base/error.h"
#include "cpu/parallel.h"
#include "cpu/weight_view.h"

namespace mxq {

// x: f32 [m, w.cols] row-major; bias: f32 [w.rows] or nullptr; y: f32 [m, w.rows] row-major.
// Refuses a weight check_weight_view refuses. Accumulates in f32.
// note: m == 1 (decode) takes a fused path (each 32-block decoded into registers and multiplied in);
// m > 1 dequantizes 4-row x 512 tiles once and streams every row of x past them. The two sum in
// different orders, so a row of x may differ in its last bits between them; each is deterministic and
// independent of the thread count.
Status linear(const float* x, int64_t m, const WeightView& w, const float* bias, float* y,
              ThreadPool& pool = default_pool());

}  // namespace mxq
