// The GPU quantizers' table (`mxq-bench quantize --device cuda`, and the last table of `mxq-bench linear`):
// bf16 / f32 [N, K] -> MXFP8 (every scale rule), MXFP4, FP8-B128 on Qwen3 shapes, GB/s = input read + values
// + scales written, against the device-to-device copy rate (read + written) measured in the same process.
// CUDA-graph event medians over L2-rotated copies of the input; fresh random non-zero inputs. The bf16
// kernels launch with PDL as the process default (cuda/common/pdl.h). `%same`: against a plain copy kernel
// (bench/cuda/copy16.cu) moving the same total bytes in the same graph setup, since one launch of a few MB
// cannot reach the 2 GiB copy rate. `mxq-bench quantize --device cuda` adds the launch-shape table
// (quantize_launch.h's QuantLaunch, PDL on and off).
#if defined(MXQ_HAVE_CUDA)
#include <fmt/format.h>

#include <random>
#include <span>
#include <vector>

#include "bench/bench_cuda.h"
#include "cuda/common/check.h"
#include "cuda/quantize/quantize_launch.h"
#include "format/formats.h"

namespace mxq::cli {
namespace {

using cuda::DeviceBuffer;
using cuda::QuantFormat;
using cuda::QuantRule;
using cuda::QuantSrc;

struct Case {
  Format format;
  QuantRule rule;
  const char* rule_name;
};
constexpr Case kCases[] = {
    {Format::kMXFP8, QuantRule::kCeil, "ceil"},   {Format::kMXFP8, QuantRule::kOcp, "ocp"},
    {Format::kMXFP8, QuantRule::kFloor, "floor"}, {Format::kMXFP8, QuantRule::kCt, "ct"},
    {Format::kMXFP4, QuantRule::kCt, "ct"},       {Format::kFP8_B128, QuantRule::kCeil, "-"}};
constexpr int kLaunchesPerGraph = 20, kReps = 15;

}  // namespace

// Median µs of launch_copy16 moving `bytes` (read `bytes`, write `bytes`) from rotated buffers.
Result<double> time_copy16(cudaStream_t stream, int64_t bytes) {
  bytes = bytes / 16 * 16;
  const int copies = copies_for(2 * bytes);
  std::vector<DeviceBuffer> src, dst;
  for (int i = 0; i < copies; ++i) {
    auto a = DeviceBuffer::alloc(static_cast<size_t>(bytes));
    auto b = DeviceBuffer::alloc(static_cast<size_t>(bytes));
    if (!a || !b) return fail("bench quantize: device allocation failed for a {}-byte copy", bytes);
    MXQ_CUDA_CHECK(cudaMemsetAsync(a->as(), 0x5A, static_cast<size_t>(bytes), stream));
    src.push_back(std::move(*a)), dst.push_back(std::move(*b));
  }
  return time_graph(stream, kLaunchesPerGraph, kReps, [&](int i) -> Status {
    const size_t k = static_cast<size_t>(i % copies);
    MXQ_CUDA_CHECK(cuda::launch_copy16(src[k].as(), dst[k].as(), bytes, stream));
    return {};
  });
}

namespace {

QuantFormat quant_format(Format f) {
  return f == Format::kMXFP8   ? QuantFormat::kMXFP8
         : f == Format::kMXFP4 ? QuantFormat::kMXFP4
                               : QuantFormat::kFP8_B128;
}

// Random f32 elements (the bf16 table's values widened: same magnitudes, exact in both dtypes).
std::vector<uint8_t> random_f32_bytes(std::mt19937_64& rng, size_t count) {
  const std::vector<uint8_t> h = random_bf16_bytes(rng, count);
  std::vector<uint8_t> out(count * 4, 0);
  for (size_t i = 0; i < count; ++i) out[4 * i + 2] = h[2 * i], out[4 * i + 3] = h[2 * i + 1];
  return out;
}

}  // namespace

Status gpu_quantize_table(cudaStream_t stream, double copy_gbs, std::span<const BenchShape> shapes,
                          bool with_f32) {
  std::mt19937_64 rng(20261129);
  fmt::print(
      "\nquantize -> format on the GPU (GB/s = input read + values + scales written; %copy of {:.0f} GB/s)\n",
      copy_gbs);
  fmt::print("{:<24} {:>4} {:>8} {:>5} {:>6} {:>6} {:>8} {:>8} {:>7} {:>7}\n", "shape", "src", "format",
             "rule", "N", "K", "us", "GB/s", "%copy", "%same");
  for (const BenchShape& s : shapes) {
    for (QuantSrc src : {QuantSrc::kBF16, QuantSrc::kF32}) {
      if (src == QuantSrc::kF32 && !with_f32) continue;
      const int64_t elem = src == QuantSrc::kF32 ? 4 : 2, in_bytes = s.n * s.k * elem;
      const int copies = copies_for(in_bytes);
      const size_t count = static_cast<size_t>(s.n * s.k);
      auto xin = replicate(
          src == QuantSrc::kF32 ? random_f32_bytes(rng, count) : random_bf16_bytes(rng, count), copies);
      if (!xin) return tl::unexpected(xin.error());
      auto bad = DeviceBuffer::alloc(sizeof(unsigned long long));
      if (!bad) return tl::unexpected(bad.error());
      for (const Case& c : kCases) {
        const Format f = c.format;
        const int64_t vbytes = values_bytes(f, s.n, s.k), sbytes = scales_bytes(f, s.n, s.k);
        std::vector<DeviceBuffer> vout, sout;
        for (int i = 0; i < copies; ++i) {
          auto v = DeviceBuffer::alloc(static_cast<size_t>(vbytes));
          auto sc = DeviceBuffer::alloc(static_cast<size_t>(sbytes));
          if (!v || !sc) return fail("bench quantize: device allocation failed for {}", s.name);
          vout.push_back(std::move(*v)), sout.push_back(std::move(*sc));
        }
        // note: the raw launchers (the default rules of bf16 input have their own kernels; the rest go
        // through launch_quantize_src): cuda::quantize synchronises to read its NaN check back.
        const bool direct = src == QuantSrc::kBF16 && (f != Format::kMXFP8 || c.rule == QuantRule::kCeil);
        auto us = time_graph(stream, kLaunchesPerGraph, kReps, [&](int i) -> Status {
          const size_t k = static_cast<size_t>(i % copies);
          const void* xi = (*xin)[k].as();
          auto* flag = bad->as<unsigned long long>();
          uint8_t* v = vout[k].as<uint8_t>();
          void* sc = sout[k].as();
          if (!direct)
            MXQ_CUDA_CHECK(
                cuda::launch_quantize_src(quant_format(f), c.rule, src, xi, s.n, s.k, v, sc, flag, stream));
          else if (f == Format::kMXFP8)
            MXQ_CUDA_CHECK(cuda::launch_quantize_mxfp8_ceil(static_cast<const uint16_t*>(xi), s.n, s.k, v,
                                                            static_cast<uint8_t*>(sc), flag, stream));
          else if (f == Format::kMXFP4)
            MXQ_CUDA_CHECK(cuda::launch_quantize_mxfp4_ct(static_cast<const uint16_t*>(xi), s.n, s.k, v,
                                                          static_cast<uint8_t*>(sc), flag, stream));
          else
            MXQ_CUDA_CHECK(cuda::launch_quantize_fp8_b128(static_cast<const uint16_t*>(xi), s.n, s.k, v,
                                                          static_cast<float*>(sc), flag, stream));
          return {};
        });
        if (!us) return tl::unexpected(us.error());
        const int64_t total = in_bytes + vbytes + sbytes;
        auto same_us = time_copy16(stream, total / 2);
        if (!same_us) return tl::unexpected(same_us.error());
        const double gbs = static_cast<double>(total) / (*us * 1e-6) / 1e9;
        fmt::print("{:<24} {:>4} {:>8} {:>5} {:>6} {:>6} {:>8.2f} {:>8.0f} {:>6.1f}% {:>6.1f}%\n", s.name,
                   src == QuantSrc::kF32 ? "f32" : "bf16", traits(f).name, c.rule_name, s.n, s.k, *us, gbs,
                   100.0 * gbs / copy_gbs, 100.0 * *same_us / *us);
      }
    }
  }
  return {};
}

Status run_bench_quantize_cuda(int64_t rows, int64_t cols) {
  cudaStream_t stream;
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto copy_gbs = copy_bandwidth(stream);
  Status st;
  if (!copy_gbs) {
    st = tl::unexpected(copy_gbs.error());
  } else {
    std::vector<BenchShape> shapes(std::begin(kQwen3Shapes), std::end(kQwen3Shapes));
    if (rows > 0) shapes.insert(shapes.begin(), BenchShape{"--rows x --cols", rows, cols});
    st = gpu_quantize_table(stream, *copy_gbs, shapes, true);
    if (st) st = gpu_quantize_shapes_table(stream, *copy_gbs, shapes);
  }
  cudaStreamDestroy(stream);
  return st;
}

}  // namespace mxq::cli
#endif
