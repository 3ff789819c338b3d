// mxq-bench linear: the CUDA linear dispatch table (cuda/linear/linear.h: MXFP8 / MXFP4 / FP8-B128 by M) and
// GPU quantize on Qwen3 shapes, against the copy bandwidth, cuBLAS bf16 and cuBLASLt FP8-B128 measured in the
// same run. Registered under `mxq-bench` by add_bench_linear.

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cli/commands.h"
#include "format/formats.h"

#if defined(MXQ_HAVE_CUDA)
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "bench/bench_cuda.h"
#include "bench/cuda/gemm_fp8_b128_sm90.h"
#include "bench/cuda/read_ceiling.h"
#include "bench/gemv_trace.h"
#include "cuda/common/check.h"
#include "cuda/common/pdl.h"
#include "cuda/linear/gemm_mx.h"
#include "cuda/linear/gemv_fp8_b128.h"
#include "cuda/linear/gemv_mx.h"
#include "cuda/linear/gemv_mx_launch.h"
#include "cuda/linear/linear.h"
#include "cuda/quantize/quantize_launch.h"
#endif

namespace mxq::cli {

#if defined(MXQ_HAVE_CUDA)
namespace {

using cuda::DeviceBuffer;

using Shape = BenchShape;
constexpr auto& kShapes = kQwen3Shapes;
constexpr int kLaunchesPerGraph = 20, kReps = 15;

// Native planes of a random weight: codes (no E4M3 NaN) and scales of a plausible size, laid out by
// linear_prepare as the loader would.
Result<HostPlanes> random_native(std::mt19937_64& rng, Format f, int64_t n, int64_t k, cuda::Arch arch) {
  HostPlanes canonical;
  if (f == Format::kBF16) {
    canonical.values = random_bf16_bytes(rng, static_cast<size_t>(n * k));
  } else {
    canonical.values = random_codes(rng, static_cast<size_t>(values_bytes(f, n, k)), f != Format::kMXFP4);
    canonical.scales.resize(static_cast<size_t>(scales_bytes(f, n, k)));
    if (f == Format::kFP8_B128) {
      for (size_t i = 0; i < canonical.scales.size(); i += 4) {
        const float v = std::ldexp(1.0f + static_cast<float>(rng() % 256) / 256.0f, -10);
        std::memcpy(canonical.scales.data() + i, &v, 4);
      }
    } else {
      for (auto& b : canonical.scales) b = static_cast<uint8_t>(115 + rng() % 10);
    }
  }
  const std::vector<int64_t> shape = {n, k};
  auto g = tensor_geometry("bench weight", f, shape);
  if (!g) return tl::unexpected(g.error());
  return cuda::linear_prepare(f, arch, *g, canonical);
}

struct Run {
  std::vector<Format> formats;
  std::vector<int64_t> ms;
  bool quantize = true;
  bool gemv_study = false;
  bool lt_sweep = false;
  bool gemv_trace = false;
  bool w8a8 = false;  // each MX row again in the W8A8 mode (activation quantize-dequantize + the same kernel)
  std::string shape;  // only shapes whose name contains it (empty: all)
};

// Rotated device copies of one layer's native weights, and the LinearWeights of copy i.
struct RotatedWeights {
  Format format;
  int64_t n, k, bytes;
  std::vector<DeviceBuffer> values, scales;
  cuda::LinearWeights at(int i) const {
    const size_t c = static_cast<size_t>(i) % values.size();
    return {format, values[c].as<uint8_t>(), scales.empty() ? nullptr : scales[c].as<uint8_t>(), n, k};
  }
};

Result<RotatedWeights> rotated(std::mt19937_64& rng, Format f, int64_t n, int64_t k, cuda::Arch arch) {
  auto planes = random_native(rng, f, n, k, arch);
  if (!planes) return tl::unexpected(planes.error());
  const int64_t bytes = static_cast<int64_t>(planes->values.size() + planes->scales.size());
  const int copies = copies_for(bytes);
  RotatedWeights w{f, n, k, bytes, {}, {}};
  auto v = replicate(planes->values, copies);
  if (!v) return tl::unexpected(v.error());
  w.values = std::move(*v);
  if (!planes->scales.empty()) {
    auto sc = replicate(planes->scales, copies);
    if (!sc) return tl::unexpected(sc.error());
    w.scales = std::move(*sc);
  }
  return w;
}

// The read-only ceiling at this byte count (bench/cuda/read_ceiling.h): median µs of one launch reading
// `bytes` once, over rotated copies as the kernels' weights are, the faster of the kernel's two variants.
Result<double> read_ceiling_us(std::mt19937_64& rng, int64_t bytes, cudaStream_t stream) {
  const int64_t padded = (bytes + 15) / 16 * 16;
  auto bufs = replicate(random_codes(rng, static_cast<size_t>(padded), false), copies_for(padded));
  auto sink = DeviceBuffer::alloc(sizeof(uint32_t));
  if (!bufs || !sink) return fail("read ceiling: device allocation failed ({} bytes)", padded);
  double best = 0;
  for (int variant = 0; variant < 2; ++variant) {
    auto us = time_graph(stream, kLaunchesPerGraph, kReps, [&](int i) -> Status {
      const auto& b = (*bufs)[static_cast<size_t>(i) % bufs->size()];
      MXQ_CUDA_CHECK(
          cuda::launch_read_ceiling(b.as<uint8_t>(), padded, sink->as<uint32_t>(), variant, stream));
      return {};
    });
    if (!us) return tl::unexpected(us.error());
    if (variant == 0 || *us < best) best = *us;
  }
  return best;
}

// --gemv-study: every GEMV kernel variant (gemv_mx_launch.h; the FP8-B128 GEMV takes the same switch) at
// M <= 32 called directly, and gemm_mx at the same M > 16 (MX formats), against the copy and read-only
// ceilings; one row each.
Status gemv_study(const RotatedWeights& w, const Shape& s, const std::vector<int64_t>& ms, const uint16_t* xp,
                  uint16_t* yp, double copy_gbs, double read_us, std::span<float> splitk, bool trace,
                  cudaStream_t stream) {
  const bool fp8 = w.format == Format::kMXFP8;
  auto row = [&](int64_t m, const char* kernel, double us) {
    const double gbs = static_cast<double>(w.bytes) / (us * 1e-6) / 1e9;
    fmt::print("{:<22} {:>8} {:>5} {:>5} {:>4} {:<17} {:>8.2f} {:>6.0f} {:>5.1f}% {:>5.1f}%\n", s.name,
               traits(w.format).name, s.n, s.k, m, kernel, us, gbs, 100.0 * gbs / copy_gbs,
               100.0 * read_us / us);
  };
  const bool b128 = w.format == Format::kFP8_B128;
  // --gemv-trace: the M = 1 ring kernel's timeline in the graph (bench_gemv_trace.h), with PDL and without.
  if (trace && !b128 && std::find(ms.begin(), ms.end(), 1) != ms.end()) {
    for (bool pdl : {true, false}) {
      cuda::set_gemv_kernel(cuda::GemvKernel::kRingDeep);
      cuda::set_pdl(pdl);
      Status st = trace_gemv_row(
          fmt::format("{} {} ring_deep{}", s.name, traits(w.format).name, pdl ? "" : " no-pdl"),
          kLaunchesPerGraph, kReps, stream, [&](int i) {
            const cuda::LinearWeights lw = w.at(i);
            const cuda::MxGemvWeights gw{w.format, lw.values, lw.scales, w.n, w.k};
            return fp8 ? cuda::gemv_mxfp8(xp, 1, gw, yp, stream) : cuda::gemv_mxfp4(xp, 1, gw, yp, stream);
          });
      cuda::set_gemv_kernel(cuda::GemvKernel::kAuto);
      cuda::set_pdl(true);
      if (!st) return st;
    }
  }
  for (int64_t m : ms) {
    if (m > (b128 ? cuda::kGemvFp8B128MaxM : cuda::kGemvMaxM)) continue;
    for (cuda::GemvKernel v : cuda::kGemvKernels) {
      if (b128 && cuda::gemv_ring(v)) continue;   // note: the FP8-B128 GEMV has no ring form
      if (m > 8 && cuda::gemv_ring(v)) continue;  // note: m > 8 runs kRegisterStep's kernel
      cuda::set_gemv_kernel(v);
      auto us = time_graph(stream, kLaunchesPerGraph, kReps, [&](int i) {
        const cuda::LinearWeights lw = w.at(i);
        if (b128)
          return cuda::gemv_fp8_b128(xp, m, {lw.values, reinterpret_cast<const float*>(lw.scales), w.n, w.k},
                                     yp, stream);
        const cuda::MxGemvWeights gw{w.format, lw.values, lw.scales, w.n, w.k};
        return fp8 ? cuda::gemv_mxfp8(xp, m, gw, yp, stream) : cuda::gemv_mxfp4(xp, m, gw, yp, stream);
      });
      cuda::set_gemv_kernel(cuda::GemvKernel::kAuto);
      if (!us) return tl::unexpected(us.error());
      row(m, cuda::gemv_kernel_name(v), *us);
    }
    if (m <= 16 || b128) continue;  // note: FP8-B128's peer at M > 16, cuBLASLt, is the main rows' Lt fp8
    auto us = time_graph(stream, kLaunchesPerGraph, kReps, [&](int i) {
      const cuda::LinearWeights lw = w.at(i);
      const cuda::MxGemvWeights gw{w.format, lw.values, lw.scales, w.n, w.k};
      return fp8 ? cuda::gemm_mxfp8(xp, m, gw, yp, stream, splitk)
                 : cuda::gemm_mxfp4(xp, m, gw, yp, stream, splitk);
    });
    if (!us) return tl::unexpected(us.error());
    row(m, fp8 ? "gemm_mxfp8" : "gemm_mxfp4", *us);
  }
  return {};
}

// FP8-B128 on sm_90a, beside the table's row (cuBLASLt): our GEMM (gemm_fp8_b128_sm90.h, not in the table)
// with its automatic kernel shape and each shape forced (incl. the quantize), and the GEMMs alone on x
// quantized once (ours, auto shape; cuBLASLt's matmul, M % 4 == 0 only).
Status fp8_gemm_rows(cuda::LinearContext& ctx, const RotatedWeights& w, const Shape& s,
                     const std::vector<int64_t>& ms, const uint16_t* xp, uint16_t* yp,
                     const std::vector<double>& bf16_us, const std::vector<double>& lt_us,
                     cudaStream_t stream) {
  if (!cuda::fp8_b128_sm90_takes(s.n, s.k)) return {};
  for (size_t mi = 0; mi < ms.size(); ++mi) {
    const int64_t m = ms[mi];
    auto row = [&](const char* kernel, Result<double> us) -> Status {
      if (!us) return tl::unexpected(us.error());
      fmt::print(
          "{:<22} {:>8} {:>5} {:>5} {:>4} {:<17} {:>8.2f} {:>7.1f} {:>6} {:>6} {:>5.0f}% {:>8.2f} {:>8.2f}\n",
          s.name, "fp8-b128", s.n, s.k, m, kernel, *us, 2.0 * m * s.n * s.k / (*us * 1e-6) / 1e12, "", "",
          100.0 * bf16_us[mi] / *us, bf16_us[mi], lt_us[mi]);
      return {};
    };
    auto weights = [&](int i) {
      const cuda::LinearWeights lw = w.at(i);
      return cuda::Fp8B128Weights{lw.values, reinterpret_cast<const float*>(lw.scales), w.n, w.k};
    };
    for (auto [tile, name] : {std::pair{cuda::Fp8GemmTile::kAuto, "fp8 sm90 auto"},
                              std::pair{cuda::Fp8GemmTile::kN128, "fp8 sm90 n128"},
                              std::pair{cuda::Fp8GemmTile::kN64, "fp8 sm90 n64"},
                              std::pair{cuda::Fp8GemmTile::kN128Pair, "fp8 sm90 pair"}})
      if (Status st = row(name, time_graph(stream, kLaunchesPerGraph, kReps,
                                           [&](int i) {
                                             return cuda::linear_fp8_b128_sm90(ctx.fp8(), xp, m, weights(i),
                                                                               yp, stream, tile);
                                           }));
          !st)
        return st;
    auto q = ctx.fp8().quantize(xp, m, s.n, s.k, stream);
    if (!q) return tl::unexpected(q.error());
    if (Status st = row("gemm only (ours)", time_graph(stream, kLaunchesPerGraph, kReps,
                                                       [&](int i) {
                                                         return cuda::gemm_fp8_b128_sm90(
                                                             q->values, q->scales, q->scale_ld, m, weights(i),
                                                             yp, stream);
                                                       }));
        !st)
      return st;
    if (m % 4 != 0) continue;
    if (Status st = row("gemm only (Lt)", time_graph(stream, kLaunchesPerGraph, kReps,
                                                     [&](int i) {
                                                       return ctx.fp8().matmul(q->values, q->scales, m,
                                                                               weights(i), yp, stream);
                                                     }));
        !st)
      return st;
  }
  return {};
}

// --lt-sweep: cuBLASLt's matmul alone (x quantized once) for each of the heuristic's algorithms, in both
// operand roles, at each M % 4 == 0; one row each, then the default choice again.
Status lt_sweep_rows(cuda::LinearContext& ctx, const RotatedWeights& w, const Shape& s,
                     const std::vector<int64_t>& ms, const uint16_t* xp, uint16_t* yp,
                     const std::vector<double>& bf16_us, cudaStream_t stream) {
  using Gemm = cuda::Fp8B128Gemm;
  Gemm& g = ctx.fp8();
  for (size_t mi = 0; mi < ms.size(); ++mi) {
    const int64_t m = ms[mi];
    if (m % 4 != 0) continue;
    auto q = g.quantize(xp, m, s.n, s.k, stream);
    if (!q) return tl::unexpected(q.error());
    for (auto roles : {cuda::detail::LtRoles::kActARowD, cuda::detail::LtRoles::kWeightA}) {
      for (int idx = 0; idx < Gemm::kMaxHeuristics; ++idx) {
        g.set_choice({roles, idx});
        auto us = time_graph(stream, kLaunchesPerGraph, kReps, [&](int i) {
          const cuda::LinearWeights lw = w.at(i);
          return g.matmul(q->values, q->scales, m,
                          {lw.values, reinterpret_cast<const float*>(lw.scales), w.n, w.k}, yp, stream);
        });
        if (!us) break;  // note: past the heuristic's count (or an algorithm that refuses the shape)
        auto algo = g.plan_algo(m, s.n, s.k);
        fmt::print("{:<22} {:>8} {:>5} {:>5} {:>4} lt sweep {} #{:<2} {:>8.2f} {:>7.1f} {:>5.0f}%  {}\n",
                   s.name, "fp8-b128", s.n, s.k, m, roles == cuda::detail::LtRoles::kWeightA ? "W=A" : "x=A",
                   idx, *us, 2.0 * m * s.n * s.k / (*us * 1e-6) / 1e12, 100.0 * bf16_us[mi] / *us,
                   algo ? *algo : algo.error().message);
      }
    }
  }
  g.set_choice({});
  return {};
}

Status run_bench(const Run& run) {
  cudaStream_t stream;
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  int dev = 0;
  MXQ_CUDA_CHECK(cudaGetDevice(&dev));
  MXQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  auto arch = cuda::device_arch(dev);
  if (!arch) return tl::unexpected(arch.error());
  auto copy_gbs = copy_bandwidth(stream);
  if (!copy_gbs) return tl::unexpected(copy_gbs.error());
  auto ctx = cuda::LinearContext::create(*arch);
  if (!ctx) return tl::unexpected(ctx.error());
  const int64_t max_m = *std::max_element(run.ms.begin(), run.ms.end());
  int64_t max_k = 0, max_n = 0;
  for (const Shape& s : kShapes) max_k = std::max(max_k, s.k), max_n = std::max(max_n, s.n);
  // note: scratch sized up front: nothing may allocate inside a captured graph.
  if (Status st = (*ctx)->reserve(max_m, max_n, max_k, run.w8a8); !st) return st;
  fmt::print("device: {} ({} SMs, L2 {} MB, {}); copy bandwidth {:.0f} GB/s (read + written, 2 GiB D2D)\n",
             prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, cuda::arch_name(*arch), *copy_gbs);
  fmt::print(
      "GB/s = weight bytes (values + scales) / time; %bf16 = cuBLAS bf16 time / time; Lt fp8 = cuBLASLt\n"
      "FP8-B128 incl. the 1x128 activation quantize; weights rotated past L2, CUDA-graph event medians;\n"
      "read us = one launch of a read-only kernel over the same weight bytes, %read = read us / us\n");
  fmt::print("{:<22} {:>8} {:>5} {:>5} {:>4} {:<17} {:>8} {:>7} {:>6} {:>6} {:>6} {:>8} {:>8} {:>7} {:>6}\n",
             "shape", "format", "N", "K", "M", "kernel", "us", "TFLOP/s", "GB/s", "%copy", "%bf16", "bf16 us",
             "Lt fp8", "read us", "%read");
  if (run.gemv_study)
    fmt::print("study rows (after each format's rows): shape format N K M variant us GB/s %copy %read\n");
  if (run.gemv_trace) print_gemv_trace_header();
  std::mt19937_64 rng(20261129);
  for (const Shape& s : kShapes) {
    if (std::string_view(s.name).find(run.shape) == std::string_view::npos) continue;
    auto x = replicate(random_bf16_bytes(rng, static_cast<size_t>(max_m * s.k)), 1);
    auto y = DeviceBuffer::alloc(static_cast<size_t>(max_m * s.n * 2));
    if (!x || !y) return fail("bench linear: device allocation failed for {}", s.name);
    const uint16_t* xp = (*x)[0].as<uint16_t>();
    auto* yp = y->as<uint16_t>();
    auto time_linear = [&](const RotatedWeights& w, int64_t m, Format act = Format::kBF16) {
      return time_graph(stream, kLaunchesPerGraph, kReps, [&](int i) {
        cuda::LinearWeights lw = w.at(i);
        lw.act = act;
        return cuda::linear(**ctx, lw, xp, m, yp, stream);
      });
    };
    auto wbf = rotated(rng, Format::kBF16, s.n, s.k, *arch);
    if (!wbf) return tl::unexpected(wbf.error());
    std::vector<double> bf16_us, lt_us;
    for (int64_t m : run.ms) {
      auto us = time_linear(*wbf, m);
      if (!us) return tl::unexpected(us.error());
      bf16_us.push_back(*us);
    }
    wbf = RotatedWeights{};  // note: free the bf16 copies before the next format's
    auto wfp8 = rotated(rng, Format::kFP8_B128, s.n, s.k, *arch);
    if (!wfp8) return tl::unexpected(wfp8.error());
    for (int64_t m : run.ms) {
      auto us = time_graph(stream, kLaunchesPerGraph, kReps, [&](int i) {
        const cuda::LinearWeights w = wfp8->at(i);
        return (*ctx)->fp8().run(xp, m, {w.values, reinterpret_cast<const float*>(w.scales), w.n, w.k}, yp,
                                 stream);
      });
      // note: a failing peer is reported and shown as nan; the rows of the other kernels still run.
      if (!us) fmt::print("cuBLASLt fp8-b128 {} M={}: {}\n", s.name, m, us.error().message);
      lt_us.push_back(us ? *us : NAN);
    }
    for (Format f : run.formats) {
      Result<RotatedWeights> w = f == Format::kFP8_B128 ? std::move(wfp8) : rotated(rng, f, s.n, s.k, *arch);
      if (!w) return tl::unexpected(w.error());
      auto read_us = read_ceiling_us(rng, w->bytes, stream);
      if (!read_us) return tl::unexpected(read_us.error());
      std::string refused, refusal;
      for (size_t mi = 0; mi < run.ms.size(); ++mi) {
        const int64_t m = run.ms[mi];
        auto kernel = cuda::linear_kernel_name(f, *arch, m);
        if (!kernel) {  // note: one line per shape and format for the M the table refuses
          refused += fmt::format("{}{}", refused.empty() ? "" : ",", m);
          refusal = kernel.error().message;
          continue;
        }
        // --w8a8: the MX rows again with the activation quantize-dequantize in front ("+a8")
        for (Format act : {Format::kBF16, Format::kMXFP8}) {
          if (act == Format::kMXFP8 && !(run.w8a8 && is_mx(f))) continue;
          const std::string label = std::string(*kernel) + (act == Format::kMXFP8 ? "+a8" : "");
          auto us = time_linear(*w, m, act);
          if (!us) {
            fmt::print("{:<22} {:>8} {:>5} {:>5} {:>4} {:<17} error: {}\n", s.name, traits(f).name, s.n, s.k,
                       m, label, us.error().message);
            continue;
          }
          const double gbs = static_cast<double>(w->bytes) / (*us * 1e-6) / 1e9;
          fmt::print(
              "{:<22} {:>8} {:>5} {:>5} {:>4} {:<17} {:>8.2f} {:>7.1f} {:>6.0f} {:>5.1f}% {:>5.0f}% {:>8.2f} "
              "{:>8.2f} {:>7.2f} {:>5.1f}%\n",
              s.name, traits(f).name, s.n, s.k, m, label, *us, 2.0 * m * s.n * s.k / (*us * 1e-6) / 1e12, gbs,
              100.0 * gbs / *copy_gbs, 100.0 * bf16_us[mi] / *us, bf16_us[mi], lt_us[mi], *read_us,
              100.0 * *read_us / *us);
        }
      }
      if (f == Format::kFP8_B128 && *arch == cuda::Arch::kSm90a)
        if (Status st = fp8_gemm_rows(**ctx, *w, s, run.ms, xp, yp, bf16_us, lt_us, stream); !st) return st;
      if (f == Format::kFP8_B128 && run.lt_sweep)
        if (Status st = lt_sweep_rows(**ctx, *w, s, run.ms, xp, yp, bf16_us, stream); !st) return st;
      if (run.gemv_study)
        if (Status st = gemv_study(*w, s, run.ms, xp, yp, *copy_gbs, *read_us, (*ctx)->splitk(),
                                   run.gemv_trace, stream);
            !st)
          return st;
      if (!refused.empty())
        fmt::print("{:<22} {:>8} {:>5} {:>5} M={} refused: {}\n", s.name, traits(f).name, s.n, s.k, refused,
                   refusal.substr(0, refusal.find(" (arch")));
    }
  }
  if (run.quantize)
    if (Status st = gpu_quantize_table(stream, *copy_gbs, kQwen3Shapes, false); !st) return st;
  cudaStreamDestroy(stream);
  return {};
}

}  // namespace
#endif

void add_bench_linear(CLI::App& bench, int& exit_code) {
  auto* cmd = bench.add_subcommand(
      "linear", "linear kernels and GPU quantize vs copy bandwidth, cuBLAS bf16, cuBLASLt FP8");
  auto formats =
      std::make_shared<std::vector<std::string>>(std::vector<std::string>{"mxfp8", "mxfp4", "fp8-b128"});
  auto ms = std::make_shared<std::vector<int64_t>>(std::vector<int64_t>{1, 8, 32, 128, 512, 4096});
  auto no_quantize = std::make_shared<bool>(false);
  auto study = std::make_shared<bool>(false);
  auto shape = std::make_shared<std::string>();
  auto lt_sweep = std::make_shared<bool>(false);
  auto trace = std::make_shared<bool>(false);
  auto w8a8 = std::make_shared<bool>(false);
  cmd->add_option("--formats", *formats, "weight formats, comma-separated (mxfp8, mxfp4, fp8-b128)")
      ->delimiter(',');
  cmd->add_option("--m", *ms, "activation rows, comma-separated (1..8192)")->delimiter(',');
  cmd->add_flag("--no-quantize", *no_quantize, "skip the quantize-kernel table");
  cmd->add_flag("--gemv-study", *study,
                "after each format's rows, every GEMV kernel variant at M <= 32 and gemm_mx at M 17..32");
  cmd->add_flag("--lt-sweep", *lt_sweep,
                "after FP8-B128's rows, cuBLASLt's matmul alone with each heuristic algorithm, both roles");
  cmd->add_flag("--gemv-trace", *trace,
                "with --gemv-study: the M = 1 ring GEMV's per-block timeline in the graph (PDL overlap)");
  cmd->add_flag(
      "--w8a8", *w8a8,
      "each MXFP8 / MXFP4 row again in the W8A8 mode (+a8: MXFP8 activation quantize-dequantize first)");
  cmd->add_option("--shape", *shape, "only the shapes whose name contains this (e.g. q/o, gate_up)");
  cmd->callback([formats, ms, no_quantize, study, shape, lt_sweep, trace, w8a8, &exit_code] {
#if defined(MXQ_HAVE_CUDA)
    Run run;
    for (const std::string& name : *formats) {
      auto f = parse_format(name);
      if (!f || (*f != Format::kMXFP8 && *f != Format::kMXFP4 && *f != Format::kFP8_B128)) {
        fmt::print(stderr,
                   "mxq-bench linear: --formats {}: not benchmarked (expected mxfp8, mxfp4 or fp8-b128)\n",
                   name);
        exit_code = kExitBadInput;
        return;
      }
      run.formats.push_back(*f);
    }
    for (int64_t m : *ms)
      if (m < 1 || m > 8192) {
        fmt::print(stderr, "mxq-bench linear: --m {}: expected 1..8192\n", m);
        exit_code = kExitBadInput;
        return;
      }
    if (ms->empty()) {
      fmt::print(stderr, "mxq-bench linear: --m is empty\n");
      exit_code = kExitBadInput;
      return;
    }
    run.ms = *ms;
    run.quantize = !*no_quantize;
    run.gemv_study = *study;
    run.lt_sweep = *lt_sweep;
    run.gemv_trace = *trace;
    run.w8a8 = *w8a8;
    run.shape = *shape;
    if (Status st = run_bench(run); !st) {
      fmt::print(stderr, "mxq-bench linear: {}\n", st.error().message);
      exit_code = 1;
    }
#else
    fmt::print(stderr,
               "mxq-bench linear: this mxq was built without CUDA (expected a build where nvcc was found)\n");
    exit_code = kExitBadInput;
#endif
  });
}

}  // namespace mxq::cli
