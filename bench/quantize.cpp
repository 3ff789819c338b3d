// mxq-bench quantize: CPU block-quantizer throughput per format / scale rule / input dtype, on 1 thread and
// on --threads (wall time; 1 thread also in CPU time), against a memcpy of the same input bytes as the
// ceiling (the quantizer reads the input once and writes ~1/2..1/4 of it, so a memcpy's read rate bounds it).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "cli/commands.h"
#include "format/codec.h"
#include "format/quantize.h"

#if defined(MXQ_HAVE_CUDA)
#include "bench/bench_cuda.h"
#endif

namespace mxq::cli {
namespace {

struct Options {
  std::string device = "cpu";
  int64_t rows = 4096;
  int64_t cols = 4096;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int reps = 3;
  bool shape_given = false;  // --rows or --cols on the command line (CUDA: one more row in the table)
};

struct Case {
  Format fmt;
  ScaleRule rule;
};
constexpr Case kCases[] = {{Format::kMXFP8, ScaleRule::kCeil},  {Format::kMXFP8, ScaleRule::kOcp},
                           {Format::kMXFP8, ScaleRule::kFloor}, {Format::kMXFP8, ScaleRule::kCt},
                           {Format::kMXFP4, ScaleRule::kCt},    {Format::kFP8_B128, ScaleRule::kCeil}};

// Fresh random non-zero data: magnitudes 2^-12..2^4 with random signs and mantissas (xorshift, seeded).
std::vector<uint8_t> random_input(Format src, int64_t n, uint64_t seed) {
  std::vector<uint8_t> out(static_cast<size_t>(n) * (src == Format::kF32 ? 4 : 2));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    const float mag = std::ldexp(1.0f + static_cast<float>(s & 0xFFFFFF) / 16777216.0f,
                                 static_cast<int>((s >> 24) % 16) - 12);
    const float v = (s >> 63) ? -mag : mag;
    if (src == Format::kF32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

struct Timing {
  double wall_ms = 1e300;
  double cpu_ms = 1e300;  // this thread's CPU time: meaningful for runs on the calling thread only
};

// note: best of `reps`; on a shared machine the wall time includes time the thread was preempted, the
// calling thread's CPU time does not.
template <class F>
Timing best_of(int reps, F&& run) {
  Timing best;
  for (int r = 0; r < reps; ++r) {
    const double c0 = thread_cpu_ms();
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best.wall_ms =
        std::min(best.wall_ms,
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    best.cpu_ms = std::min(best.cpu_ms, thread_cpu_ms() - c0);
  }
  return best;
}

// Splits rows across `threads` in 128-row multiples (FP8-B128 stripes; harmless for MX) and quantizes.
Status quantize_threaded(const Case& c, Format src, const std::vector<uint8_t>& x, const Options& o,
                         int threads, std::vector<uint8_t>& values, std::vector<uint8_t>& scales) {
  const int64_t elem = src == Format::kF32 ? 4 : 2;
  if (threads == 1)  // on the calling thread, so its CPU time is the quantizer's
    return quantize(c.fmt, c.rule, src, x.data(), o.rows, o.cols, values.data(), scales.data(), "bench");
  const int64_t chunk = cdiv(cdiv(o.rows, threads), 128) * 128;
  std::vector<Status> status(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const int64_t r0 = t * chunk, r1 = std::min(o.rows, r0 + chunk);
    if (r0 >= r1) break;
    pool.emplace_back([&, t, r0, r1] {
      // note: r0 is a multiple of 128, so scales_bytes(fmt, r0, cols) is where row r0's scales start
      status[t] = quantize(c.fmt, c.rule, src, x.data() + r0 * o.cols * elem, r1 - r0, o.cols,
                           values.data() + values_bytes(c.fmt, r0, o.cols),
                           scales.data() + scales_bytes(c.fmt, r0, o.cols), "bench");
    });
  }
  for (auto& th : pool) th.join();
  for (const Status& s : status)
    if (!s) return s;
  return {};
}

int run_bench(const Options& o) {
  if (o.device == "cuda") {
#if defined(MXQ_HAVE_CUDA)
    if (o.shape_given && (o.rows <= 0 || o.cols <= 0 || o.cols % 32 != 0)) {
      fmt::print(stderr, "mxq-bench quantize: need rows > 0, cols > 0 with cols % 32 == 0 (got {} x {})\n",
                 o.rows, o.cols);
      return kExitBadInput;
    }
    if (Status st = run_bench_quantize_cuda(o.shape_given ? o.rows : 0, o.cols); !st) {
      fmt::print(stderr, "mxq-bench quantize: {}\n", st.error().message);
      return 1;
    }
    return 0;
#else
    fmt::print(stderr, "mxq-bench quantize: --device cuda: this mxq was built without CUDA\n");
    return 1;
#endif
  }
  if (o.device != "cpu") {
    fmt::print(stderr, "mxq-bench quantize: device '{}' is not supported (expected cpu or cuda)\n", o.device);
    return kExitBadInput;
  }
  if (o.rows <= 0 || o.cols <= 0 || o.cols % 32 != 0 || o.threads <= 0 || o.reps <= 0) {
    fmt::print(stderr,
               "mxq-bench quantize: need rows > 0, cols > 0 with cols % 32 == 0, threads > 0 (got {} x {}, "
               "{} threads)\n",
               o.rows, o.cols, o.threads);
    return kExitBadInput;
  }
  fmt::print("mxq-bench quantize: [{} x {}], {} threads, best of {}; GB/s = input bytes / time\n", o.rows,
             o.cols, o.threads, o.reps);
  fmt::print("{:<9} {:<6} {:<5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}\n", "format", "rule", "src",
             "1t ms", "1t GB/s", "cpu ms", "cpu GB/s", "%memcpy", "Tt ms", "Tt GB/s");
  for (Format src : {Format::kBF16, Format::kF32}) {
    const std::vector<uint8_t> x = random_input(src, o.rows * o.cols, src == Format::kBF16 ? 1 : 2);
    const double gb = static_cast<double>(x.size()) / 1e9;
    std::vector<uint8_t> copy(x.size());
    const Timing mc = best_of(o.reps, [&] { std::memcpy(copy.data(), x.data(), x.size()); });
    fmt::print("{:<9} {:<6} {:<5} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8}\n", "memcpy", "-",
               traits(src).name, mc.wall_ms, gb / (mc.wall_ms / 1e3), mc.cpu_ms, gb / (mc.cpu_ms / 1e3),
               "100%");
    for (const Case& c : kCases) {
      std::vector<uint8_t> values(values_bytes(c.fmt, o.rows, o.cols)),
          scales(scales_bytes(c.fmt, o.rows, o.cols));
      Status st;
      const Timing one = best_of(o.reps, [&] { st = quantize_threaded(c, src, x, o, 1, values, scales); });
      const Timing all =
          best_of(o.reps, [&] { st = quantize_threaded(c, src, x, o, o.threads, values, scales); });
      if (!st) {
        fmt::print(stderr, "mxq-bench quantize: {}\n", st.error().message);
        return 1;
      }
      const bool mx = c.fmt != Format::kFP8_B128;
      // note: %memcpy compares CPU times, the fairest ceiling on a shared machine
      fmt::print("{:<9} {:<6} {:<5} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>7.0f}% {:>8.2f} {:>8.2f}\n",
                 traits(c.fmt).name, mx ? scale_rule_name(c.rule) : "-", traits(src).name, one.wall_ms,
                 gb / (one.wall_ms / 1e3), one.cpu_ms, gb / (one.cpu_ms / 1e3),
                 100.0 * mc.cpu_ms / one.cpu_ms, all.wall_ms, gb / (all.wall_ms / 1e3));
    }
  }
  return 0;
}

}  // namespace

void add_bench_quantize(CLI::App& bench, int& exit_code) {
  auto opts = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand(
      "quantize", "block quantizer throughput (MXFP8 rules, MXFP4, FP8-B128) on the CPU or the GPU");
  cmd->add_option("--device", opts->device,
                  "cpu (this machine's quantizers) or cuda (the GPU quantizers over Qwen3 shapes)");
  auto* rows = cmd->add_option("--rows", opts->rows, "Rows N of the [N, K] input")->capture_default_str();
  auto* cols = cmd->add_option("--cols", opts->cols, "Columns K (a multiple of 32)")->capture_default_str();
  cmd->add_option("--threads", opts->threads, "Threads for the multi-threaded run")->capture_default_str();
  cmd->add_option("--reps", opts->reps, "Repetitions; the best time is reported")->capture_default_str();
  cmd->callback([opts, rows, cols, &exit_code] {
    opts->shape_given = rows->count() > 0 || cols->count() > 0;
    exit_code = run_bench(*opts);
  });
}

}  // namespace mxq::cli
