// Unchecked grouped expert GEMV launchers (nvcc side); cuda/linear/moe_grouped_linear.cpp checks the
// arguments and calls these. Contract and layouts: cuda/linear/moe_grouped_linear.h and gemv_grouped.cuh.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

// One grouped projection of a MoE layer: for every active expert e (active[slot], -1 past the last) and
// every entry p in [offsets[e], offsets[e + 1]), y_part[p, :] = x[row(p), :] · W_{e, part}^T, where
// row(p) = x_rows[p] / x_div (x_rows = moe_route's sorted_rows, x_div = top_k: x is the tokens' input) or p
// (x_rows null: x already in entry order, e.g. the SwiGLU output).
struct GroupedGemvArgs {
  const uint16_t* x;             // bf16 [rows, k]
  const int32_t* x_rows;         // [entries] or null
  int x_div;                     // >= 1
  const int32_t* offsets;        // [experts + 1], device
  const int32_t* active;         // [experts]: active experts, ascending, then -1
  const uint8_t* const* values;  // [experts * parts] device pointers: expert e, part q at e * parts + q
  const uint8_t* const* scales;  // [experts * parts] (null for bf16)
  uint16_t* y;                   // bf16: part q at y + q * part_stride, entry p's row at + p * n
  int64_t part_stride;           // elements
  int64_t s_row, s_col;  // FP8-B128: the weight scale of block (nb, kb) at scales[nb·s_row + kb·s_col]
  int n, k, parts;       // every part of every expert is [n, k]
  int slots;             // grid.y: min(experts, max entries); slots past the active count exit
  int max_ntiles;        // 1 or 2: a block runs its entries in chunks of 8 · max_ntiles rows
};

// The n-tile count of a grouped launch for a step of up to max_tokens tokens (an expert gets at most one
// entry per token): 1 (chunks of 8 rows) up to 32 tokens, 2 (chunks of 16) above.
constexpr int gemv_grouped_max_ntiles(int64_t max_tokens) { return max_tokens <= 32 ? 1 : 2; }

cudaError_t launch_gemv_grouped_mxfp8(const GroupedGemvArgs& a, cudaStream_t stream);
cudaError_t launch_gemv_grouped_mxfp4(const GroupedGemvArgs& a, cudaStream_t stream);
cudaError_t launch_gemv_grouped_fp8_b128(const GroupedGemvArgs& a, cudaStream_t stream);
cudaError_t launch_gemv_grouped_bf16(const GroupedGemvArgs& a, cudaStream_t stream);

}  // namespace mxq::cuda
