#include "refit/pending_sums_cuda.h"

#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "cuda/common/check.h"
#include "cuda/refit/refit_launch.h"

namespace mxq::cuda {
namespace {

bool on_device(const uint8_t* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// One plane as a single identity row (canonical bytes where they lie).
DevicePlane flat(std::span<const uint8_t> bytes) {
  DevicePlane p;
  p.native = const_cast<uint8_t*>(bytes.data());
  p.rows = 1, p.row_bytes = static_cast<int64_t>(bytes.size()), p.run = 16;
  return p;
}

}  // namespace

Result<PendingSums> PendingSums::start(std::span<const CanonicalSumJob> jobs, cudaStream_t after) {
  PendingSums p;
  std::vector<ChecksumJobDevice> dev;
  uint64_t blocks = 0;
  for (const CanonicalSumJob& j : jobs) {
    for (auto span : {j.values, j.scales})
      if (!span.empty() && !on_device(span.data()))
        return fail("checksums: a plane at {} is not device memory", fmt::ptr(span.data()));
    ChecksumJobDevice& d = dev.emplace_back();
    d.values = flat(j.values), d.scales = flat(j.scales);
    d.len = static_cast<uint64_t>(j.values.size() + j.scales.size());
    d.first_block = blocks;
    blocks += xxh3_job_blocks(d.len);
    p.outs_.push_back(j.out);
  }
  if (dev.empty()) return p;
  const size_t sum_bytes = static_cast<size_t>(blocks) * 64,
               job_bytes = dev.size() * sizeof(ChecksumJobDevice);
  const size_t out_at = (sum_bytes + job_bytes + 15) / 16 * 16, out_bytes = dev.size() * 8;
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&p.stream_, cudaStreamNonBlocking));
  MXQ_CUDA_CHECK(
      cudaHostAlloc(reinterpret_cast<void**>(&p.host_), out_bytes + job_bytes, cudaHostAllocDefault));
  cudaEvent_t ready;
  MXQ_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  struct Destroy {
    cudaEvent_t e;
    ~Destroy() { (void)cudaEventDestroy(e); }  // note: legal while the wait on it is still queued
  } destroy{ready};
  MXQ_CUDA_CHECK(cudaEventRecord(ready, after));
  MXQ_CUDA_CHECK(cudaStreamWaitEvent(p.stream_, ready, 0));
  MXQ_CUDA_CHECK(cudaMallocAsync(&p.device_, out_at + out_bytes, p.stream_));
  auto* base = static_cast<uint8_t*>(p.device_);
  auto* sums = reinterpret_cast<uint64_t*>(base);
  auto* d_jobs = reinterpret_cast<ChecksumJobDevice*>(base + sum_bytes);
  auto* d_out = reinterpret_cast<uint64_t*>(base + out_at);
  // note: the descriptors go through pinned memory, so the copy is queued, not done on the spot
  auto* staged = reinterpret_cast<uint8_t*>(p.host_) + out_bytes;
  std::memcpy(staged, dev.data(), job_bytes);
  MXQ_CUDA_CHECK(cudaMemcpyAsync(d_jobs, staged, job_bytes, cudaMemcpyHostToDevice, p.stream_));
  MXQ_CUDA_CHECK(launch_xxh3_block_sums(d_jobs, static_cast<int>(dev.size()), blocks, sums, p.stream_));
  MXQ_CUDA_CHECK(launch_xxh3_finish(d_jobs, static_cast<int>(dev.size()), sums, d_out, p.stream_));
  MXQ_CUDA_CHECK(cudaMemcpyAsync(p.host_, d_out, out_bytes, cudaMemcpyDeviceToHost, p.stream_));
  return p;
}

Status PendingSums::wait() {
  if (!stream_) return {};
  MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (size_t k = 0; k < outs_.size(); ++k) *outs_[k] = host_[k];
  return {};
}

PendingSums::PendingSums(PendingSums&& o) noexcept
    : stream_(std::exchange(o.stream_, nullptr)),
      device_(std::exchange(o.device_, nullptr)),
      host_(std::exchange(o.host_, nullptr)),
      outs_(std::move(o.outs_)) {}

PendingSums::~PendingSums() {
  // note: teardown has no caller to tell of a failure; the stream is drained before its memory goes
  if (stream_) {
    if (device_) (void)cudaFreeAsync(device_, stream_);
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  if (host_) (void)cudaFreeHost(host_);
}

}  // namespace mxq::cuda
