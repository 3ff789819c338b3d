// mxq-bench gemm: large-M MXFP8 / MXFP4 weight-only GEMM (prefill) on Qwen3-8B shapes against cuBLAS bf16
// (cublasGemmEx, bf16 in and out, f32 accumulation) on the same shape in the same run.

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
#include <span>

#include "bench/bench_cuda.h"
#include "cuda/common/check.h"
#include "cuda/linear/gemm_mx.h"
#include "cuda/linear/gemv_layout.h"
#endif

namespace mxq::cli {

#if defined(MXQ_HAVE_CUDA)
namespace {

using cuda::DeviceBuffer;

constexpr int kLaunchesPerGraph = 10, kReps = 9;

Status run_bench(const std::vector<Format>& formats, const std::vector<int64_t>& ms) {
  cudaStream_t stream;
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  int dev = 0;
  MXQ_CUDA_CHECK(cudaGetDevice(&dev));
  MXQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  cublasHandle_t blas;
  MXQ_CUDA_CHECK(cublasCreate(&blas));
  MXQ_CUDA_CHECK(cublasSetStream(blas, stream));
  auto blas_ws = DeviceBuffer::alloc(64 << 20);  // note: a fixed workspace keeps cuBLAS graph-capturable
  // note: the split-K scratch LinearContext gives the MX GEMM in the engine (gemm_mx.h)
  auto splitk_buf = DeviceBuffer::alloc(static_cast<size_t>(cuda::kGemmSplitKFloats) * sizeof(float));
  if (!splitk_buf) return tl::unexpected(splitk_buf.error());
  const std::span<float> splitk{splitk_buf->as<float>(), static_cast<size_t>(cuda::kGemmSplitKFloats)};
  if (!blas_ws) return tl::unexpected(blas_ws.error());
  MXQ_CUDA_CHECK(cublasSetWorkspace(blas, blas_ws->as(), blas_ws->bytes()));
  fmt::print("device: {} ({} SMs, L2 {} MB)\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  fmt::print("{:<14} {:>6} {:>6} {:>6} {:>5} {:>9} {:>8} {:>10} {:>8} {:>8}\n", "shape", "format", "N", "K",
             "M", "us", "TFLOP/s", "cuBLAS us", "TFLOP/s", "%cuBLAS");
  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  std::mt19937_64 rng(20261129);
  // note: the Qwen3-8B rows of the shared table (the 30B-A3B expert shapes are GEMV-sized)
  for (const BenchShape& s : std::span(kQwen3Shapes).first(4)) {
    const int64_t bf16_bytes = s.n * s.k * 2;
    const int bf16_copies = copies_for(bf16_bytes);
    auto wbf = replicate(random_bf16_bytes(rng, static_cast<size_t>(s.n * s.k)), bf16_copies);
    auto x = replicate(random_bf16_bytes(rng, static_cast<size_t>(max_m * s.k)), 1);
    auto y = DeviceBuffer::alloc(static_cast<size_t>(max_m * s.n * 2));
    if (!wbf || !x || !y) return fail("bench gemm: device allocation failed for {}", s.name);
    const auto* xp = (*x)[0].as<uint16_t>();
    auto* yp = y->as<uint16_t>();
    std::vector<double> blas_us;
    for (int64_t m : ms) {
      auto us = time_graph(stream, kLaunchesPerGraph, kReps, [&](int i) -> Status {
        const float alpha = 1.0f, beta = 0.0f;
        MXQ_CUDA_CHECK(
            cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.n), static_cast<int>(m),
                         static_cast<int>(s.k), &alpha, (*wbf)[static_cast<size_t>(i % bf16_copies)].as(),
                         CUDA_R_16BF, static_cast<int>(s.k), xp, CUDA_R_16BF, static_cast<int>(s.k), &beta,
                         yp, CUDA_R_16BF, static_cast<int>(s.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return {};
      });
      if (!us) return tl::unexpected(us.error());
      blas_us.push_back(*us);
    }
    for (Format f : formats) {
      const int64_t vbytes = values_bytes(f, s.n, s.k), sbytes = scales_bytes(f, s.n, s.k);
      const auto canonical = random_codes(rng, static_cast<size_t>(vbytes), f == Format::kMXFP8);
      std::vector<uint8_t> native(canonical.size()), scales(static_cast<size_t>(sbytes));
      for (auto& b : scales) b = static_cast<uint8_t>(115 + rng() % 10);
      if (Status st = cuda::prepare_gemv_values(f, canonical.data(), native.data(), s.n, s.k); !st) return st;
      const int copies = copies_for(vbytes + sbytes);
      auto wv = replicate(native, copies);
      auto ws = replicate(scales, copies);
      if (!wv || !ws) return fail("bench gemm: device allocation failed for {} {}", s.name, traits(f).name);
      for (size_t mi = 0; mi < ms.size(); ++mi) {
        const int64_t m = ms[mi];
        auto us = time_graph(stream, kLaunchesPerGraph, kReps, [&](int i) {
          const cuda::MxGemvWeights w{f, (*wv)[static_cast<size_t>(i % copies)].as<uint8_t>(),
                                      (*ws)[static_cast<size_t>(i % copies)].as<uint8_t>(), s.n, s.k};
          return f == Format::kMXFP8 ? cuda::gemm_mxfp8(xp, m, w, yp, stream, splitk)
                                     : cuda::gemm_mxfp4(xp, m, w, yp, stream, splitk);
        });
        if (!us) return tl::unexpected(us.error());
        const double flop = 2.0 * m * s.n * s.k;
        fmt::print("{:<14} {:>6} {:>6} {:>6} {:>5} {:>9.1f} {:>8.1f} {:>10.1f} {:>8.1f} {:>7.1f}%\n", s.name,
                   traits(f).name, s.n, s.k, m, *us, flop / (*us * 1e6), blas_us[mi],
                   flop / (blas_us[mi] * 1e6), 100.0 * blas_us[mi] / *us);
      }
    }
  }
  cublasDestroy(blas);
  cudaStreamDestroy(stream);
  return {};
}

}  // namespace
#endif

void add_bench_gemm(CLI::App& bench, int& exit_code) {
  auto* cmd = bench.add_subcommand("gemm", "large-M MXFP8 / MXFP4 weight-only GEMM vs cuBLAS bf16");
  auto formats = std::make_shared<std::vector<std::string>>(std::vector<std::string>{"mxfp8", "mxfp4"});
  auto ms = std::make_shared<std::vector<int64_t>>(std::vector<int64_t>{32, 128, 512, 4096, 8192});
  cmd->add_option("--formats", *formats, "weight formats, comma-separated (mxfp8, mxfp4)")->delimiter(',');
  cmd->add_option("--m", *ms, "activation rows, comma-separated (>= 1)")->delimiter(',');
  cmd->callback([formats, ms, &exit_code] {
#if defined(MXQ_HAVE_CUDA)
    std::vector<Format> fs;
    for (const std::string& name : *formats) {
      auto f = parse_format(name);
      if (!f || (*f != Format::kMXFP8 && *f != Format::kMXFP4)) {
        fmt::print(stderr, "mxq-bench gemm: --formats {}: no GEMM kernel (expected mxfp8 or mxfp4)\n", name);
        exit_code = kExitBadInput;
        return;
      }
      fs.push_back(*f);
    }
    if (ms->empty() || std::any_of(ms->begin(), ms->end(), [](int64_t m) { return m < 1 || m > 65536; })) {
      fmt::print(stderr, "mxq-bench gemm: --m takes 1..65536\n");
      exit_code = kExitBadInput;
      return;
    }
    if (Status st = run_bench(fs, *ms); !st) {
      fmt::print(stderr, "mxq-bench gemm: {}\n", st.error().message);
      exit_code = 1;
    }
#else
    fmt::print(stderr,
               "mxq-bench gemm: this mxq was built without CUDA (expected a build where nvcc was found)\n");
    exit_code = kExitBadInput;
#endif
  });
}

}  // namespace mxq::cli
