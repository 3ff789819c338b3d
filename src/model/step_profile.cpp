#include "model/step_profile.h"

#include <fmt/format.h>

namespace mxq {

std::string_view step_op_name(StepOp op) {
  static constexpr std::string_view kNames[kStepOps] = {
      "embedding",   "norms",          "qkv linear", "qk-norm+rope+cache", "attention",
      "o linear",    "gate_up linear", "swiglu",     "down linear",        "moe route",
      "moe combine", "lm_head",        "sampling"};
  const auto i = static_cast<size_t>(op);
  return i < static_cast<size_t>(kStepOps) ? kNames[i] : "?";
}

std::vector<BreakdownRow> breakdown_rows(const StepOpTotals& t, double copy_gbps) {
  std::vector<BreakdownRow> rows;
  if (t.steps < 1) return rows;
  const double steps = static_cast<double>(t.steps);
  double total_us = 0, total_bytes = 0;
  int64_t total_launches = 0;
  for (int i = 0; i < kStepOps; ++i) {
    total_us += t.us[i] / steps;
    total_bytes += t.bytes[i] / steps;
    total_launches += t.launches[i];
  }
  auto row = [&](std::string name, double us, double bytes, int64_t launches) {
    BreakdownRow r{std::move(name), us, 0, bytes, 0, 0, launches / t.steps};
    r.pct = total_us > 0 ? 100 * us / total_us : 0;
    r.gbps = us > 0 ? bytes / (us * 1e-6) / 1e9 : 0;
    r.pct_copy = copy_gbps > 0 ? 100 * r.gbps / copy_gbps : 0;
    return r;
  };
  for (int i = 0; i < kStepOps; ++i)
    if (t.launches[i] > 0)
      rows.push_back(row(std::string(step_op_name(static_cast<StepOp>(i))), t.us[i] / steps,
                         t.bytes[i] / steps, t.launches[i]));
  rows.push_back(row("total", total_us, total_bytes, total_launches));
  return rows;
}

std::string format_breakdown(const std::vector<BreakdownRow>& rows) {
  std::string out = fmt::format("| {:<20} | {:>6} | {:>10} | {:>8} | {:>12} | {:>8} | {:>8} |\n", "op",
                                "calls", "µs/step", "% step", "bytes read", "GB/s", "% copy");
  out +=
      fmt::format("|{:-<22}|{:->8}|{:->12}|{:->10}|{:->14}|{:->10}|{:->10}|\n", "", "", "", "", "", "", "");
  for (const BreakdownRow& r : rows) {
    const std::string bytes = r.bytes >= 1e9   ? fmt::format("{:.2f} GB", r.bytes / 1e9)
                              : r.bytes >= 1e6 ? fmt::format("{:.2f} MB", r.bytes / 1e6)
                                               : fmt::format("{:.1f} kB", r.bytes / 1e3);
    out += fmt::format("| {:<20} | {:>6} | {:>10.1f} | {:>7.1f}% | {:>12} | {:>8.0f} | {:>7.1f}% |\n", r.op,
                       r.launches, r.us, r.pct, bytes, r.gbps, r.pct_copy);
  }
  return out;
}

}  // namespace mxq
