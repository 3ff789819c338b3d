// Helpers of the scheduler tests (scheduler_test.cpp, prefix_cache_test.cpp): prompts and one step of a plan.
#pragma once

#include <cstdint>
#include <numeric>
#include <vector>

#include "engine/scheduler.h"

namespace mxq::test {

// Tokens first, first + 1, ...: distinct within a prompt, so no block repeats by accident.
inline std::vector<int32_t> prompt_of(int64_t n, int32_t first = 1) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), first);
  return p;
}

// Completes `plan` with token 1000 + id sampled by every sampling chunk; returns the sequences that finished.
inline std::vector<uint64_t> run_step(Scheduler& s, const StepPlan& plan) {
  std::vector<int32_t> sampled;
  for (const auto& c : plan.chunks)
    if (c.samples) sampled.push_back(static_cast<int32_t>(1000 + c.id));
  return s.complete(plan, sampled);
}

}  // namespace mxq::test
