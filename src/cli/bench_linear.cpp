// mxq bench linear: decode GEMV (MXFP8 / MXFP4 weight-only) and GPU quantize on Qwen3 shapes, against the
// copy bandwidth and cuBLAS bf16 measured in the same run. Registered under `mxq bench` by add_bench_linear.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "format/formats.h"

#if defined(MXQ_HAVE_CUDA)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "cuda/check.h"
#include "cuda/gemv_layout.h"
#include "cuda/gemv_mx.h"
#include "cuda/quantize_launch.h"
#endif

namespace mxq::cli {

#if defined(MXQ_HAVE_CUDA)
namespace {

using cuda::DeviceBuffer;

struct Shape {
  const char* name;
  int64_t n, k;
};
// note: Qwen3-8B (hidden 4096, 32 q / 8 kv heads of 128, intermediate 12288) and Qwen3-30B-A3B experts
// (hidden 2048, moe_intermediate 768).
constexpr Shape kShapes[] = {
    {"8B q/o_proj", 4096, 4096},
    {"8B qkv_proj", 6144, 4096},
    {"8B gate_up", 24576, 4096},
    {"8B down_proj", 4096, 12288},
    {"30B-A3B expert gate_up", 1536, 2048},
    {"30B-A3B expert down", 2048, 768},
};
// note: every timed launch reads a different copy of the weights; 4x the 60 MB L2 keeps them out of it.
constexpr int64_t kRotateBytes = 256LL << 20;
constexpr int kLaunchesPerGraph = 20, kReps = 15;

// Median of `reps` CUDA-event timings of `enqueue()` (after `warmup` untimed runs), in ms.
template <class Enqueue>
Result<float> median_event_ms(cudaStream_t stream, int warmup, int reps, Enqueue&& enqueue) {
  cudaEvent_t start, stop;
  MXQ_CUDA_CHECK(cudaEventCreate(&start));
  MXQ_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int rep = -warmup; rep < reps; ++rep) {
    MXQ_CUDA_CHECK(cudaEventRecord(start, stream));
    MXQ_CUDA_CHECK(enqueue());
    MXQ_CUDA_CHECK(cudaEventRecord(stop, stream));
    MXQ_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    MXQ_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    if (rep >= 0) ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

// Times `body(i)` for i = 0..kLaunchesPerGraph-1 captured in one CUDA graph; median µs per launch.
template <class Body>
Result<double> time_graph(cudaStream_t stream, Body&& body) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  MXQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kLaunchesPerGraph; ++i) {
    Status st = body(i);
    if (!st) {
      cudaStreamEndCapture(stream, &graph);
      return tl::unexpected(st.error());
    }
  }
  MXQ_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  MXQ_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  // note: two untimed replays warm clocks and TLBs
  auto ms = median_event_ms(stream, 2, kReps, [&] { return cudaGraphLaunch(exec, stream); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  if (!ms) return tl::unexpected(ms.error());
  return 1e3 * *ms / kLaunchesPerGraph;
}

// Device-to-device copy bandwidth over 2 GiB, counting bytes read plus bytes written (GB/s).
Result<double> copy_bandwidth(cudaStream_t stream) {
  constexpr size_t kBytes = 2ULL << 30;
  auto src = DeviceBuffer::alloc(kBytes);
  auto dst = DeviceBuffer::alloc(kBytes);
  if (!src || !dst) return fail("copy bandwidth: {}", (!src ? src.error() : dst.error()).message);
  MXQ_CUDA_CHECK(cudaMemsetAsync(src->as(), 0x5A, kBytes, stream));
  auto ms = median_event_ms(stream, 1, 7, [&] {
    return cudaMemcpyAsync(dst->as(), src->as(), kBytes, cudaMemcpyDeviceToDevice, stream);
  });
  if (!ms) return tl::unexpected(ms.error());
  return 2.0 * kBytes / (*ms * 1e-3) / 1e9;
}

// `copies` device copies of the same host bytes.
Result<std::vector<DeviceBuffer>> replicate(const std::vector<uint8_t>& host, int copies) {
  std::vector<DeviceBuffer> out;
  for (int i = 0; i < copies; ++i) {
    auto b = DeviceBuffer::alloc(host.size());
    if (!b) return tl::unexpected(b.error());
    MXQ_CUDA_CHECK(cudaMemcpy(b->as(), host.data(), host.size(), cudaMemcpyHostToDevice));
    out.push_back(std::move(*b));
  }
  return out;
}

std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t count, bool e4m3) {
  std::vector<uint8_t> v(count);
  for (auto& b : v) {
    do b = static_cast<uint8_t>(rng());
    while (e4m3 && (b & 0x7F) == 0x7F);
  }
  return v;
}

// Random finite bf16 with |x| in [2^-6, 2^2): no zeros (which can run faster than real data).
std::vector<uint8_t> random_bf16_bytes(std::mt19937_64& rng, size_t count) {
  std::vector<uint8_t> v(count * 2);
  for (size_t i = 0; i < count; ++i) {
    const uint16_t h = static_cast<uint16_t>((rng() & 1) << 15 | (121 + rng() % 8) << 7 | (rng() & 127));
    v[2 * i] = static_cast<uint8_t>(h), v[2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
  return v;
}

int copies_for(int64_t bytes) {
  return static_cast<int>(std::clamp<int64_t>(kRotateBytes / bytes + 1, 2, 64));
}

struct Run {
  std::vector<Format> formats;
  std::vector<int64_t> ms;
  bool quantize = true;
};

Status run_bench(const Run& run) {
  cudaStream_t stream;
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  int dev = 0;
  MXQ_CUDA_CHECK(cudaGetDevice(&dev));
  MXQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  auto copy_gbs = copy_bandwidth(stream);
  if (!copy_gbs) return tl::unexpected(copy_gbs.error());
  cublasHandle_t blas;
  MXQ_CUDA_CHECK(cublasCreate(&blas));
  MXQ_CUDA_CHECK(cublasSetStream(blas, stream));
  auto blas_ws = DeviceBuffer::alloc(64 << 20);  // note: a fixed workspace keeps cuBLAS graph-capturable
  if (!blas_ws) return tl::unexpected(blas_ws.error());
  MXQ_CUDA_CHECK(cublasSetWorkspace(blas, blas_ws->as(), blas_ws->bytes()));
  fmt::print("device: {} ({} SMs, L2 {} MB); copy bandwidth {:.0f} GB/s (read + written, 2 GiB D2D)\n",
             prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, *copy_gbs);
  fmt::print("{:<24} {:>6} {:>6} {:>6} {:>3} {:>8} {:>8} {:>7} {:>8} {:>10} {:>8}\n", "shape", "format", "N",
             "K", "M", "us", "GB/s", "%copy", "TFLOP/s", "cuBLAS us", "vs bf16");
  std::mt19937_64 rng(20261129);
  for (const Shape& s : kShapes) {
    // cuBLAS bf16 peer: rotated bf16 weights, same x / y.
    const int64_t bf16_bytes = s.n * s.k * 2;
    const int bf16_copies = copies_for(bf16_bytes);
    auto wbf = replicate(random_bf16_bytes(rng, static_cast<size_t>(s.n * s.k)), bf16_copies);
    auto x = replicate(random_bf16_bytes(rng, static_cast<size_t>(cuda::kGemvMaxM * s.k)), 1);
    auto y = DeviceBuffer::alloc(static_cast<size_t>(cuda::kGemvMaxM * s.n * 2));
    if (!wbf || !x || !y) return fail("bench linear: device allocation failed for {}", s.name);
    for (Format f : run.formats) {
      const int64_t vbytes = values_bytes(f, s.n, s.k), sbytes = scales_bytes(f, s.n, s.k);
      const auto canonical = random_bytes(rng, static_cast<size_t>(vbytes), f == Format::kMXFP8);
      std::vector<uint8_t> native(canonical.size()), scales(static_cast<size_t>(sbytes));
      for (auto& b : scales) b = static_cast<uint8_t>(115 + rng() % 10);
      if (Status st = cuda::prepare_gemv_values(f, canonical.data(), native.data(), s.n, s.k); !st) return st;
      const int copies = copies_for(vbytes + sbytes);
      auto wv = replicate(native, copies);
      auto ws = replicate(scales, copies);
      if (!wv || !ws) return fail("bench linear: device allocation failed for {} {}", s.name, traits(f).name);
      for (int64_t m : run.ms) {
        auto us = time_graph(stream, [&](int i) {
          const cuda::MxGemvWeights w{f, (*wv)[static_cast<size_t>(i % copies)].as<uint8_t>(),
                                      (*ws)[static_cast<size_t>(i % copies)].as<uint8_t>(), s.n, s.k};
          return f == Format::kMXFP8
                     ? cuda::gemv_mxfp8((*x)[0].as<uint16_t>(), m, w, y->as<uint16_t>(), stream)
                     : cuda::gemv_mxfp4((*x)[0].as<uint16_t>(), m, w, y->as<uint16_t>(), stream);
        });
        if (!us) return tl::unexpected(us.error());
        auto blas_us = time_graph(stream, [&](int i) -> Status {
          const float alpha = 1.0f, beta = 0.0f;
          MXQ_CUDA_CHECK(cublasGemmEx(
              blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.n), static_cast<int>(m),
              static_cast<int>(s.k), &alpha, (*wbf)[static_cast<size_t>(i % bf16_copies)].as(), CUDA_R_16BF,
              static_cast<int>(s.k), (*x)[0].as(), CUDA_R_16BF, static_cast<int>(s.k), &beta, y->as(),
              CUDA_R_16BF, static_cast<int>(s.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
          return {};
        });
        if (!blas_us) return tl::unexpected(blas_us.error());
        const double gbs = (vbytes + sbytes) / (*us * 1e-6) / 1e9;
        fmt::print(
            "{:<24} {:>6} {:>6} {:>6} {:>3} {:>8.2f} {:>8.0f} {:>6.1f}% {:>8.2f} {:>10.2f} {:>7.2f}x\n",
            s.name, traits(f).name, s.n, s.k, m, *us, gbs, 100.0 * gbs / *copy_gbs,
            2.0 * m * s.n * s.k / (*us * 1e-6) / 1e12, *blas_us, *blas_us / *us);
      }
    }
  }
  if (run.quantize) {
    fmt::print("\nquantize bf16 -> format (bytes = bf16 read + values + scales written)\n");
    fmt::print("{:<24} {:>8} {:>6} {:>6} {:>8} {:>8} {:>7}\n", "shape", "format", "N", "K", "us", "GB/s",
               "%copy");
    for (const Shape& s : kShapes) {
      const int64_t in_bytes = s.n * s.k * 2;
      const int copies = copies_for(in_bytes);
      auto xin = replicate(random_bf16_bytes(rng, static_cast<size_t>(s.n * s.k)), copies);
      if (!xin) return tl::unexpected(xin.error());
      for (Format f : {Format::kMXFP8, Format::kMXFP4, Format::kFP8_B128}) {
        const int64_t vbytes = values_bytes(f, s.n, s.k), sbytes = scales_bytes(f, s.n, s.k);
        std::vector<DeviceBuffer> vout, sout;
        for (int i = 0; i < copies; ++i) {
          auto v = DeviceBuffer::alloc(static_cast<size_t>(vbytes));
          auto sc = DeviceBuffer::alloc(static_cast<size_t>(sbytes));
          if (!v || !sc) return fail("bench quantize: device allocation failed for {}", s.name);
          vout.push_back(std::move(*v)), sout.push_back(std::move(*sc));
        }
        // note: the raw launchers, as quantize_bf16 synchronises to read its NaN check back (graphs cannot).
        auto bad = DeviceBuffer::alloc(sizeof(unsigned long long));
        if (!bad) return tl::unexpected(bad.error());
        auto us = time_graph(stream, [&](int i) -> Status {
          const size_t c = static_cast<size_t>(i % copies);
          const uint16_t* xi = (*xin)[c].as<uint16_t>();
          auto* flag = bad->as<unsigned long long>();
          if (f == Format::kMXFP8)
            MXQ_CUDA_CHECK(cuda::launch_quantize_mxfp8_ceil(xi, s.n, s.k, vout[c].as<uint8_t>(),
                                                            sout[c].as<uint8_t>(), flag, stream));
          else if (f == Format::kMXFP4)
            MXQ_CUDA_CHECK(cuda::launch_quantize_mxfp4_ct(xi, s.n, s.k, vout[c].as<uint8_t>(),
                                                          sout[c].as<uint8_t>(), flag, stream));
          else
            MXQ_CUDA_CHECK(cuda::launch_quantize_fp8_b128(xi, s.n, s.k, vout[c].as<uint8_t>(),
                                                          sout[c].as<float>(), flag, stream));
          return {};
        });
        if (!us) return tl::unexpected(us.error());
        const double gbs = (in_bytes + vbytes + sbytes) / (*us * 1e-6) / 1e9;
        fmt::print("{:<24} {:>8} {:>6} {:>6} {:>8.2f} {:>8.0f} {:>6.1f}%\n", s.name, traits(f).name, s.n, s.k,
                   *us, gbs, 100.0 * gbs / *copy_gbs);
      }
    }
  }
  cublasDestroy(blas);
  cudaStreamDestroy(stream);
  return {};
}

}  // namespace
#endif

void add_bench_linear(CLI::App& bench, int& exit_code) {
  auto* cmd =
      bench.add_subcommand("linear", "decode GEMV and GPU quantize vs copy bandwidth and cuBLAS bf16");
  auto formats = std::make_shared<std::vector<std::string>>(std::vector<std::string>{"mxfp8", "mxfp4"});
  auto ms = std::make_shared<std::vector<int64_t>>(std::vector<int64_t>{1, 2, 4, 8, 16});
  auto no_quantize = std::make_shared<bool>(false);
  cmd->add_option("--formats", *formats, "weight formats, comma-separated (mxfp8, mxfp4)")->delimiter(',');
  cmd->add_option("--m", *ms, "activation rows per GEMV, comma-separated (1..16)")->delimiter(',');
  cmd->add_flag("--no-quantize", *no_quantize, "skip the quantize-kernel table");
  cmd->callback([formats, ms, no_quantize, &exit_code] {
#if defined(MXQ_HAVE_CUDA)
    Run run;
    for (const std::string& name : *formats) {
      auto f = parse_format(name);
      if (!f || (*f != Format::kMXFP8 && *f != Format::kMXFP4)) {
        spdlog::error("bench linear: --formats {}: no GEMV kernel (expected mxfp8 or mxfp4)", name);
        exit_code = kExitBadInput;
        return;
      }
      run.formats.push_back(*f);
    }
    for (int64_t m : *ms)
      if (m < 1 || m > cuda::kGemvMaxM) {
        spdlog::error("bench linear: --m {}: the GEMV path takes 1..{} (the large-M path is not built yet)",
                      m, cuda::kGemvMaxM);
        exit_code = kExitBadInput;
        return;
      }
    run.ms = *ms;
    run.quantize = !*no_quantize;
    if (Status st = run_bench(run); !st) {
      spdlog::error("bench linear: {}", st.error().message);
      exit_code = 1;
    }
#else
    spdlog::error("bench linear: this mxq was built without CUDA (expected a build where nvcc was found)");
    exit_code = 1;
#endif
  });
}

}  // namespace mxq::cli
