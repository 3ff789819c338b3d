// Helpers shared by the CUDA benchmarks (bench_linear, bench_gemm, bench_refit): CUDA-event medians,
// graph-captured launch loops, the device copy ceiling, random non-zero inputs and L2-rotating device copies.
// CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "base/error.h"
#include "cuda/common/check.h"

namespace mxq::cli {

// Median of `reps` CUDA-event timings of `body(rep)` (after `warmup` untimed runs, rep < 0), in ms. `body`
// enqueues work on `stream` and returns a Status.
template <class Body>
Result<float> median_ms(cudaStream_t stream, int warmup, int reps, Body&& body) {
  cudaEvent_t start, stop;
  MXQ_CUDA_CHECK(cudaEventCreate(&start));
  MXQ_CUDA_CHECK(cudaEventCreate(&stop));
  auto timed = [&]() -> Result<float> {
    std::vector<float> ms;
    for (int rep = -warmup; rep < reps; ++rep) {
      MXQ_CUDA_CHECK(cudaEventRecord(start, stream));
      if (Status st = body(rep); !st) return tl::unexpected(st.error());
      MXQ_CUDA_CHECK(cudaEventRecord(stop, stream));
      MXQ_CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0;
      MXQ_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      if (rep >= 0) ms.push_back(t);
    }
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    return ms[ms.size() / 2];
  };
  auto result = timed();
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return result;
}

// median_ms of an `enqueue()` that returns a CUDA status.
template <class Enqueue>
Result<float> median_event_ms(cudaStream_t stream, int warmup, int reps, Enqueue&& enqueue) {
  return median_ms(stream, warmup, reps, [&](int) -> Status {
    MXQ_CUDA_CHECK(enqueue());
    return {};
  });
}

// Times `body(i)` for i = 0..launches-1 captured in one CUDA graph, replayed `reps` times; median µs per
// launch.
template <class Body>
Result<double> time_graph(cudaStream_t stream, int launches, int reps, Body&& body) {
  // note: one uncaptured call first: plans and heuristics are made outside the capture, errors show here.
  if (Status st = body(0); !st) return tl::unexpected(st.error());
  MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  MXQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < launches; ++i) {
    if (Status st = body(i); !st) {
      cudaStreamEndCapture(stream, &graph);
      if (graph) cudaGraphDestroy(graph);
      return tl::unexpected(st.error());
    }
  }
  MXQ_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  MXQ_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  // note: two untimed replays warm clocks and TLBs
  auto ms = median_event_ms(stream, 2, reps, [&] { return cudaGraphLaunch(exec, stream); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  if (!ms) return tl::unexpected(ms.error());
  return 1e3 * *ms / launches;
}

// Device-to-device copy bandwidth over 2 GiB, counting bytes read plus bytes written (GB/s).
inline Result<double> copy_bandwidth(cudaStream_t stream) {
  constexpr size_t kBytes = 2ULL << 30;
  auto src = cuda::DeviceBuffer::alloc(kBytes);
  auto dst = cuda::DeviceBuffer::alloc(kBytes);
  if (!src || !dst) return fail("copy bandwidth: {}", (!src ? src.error() : dst.error()).message);
  MXQ_CUDA_CHECK(cudaMemsetAsync(src->as(), 0x5A, kBytes, stream));
  auto ms = median_event_ms(stream, 1, 7, [&] {
    return cudaMemcpyAsync(dst->as(), src->as(), kBytes, cudaMemcpyDeviceToDevice, stream);
  });
  if (!ms) return tl::unexpected(ms.error());
  return 2.0 * kBytes / (*ms * 1e-3) / 1e9;
}

// note: timed launches read a different copy of their weights each time; 4x the 60 MB L2 keeps them out.
inline constexpr int64_t kRotateBytes = 256LL << 20;

// Copies of a buffer of `bytes` needed to rotate through kRotateBytes (2..64).
inline int copies_for(int64_t bytes) {
  return static_cast<int>(std::clamp<int64_t>(kRotateBytes / bytes + 1, 2, 64));
}

// Random bytes; with `e4m3`, no E4M3 NaN codes (0x7F / 0xFF).
inline std::vector<uint8_t> random_codes(std::mt19937_64& rng, size_t count, bool e4m3) {
  std::vector<uint8_t> v(count);
  for (auto& b : v) {
    do b = static_cast<uint8_t>(rng());
    while (e4m3 && (b & 0x7F) == 0x7F);
  }
  return v;
}

// Random finite bf16 with |x| in [2^-6, 2^2), as little-endian bytes: no zeros (which can run faster than
// real data).
inline std::vector<uint8_t> random_bf16_bytes(std::mt19937_64& rng, size_t count) {
  std::vector<uint8_t> v(count * 2);
  for (size_t i = 0; i < count; ++i) {
    const uint16_t h = static_cast<uint16_t>((rng() & 1) << 15 | (121 + rng() % 8) << 7 | (rng() & 127));
    v[2 * i] = static_cast<uint8_t>(h), v[2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
  return v;
}

// `copies` device copies of the same host bytes.
inline Result<std::vector<cuda::DeviceBuffer>> replicate(const std::vector<uint8_t>& host, int copies) {
  std::vector<cuda::DeviceBuffer> out;
  for (int i = 0; i < copies; ++i) {
    auto b = cuda::DeviceBuffer::alloc(host.size());
    if (!b) return tl::unexpected(b.error());
    MXQ_CUDA_CHECK(cudaMemcpy(b->as(), host.data(), host.size(), cudaMemcpyHostToDevice));
    out.push_back(std::move(*b));
  }
  return out;
}

// A weight shape of the benches: y[M, n] = x[M, k] · W[n, k]^T.
struct BenchShape {
  const char* name;
  int64_t n, k;
};
// note: Qwen3-8B (hidden 4096, 32 q / 8 kv heads of 128, intermediate 12288) and Qwen3-30B-A3B experts
// (hidden 2048, moe_intermediate 768).
inline constexpr BenchShape kQwen3Shapes[] = {
    {"8B q/o_proj", 4096, 4096},
    {"8B qkv_proj", 6144, 4096},
    {"8B gate_up", 24576, 4096},
    {"8B down_proj", 4096, 12288},
    {"30B-A3B expert gate_up", 1536, 2048},
    {"30B-A3B expert down", 2048, 768},
};

// The GPU quantizers' table over `shapes` (bench_quantize_cuda.cpp): bf16 input (and f32 with `with_f32`)
// to every format and rule, against `copy_gbs`.
Status gpu_quantize_table(cudaStream_t stream, double copy_gbs, std::span<const BenchShape> shapes,
                          bool with_f32);
// The bf16 kernels' launch shapes (cuda::QuantLaunch) with PDL on and off, and the plain copy kernel of the
// same bytes, over `shapes` (bench_quantize_shapes.cpp).
Status gpu_quantize_shapes_table(cudaStream_t stream, double copy_gbs, std::span<const BenchShape> shapes);
// Median µs per launch of the plain copy kernel (cuda::launch_copy16) reading and writing `bytes` each.
Result<double> time_copy16(cudaStream_t stream, int64_t bytes);
// `mxq-bench quantize --device cuda`: those two tables over the Qwen3 shapes, plus [rows, cols] when rows >
// 0.
Status run_bench_quantize_cuda(int64_t rows, int64_t cols);

}  // namespace mxq::cli
