// The launch-shape table of `mxq-bench quantize --device cuda`: each bf16 quantize kernel (MXFP8 ceil, MXFP4
// ct, FP8-B128) at every cuda::QuantLaunch it accepts, with programmatic dependent launch off and on, beside
// the plain copy kernel (bench/cuda/copy16.cu) moving the same total bytes under the same PDL setting. GB/s
// = bf16 read + values + scales written; %copy against the 2 GiB device copy, %same against that copy kernel.
// CUDA-graph event medians (20 launches a graph, each reading another L2-rotated copy of the input).
#if defined(MXQ_HAVE_CUDA)
#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "bench/bench_cuda.h"
#include "cuda/common/check.h"
#include "cuda/common/pdl.h"
#include "cuda/quantize/quantize_launch.h"
#include "format/formats.h"

namespace mxq::cli {
namespace {

using cuda::DeviceBuffer;
using cuda::QuantLaunch;

constexpr int kLaunchesPerGraph = 20, kReps = 15;

struct Variant {
  Format format;
  QuantLaunch shape;
  const char* name;
};
constexpr Variant kVariants[] = {
    {Format::kMXFP8, {2, 0}, "unroll 2"},    {Format::kMXFP8, {4, 0}, "unroll 4"},
    {Format::kMXFP8, {8, 0}, "unroll 8"},    {Format::kMXFP4, {2, 0}, "unroll 2"},
    {Format::kMXFP4, {4, 0}, "unroll 4"},    {Format::kMXFP4, {8, 0}, "unroll 8"},
    {Format::kFP8_B128, {4, 0}, "tile/CTA"}, {Format::kFP8_B128, {4, 1}, "1 CTA/SM"},
    {Format::kFP8_B128, {4, 2}, "2 CTA/SM"}, {Format::kFP8_B128, {4, 3}, "3 CTA/SM"},
};

cudaError_t launch(const Variant& v, const void* x, int64_t n, int64_t k, void* values, void* scales,
                   unsigned long long* bad, cudaStream_t stream) {
  const auto* xb = static_cast<const uint16_t*>(x);
  auto* vb = static_cast<uint8_t*>(values);
  if (v.format == Format::kMXFP8)
    return cuda::launch_quantize_mxfp8_ceil(xb, n, k, vb, static_cast<uint8_t*>(scales), bad, stream,
                                            v.shape);
  if (v.format == Format::kMXFP4)
    return cuda::launch_quantize_mxfp4_ct(xb, n, k, vb, static_cast<uint8_t*>(scales), bad, stream, v.shape);
  return cuda::launch_quantize_fp8_b128(xb, n, k, vb, static_cast<float*>(scales), bad, stream, v.shape);
}

}  // namespace

Status gpu_quantize_shapes_table(cudaStream_t stream, double copy_gbs, std::span<const BenchShape> shapes) {
  std::mt19937_64 rng(20261130);
  fmt::print(
      "\nbf16 quantize launch shapes, PDL off | on (GB/s = bf16 read + values + scales written; %copy of "
      "{:.0f} GB/s; %same: the copy kernel of the same bytes)\n",
      copy_gbs);
  fmt::print("{:<24} {:>8} {:>9} {:>8} {:>7} {:>6} | {:>8} {:>7} {:>6}\n", "shape", "format", "launch", "us",
             "%copy", "%same", "us", "%copy", "%same");
  const bool pdl_default = cuda::pdl_active();
  for (const BenchShape& s : shapes) {
    const int64_t in_bytes = s.n * s.k * 2;
    const int copies = copies_for(in_bytes);
    auto xin = replicate(random_bf16_bytes(rng, static_cast<size_t>(s.n * s.k)), copies);
    if (!xin) return tl::unexpected(xin.error());
    auto bad = DeviceBuffer::alloc(sizeof(unsigned long long));
    if (!bad) return tl::unexpected(bad.error());
    // note: one set of outputs per copy, sized for the largest format (MXFP8 values, FP8-B128 f32 scales).
    const int64_t vmax = values_bytes(Format::kMXFP8, s.n, s.k);
    const int64_t smax =
        std::max(scales_bytes(Format::kMXFP8, s.n, s.k), scales_bytes(Format::kFP8_B128, s.n, s.k));
    std::vector<DeviceBuffer> vout, sout;
    for (int i = 0; i < copies; ++i) {
      auto v = DeviceBuffer::alloc(static_cast<size_t>(vmax));
      auto sc = DeviceBuffer::alloc(static_cast<size_t>(smax));
      if (!v || !sc) return fail("bench quantize: device allocation failed for {}", s.name);
      vout.push_back(std::move(*v)), sout.push_back(std::move(*sc));
    }
    Format last = Format::kBF16;
    double same_us[2] = {0, 0};
    for (const Variant& v : kVariants) {
      const int64_t total = in_bytes + values_bytes(v.format, s.n, s.k) + scales_bytes(v.format, s.n, s.k);
      double us[2] = {0, 0};
      for (int p = 0; p < 2; ++p) {
        cuda::set_pdl(p == 1);
        if (v.format != last) {
          auto c = time_copy16(stream, total / 2);
          if (!c) return tl::unexpected(c.error());
          same_us[p] = *c;
        }
        auto t = time_graph(stream, kLaunchesPerGraph, kReps, [&](int i) -> Status {
          const size_t k = static_cast<size_t>(i % copies);
          MXQ_CUDA_CHECK(launch(v, (*xin)[k].as(), s.n, s.k, vout[k].as(), sout[k].as(),
                                bad->as<unsigned long long>(), stream));
          return {};
        });
        if (!t) return tl::unexpected(t.error());
        us[p] = *t;
      }
      const auto pct = [&](double t) {
        return 100.0 * static_cast<double>(total) / (t * 1e-6) / 1e9 / copy_gbs;
      };
      if (v.format != last) {
        fmt::print("{:<24} {:>8} {:>9} {:>8.2f} {:>6.1f}% {:>5.1f}% | {:>8.2f} {:>6.1f}% {:>5.1f}%\n", s.name,
                   "copy16", traits(v.format).name, same_us[0], pct(same_us[0]), 100.0, same_us[1],
                   pct(same_us[1]), 100.0);
        last = v.format;
      }
      fmt::print("{:<24} {:>8} {:>9} {:>8.2f} {:>6.1f}% {:>5.1f}% | {:>8.2f} {:>6.1f}% {:>5.1f}%\n", s.name,
                 traits(v.format).name, v.name, us[0], pct(us[0]), 100.0 * same_us[0] / us[0], us[1],
                 pct(us[1]), 100.0 * same_us[1] / us[1]);
    }
  }
  cuda::set_pdl(pdl_default);
  return {};
}

}  // namespace mxq::cli
#endif
