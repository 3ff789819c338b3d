// The per-op time breakdown of one decode step (`mxq-bench decode --device cuda --breakdown`, issue #5): the
// op classes the CUDA forward is cut into, their times and bytes summed over layers, and the table that says
// where a step's time goes. The timing itself (CUDA events) is model/step_profile_cuda.h; this half is plain
// arithmetic and formatting, shared with the CPU tests.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mxq {

// In forward order. Norms are every rms_norm / add_rms_norm (residual add included); the MoE route is the
// router linear, top-k and the host-driven grouping (read-back and expert-input copies), the combine the
// weighted sum back into the residual stream.
enum class StepOp : uint8_t {
  kEmbedding,
  kNorm,
  kQkvLinear,
  kQkNormRopeCache,
  kAttention,
  kOLinear,
  kGateUpLinear,
  kSwiglu,
  kDownLinear,
  kMoeRoute,
  kMoeCombine,
  kLmHead,
  kSampling,
};
inline constexpr int kStepOps = 13;
std::string_view step_op_name(StepOp op);

// One step's totals per op class (index = StepOp): GPU time between the op's start and end events, and the
// bytes the op reads (weights, activations, KV cache; estimates from shapes, writes not counted).
struct StepOpTotals {
  std::array<double, kStepOps> us{}, bytes{};
  std::array<int64_t, kStepOps> launches{};  // op instances (layers x calls)
  int64_t steps = 0;                         // steps summed (the table divides by it)
};

struct BreakdownRow {
  std::string op;
  double us = 0, pct = 0, bytes = 0, gbps = 0, pct_copy = 0;
  int64_t launches = 0;
};
// Per-step rows in StepOp order (classes the step never ran left out), then a "total" row; GB/s = bytes
// read / time, % copy = GB/s over `copy_gbps` (the measured device copy ceiling). Empty if no step was
// summed.
std::vector<BreakdownRow> breakdown_rows(const StepOpTotals& t, double copy_gbps);
// The rows as a markdown table: op, µs/step, % of step, bytes read, GB/s, % of copy bandwidth.
std::string format_breakdown(const std::vector<BreakdownRow>& rows);

}  // namespace mxq
