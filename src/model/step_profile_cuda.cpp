#include "model/step_profile_cuda.h"

#include "cuda/common/check.h"

namespace mxq::cuda {

Result<std::unique_ptr<StepProfiler>> StepProfiler::create() {
  std::unique_ptr<StepProfiler> p(new StepProfiler());
  // note: a decode step of a 36-layer model marks ~ 36 x 9 ops; events are created up front in that many
  // and grown (outside any capture) if a step has more.
  p->events_.reserve(512);
  for (int i = 0; i < 512; ++i) {
    cudaEvent_t e = nullptr;
    MXQ_CUDA_CHECK(cudaEventCreate(&e));
    p->events_.push_back(e);
  }
  return p;
}

StepProfiler::~StepProfiler() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

Status StepProfiler::begin(cudaStream_t stream) {
  auto capturing = stream_capturing(stream);
  if (!capturing) return tl::unexpected(capturing.error());
  if (*capturing)
    return fail("step profile: the stream is capturing a CUDA graph (the profile times eager steps only)");
  if (in_step_) return fail("step profile: begin() inside a step (finish_step() first)");
  marks_.clear();
  late_.clear();
  MXQ_CUDA_CHECK(cudaEventRecord(events_[0], stream));
  in_step_ = true;
  return {};
}

Status StepProfiler::mark(StepOp op, double bytes, cudaStream_t stream) {
  if (!in_step_) return fail("step profile: mark({}) outside a step", step_op_name(op));
  if (marks_.size() + 1 >= events_.size()) {
    cudaEvent_t e = nullptr;
    MXQ_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  marks_.emplace_back(op, bytes);
  MXQ_CUDA_CHECK(cudaEventRecord(events_[marks_.size()], stream));
  return {};
}

Status StepProfiler::late_bytes(std::function<double()> f) {
  if (!in_step_ || marks_.empty()) return fail("step profile: late_bytes() before a mark");
  late_.emplace_back(marks_.size() - 1, std::move(f));
  return {};
}

Status StepProfiler::finish_step() {
  if (!in_step_) return fail("step profile: finish_step() outside a step");
  in_step_ = false;
  MXQ_CUDA_CHECK(cudaEventSynchronize(events_[marks_.size()]));
  for (size_t i = 0; i < marks_.size(); ++i) {
    float ms = 0;
    MXQ_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    const auto op = static_cast<size_t>(marks_[i].first);
    totals_.us[op] += 1e3 * ms;
    totals_.bytes[op] += marks_[i].second;
    ++totals_.launches[op];
  }
  for (auto& [i, f] : late_) totals_.bytes[static_cast<size_t>(marks_[i].first)] += f();
  late_.clear();
  ++totals_.steps;
  return {};
}

}  // namespace mxq::cuda
