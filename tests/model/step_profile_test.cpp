// The arithmetic and table of the per-op decode breakdown (model/step_profile.h): per-step means over the
// summed steps, shares of the step, GB/s and % of the copy ceiling, classes that never ran left out, the
// total row last; on random totals, checked against sums computed here.
#include "model/step_profile.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace mxq {
namespace {

TEST(StepProfile, RowsAreMeansSharesAndBandwidthOfTheRanClasses) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> us(1, 500), bytes(1e3, 1e9);
  StepOpTotals t;
  t.steps = 1 + static_cast<int64_t>(rng() % 7);
  std::set<int> ran;
  double sum_us = 0, sum_bytes = 0;
  for (int i = 0; i < kStepOps; ++i) {
    if (rng() % 3 == 0 && i != 0) continue;  // a class this model never runs (MoE on a dense model, ...)
    ran.insert(i);
    t.us[i] = us(rng) * static_cast<double>(t.steps);
    t.bytes[i] = bytes(rng) * static_cast<double>(t.steps);
    t.launches[i] = (1 + static_cast<int64_t>(rng() % 36)) * t.steps;
    sum_us += t.us[i] / static_cast<double>(t.steps);
    sum_bytes += t.bytes[i] / static_cast<double>(t.steps);
  }
  const double copy = 4300;
  const auto rows = breakdown_rows(t, copy);
  ASSERT_EQ(rows.size(), ran.size() + 1);
  size_t r = 0;
  double pct = 0;
  for (int i : ran) {
    const BreakdownRow& row = rows[r++];
    SCOPED_TRACE(row.op);
    EXPECT_EQ(row.op, step_op_name(static_cast<StepOp>(i)));
    const double want_us = t.us[i] / static_cast<double>(t.steps);
    const double want_bytes = t.bytes[i] / static_cast<double>(t.steps);
    EXPECT_DOUBLE_EQ(row.us, want_us);
    EXPECT_DOUBLE_EQ(row.bytes, want_bytes);
    EXPECT_EQ(row.launches, t.launches[i] / t.steps);
    EXPECT_NEAR(row.pct, 100 * want_us / sum_us, 1e-9);
    EXPECT_NEAR(row.gbps, want_bytes / want_us * 1e-3, 1e-9 * row.gbps);
    EXPECT_NEAR(row.pct_copy, 100 * row.gbps / copy, 1e-9);
    pct += row.pct;
  }
  EXPECT_NEAR(pct, 100, 1e-9);
  const BreakdownRow& total = rows.back();
  EXPECT_EQ(total.op, "total");
  EXPECT_NEAR(total.us, sum_us, 1e-9 * sum_us);
  EXPECT_NEAR(total.bytes, sum_bytes, 1e-9 * sum_bytes);
  EXPECT_NEAR(total.pct, 100, 1e-9);

  // one table line per row plus the header and the rule, each naming its op
  const std::string table = format_breakdown(rows);
  EXPECT_EQ(static_cast<size_t>(std::count(table.begin(), table.end(), '\n')), rows.size() + 2);
  for (const BreakdownRow& row : rows) EXPECT_NE(table.find("| " + row.op), std::string::npos) << table;
}

TEST(StepProfile, NoStepsNoRowsAndEveryClassHasAName) {
  EXPECT_TRUE(breakdown_rows(StepOpTotals{}, 4300).empty());
  std::set<std::string_view> names;
  for (int i = 0; i < kStepOps; ++i) names.insert(step_op_name(static_cast<StepOp>(i)));
  EXPECT_EQ(names.size(), static_cast<size_t>(kStepOps));
  EXPECT_EQ(names.count("?"), 0u);
}

}  // namespace
}  // namespace mxq
