// The grouped expert linear of a MoE block (twin of cuda/moe_grouped_linear): every expert's projection on
// its group of routing entries, in moe_route's sorted order. Per expert e and part q (gate / up of one
// module per expert; one part for stacked gate_up_proj or down_proj), for each entry p in [offsets[e],
// offsets[e + 1]): y_q[p, :] = x[row(p), :] · W_{e, q}^T, row(p) = sorted_rows[p] / top_k when gathering
// (x = the tokens' input) or p (x already in entry order), through cpu/linear (f32 accumulate).
#pragma once

#include <cstdint>
#include <span>

#include "base/error.h"
#include "cpu/parallel.h"
#include "cpu/weight_view.h"

namespace mxq {

// w: experts · parts views, expert e part q at e · parts + q, each [n, k]; x f32 rows of k; y f32 part q at
// y + q · part_stride, entry p's row at + p · n. sorted_rows null: row(p) = p. Refuses mixed shapes or a
// view cpu/linear refuses, naming `what`.
Status moe_grouped_linear(std::string_view what, std::span<const WeightView> w, int64_t parts,
                          const int32_t* offsets, const int32_t* sorted_rows, int64_t top_k, const float* x,
                          float* y, int64_t part_stride, ThreadPool& pool = default_pool());

}  // namespace mxq
