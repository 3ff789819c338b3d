// The grouped expert linear of MoE decode (twin: cpu/moe_grouped_linear.h): one launch per projection per
// layer covering every active (expert, entries) group, driven by moe_route's device outputs only (offsets,
// the active-expert list, sorted_rows), so a decode step needs no host round trip and is graph-capturable.
// Kernels: the decode GEMVs' grouped entry (gemv_grouped.cuh) for MXFP8, MXFP4, FP8-B128 (weight-only at
// every M) and a plain bf16 one (gemv_grouped_bf16.cu); each expert's weights in the linear dispatch table's
// native layout (cuda/linear/linear.h), reached through a device pointer table built once at load.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "cuda/common/check.h"
#include "cuda/linear/linear.h"

namespace mxq::cuda {

// One projection's experts: `parts` matrices [n, k] per expert, all of one format (stacked gate_up_proj
// [E, 2I, H]: 1 part of [2I, H]; one module per expert: gate_proj and up_proj, 2 parts of [I, H]).
class MoeGroupedWeights {
 public:
  // w: experts · parts views (expert e, part q at e · parts + q, as linear_weights gives them); refuses
  // mixed formats, shapes or act modes, a format without a grouped kernel, or a shape its kernel cannot take,
  // naming `what`.
  static Result<MoeGroupedWeights> create(std::string what, std::span<const LinearWeights> w, int64_t parts);
  Format format() const { return format_; }
  // The experts' LinearWeights::act (one for all): MXFP8 = the W8A8 mode, applied by the caller to x
  // (Qwen3Cuda::moe_input) since the grouped launch takes no LinearContext.
  Format act() const { return act_; }
  int64_t experts() const { return experts_; }
  int64_t parts() const { return parts_; }
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  const std::string& name() const { return what_; }
  const uint8_t* const* values() const { return table_.as<const uint8_t* const>(); }
  const uint8_t* const* scales() const {
    return format_ == Format::kBF16 ? nullptr : table_.as<const uint8_t* const>() + experts_ * parts_;
  }

 private:
  std::string what_;
  Format format_ = Format::kBF16, act_ = Format::kBF16;
  int64_t experts_ = 0, parts_ = 1, n_ = 0, k_ = 0;
  DeviceBuffer table_;  // device: values pointers [experts · parts], then scales pointers
};

// The routing a grouped projection reads (moe_route's outputs, device): entries p = 0 .. offsets[E] - 1.
struct MoeGroups {
  const int32_t* offsets;      // [experts + 1]
  const int32_t* active;       // [experts]: active experts ascending, then -1
  const int32_t* sorted_rows;  // [max_entries]: routing entry t · top_k + j at each position
  int64_t top_k;
  int64_t max_entries;  // capacity: max_tokens · top_k (sets the launch's slots, min(experts, max_entries))
};

// y part q [max_entries, n] at y + q · max_entries · n: row p = x[row(p)] · W_{e(p), q}^T, bf16 in and out.
// gather: row(p) = sorted_rows[p] / top_k (x = the tokens' input, [max_tokens, k]); otherwise row(p) = p (x
// in entry order, [max_entries, k]). Rows past offsets[E] are untouched.
Status moe_grouped_linear(const MoeGroupedWeights& w, const MoeGroups& g, bool gather, const uint16_t* x,
                          uint16_t* y, cudaStream_t stream);

}  // namespace mxq::cuda
