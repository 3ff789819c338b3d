// The token → expert plumbing of a Qwen3-MoE block as the CUDA engine runs it (twin of cuda/moe_route):
// routing (cpu/moe_router, ties to the lower expert), the grouping a grouped expert linear reads, and the
// weighted combine of expert outputs back to tokens in the CPU forward's order.
#pragma once

#include <cstdint>

#include "base/error.h"

namespace mxq {

// Routing entries are numbered i = t * top_k + j (token t's j-th choice). After moe_router (ids, weights
// [tokens, top_k]): counts[e] = entries routed to e; offsets [experts + 1] their exclusive prefix sum;
// sorted_rows[offsets[e] ..] the entries of expert e in increasing i (so in token order, as model/qwen3.cpp's
// per-expert row lists); row_of[i] the position of entry i in sorted_rows. The grouped linear reads x row
// sorted_rows[p] / top_k into its row p and writes y row p. active (optional, [experts]): the experts with
// entries in increasing id, then -1 (the grouped linear's slots).
Status moe_route(const float* logits, int64_t tokens, int64_t experts, int64_t top_k, bool norm_topk_prob,
                 int32_t* ids, float* weights, int32_t* counts, int32_t* offsets, int32_t* sorted_rows,
                 int32_t* row_of, int32_t* active = nullptr);

// d[j] += s[j] * w for j < width: HF's routing-weight multiply, then its index_add_. The one body of every
// CPU combine, so the compiler contracts it the same way wherever a combine runs.
void add_scaled_row(float* d, const float* s, float w, int64_t width);

// out[t, :] = Σ over token t's choices in increasing expert id of weights[t, j] · y[row_of[t, j], :], added
// by add_scaled_row starting from 0: model/qwen3.cpp's expert loop, bit for bit. y: [tokens * top_k, width];
// out: [tokens, width].
void moe_combine(const float* y, int64_t width, const int32_t* ids, const float* weights,
                 const int32_t* row_of, int64_t tokens, int64_t top_k, float* out);

}  // namespace mxq
