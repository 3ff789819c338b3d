// The step builder both runners share: one scheduler plan written into StepMeta (token ids, positions, slot
// mapping, block tables, sequence lengths, cu_seqlens, the sampling parameters of each sampling row), with
// decode steps padded to `seqs` sequences (CUDA graph buckets; the CPU runs seqs = the plan's sequences).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "base/error.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "model/step.h"

namespace mxq {

struct StepLayout {
  bool decode = false;               // every chunk one token, every chunk sampling
  int32_t seqs = 0;                  // sequences of the step, padding included
  int64_t rows = 0;                  // token rows, padding included (decode: seqs, else the plan's tokens)
  std::vector<int32_t> sample_rows;  // the token row of each sampling row
};

// The forward's shape of a built step: a decode step samples every row (padding included), a mixed step
// the rows `layout.sample_rows` names (the span points into `layout`, which must outlive the shape).
ForwardShape forward_shape(const StepLayout& layout);

// Whether `plan` is a decode step (one token per chunk, every chunk sampling).
bool is_decode_plan(const StepPlan& plan);

// Writes `plan` into `h` for a step of `seqs` sequences (>= the plan's chunks: padding rows get no KV slot,
// padding sequences no length). Refuses a request the scheduler does not hold, a sequence with more blocks
// than max_blocks or too few for its positions, and a sampling chunk without a spec.
Result<StepLayout> build_step(const StepPlan& plan, const Scheduler& scheduler,
                              std::span<const SampleSpec> specs, int32_t seqs, int32_t max_blocks,
                              int32_t block_size, StepMeta& h);
// The same over sequences found by `find` (null: not held), for a runner without a scheduler (Sequence).
Result<StepLayout> build_step(const StepPlan& plan, const std::function<const SequenceState*(uint64_t)>& find,
                              std::span<const SampleSpec> specs, int32_t seqs, int32_t max_blocks,
                              int32_t block_size, StepMeta& h);

}  // namespace mxq
