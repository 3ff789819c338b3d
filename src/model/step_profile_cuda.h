// CUDA-event timing of the op classes of model/step_profile.h, for an eager forward (never a captured one):
// begin() records a start event, each mark(op) an end event, so op i's time is the GPU time between mark i-1
// and mark i (gaps between its launches included: on a launch-bound step that is host launch overhead, which
// the decode graphs remove; the benchmark prints the graph step beside the sum). finish_step() waits for the
// stream and adds the step's times to the totals.
// Nothing here runs unless a profiler is given to the model (Qwen3Cuda::set_profiler): normal runs record
// no events.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "base/error.h"
#include "model/step_profile.h"

namespace mxq::cuda {

class StepProfiler {
 public:
  static Result<std::unique_ptr<StepProfiler>> create();
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Starts a step on `stream`; refused while the stream is being captured into a graph.
  Status begin(cudaStream_t stream);
  // Ends one op of class `op` that read `bytes`; refused outside begin() / finish_step().
  Status mark(StepOp op, double bytes, cudaStream_t stream);
  // Adds f() to the bytes of the last mark when the step finishes (its events done): for ops whose bytes
  // depend on device data (the grouped MoE decode linears read the active experts' weights only).
  Status late_bytes(std::function<double()> f);
  // Waits for the step's last event and adds its times and bytes to totals().
  Status finish_step();
  bool in_step() const { return in_step_; }
  const StepOpTotals& totals() const { return totals_; }

 private:
  StepProfiler() = default;
  std::vector<cudaEvent_t> events_;  // [0]: the step's start; [i + 1]: the end of marks_[i]
  std::vector<std::pair<StepOp, double>> marks_;
  std::vector<std::pair<size_t, std::function<double()>>> late_;  // (mark index, bytes read after the step)
  bool in_step_ = false;
  StepOpTotals totals_;
};

}  // namespace mxq::cuda
