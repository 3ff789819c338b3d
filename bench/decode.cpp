// mxq-bench decode: prompt processing (pp: one forward over N prompt tokens) and token generation (tg: N
// single-token forwards through the KV cache) of a whole model, in a llama-bench-style table. --depth D
// runs tg over a cache already holding D tokens, as llama-bench's -d ("tg128 @ d256").
// note: speed of light. tg reads every active weight byte once per token, so its ceiling is memory bandwidth:
// the table prints the weight bytes streamed per second beside a memcpy measured in the same run. pp is
// compute-bound and prints GFLOP/s (2 x active params per token).
// --breakdown (CUDA): after each batch's table rows, one decode step at that batch profiled eagerly per op
// class (CUDA events, model/step_profile_cuda.h), with the graph step time beside it (issue #5: where a
// step's time goes).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "bench/bench.h"
#include "cli/commands.h"
#include "engine/default_model.h"
#include "engine/sequence.h"
#include "model/cpu_backend.h"
#include "model/load_model.h"
#include "model/qwen3.h"
#if MXQ_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/common/pdl.h"
#include "engine/cuda_runner.h"
#include "model/qwen3_cuda.h"
#include "model/step_profile_cuda.h"
#endif

namespace mxq::cli {
namespace {

struct DecodeOptions {
  std::string device = "cpu", model, quantization, activation_quant = "auto";
  int64_t pp = 128, tg = 32;
  int64_t depth = 0;  // tg starts after this many cached tokens (llama-bench's -d: "tg128 @ d256")
  int reps = 3, threads = 0;
  std::vector<int32_t> batch = {1, 32};  // CUDA: sequences per step
  double gpu_memory_utilization = 0.9;
  bool enforce_eager = false;
  bool breakdown = false;  // CUDA: per-op profile of one decode step per batch size
  bool no_pdl = false;  // CUDA: plain launches instead of programmatic dependent launch (cuda/common/pdl.h)
};

// The table's format column: the projections' format, "-a8" in the W8A8 mode (--activation-quant mxfp8).
std::string format_column(Format linear_format, Format act) {
  return std::string(traits(linear_format).name) + (act == Format::kMXFP8 ? "-a8" : "");
}

std::string tg_label(const DecodeOptions& o) {
  return o.depth > 0 ? fmt::format("tg{} @ d{}", o.tg, o.depth) : fmt::format("tg{}", o.tg);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Host memcpy bandwidth (read + write bytes per second) over a buffer far larger than the caches.
double memcpy_gbps() {
  const size_t n = size_t{256} << 20;
  std::vector<uint8_t> a(n, 1), b(n, 0);
  double best = 1e300;
  for (int r = 0; r < 3; ++r) {
    const double t0 = now_s();
    std::memcpy(b.data(), a.data(), n);
    best = std::min(best, now_s() - t0);
  }
  return 2.0 * static_cast<double>(n) / best / 1e9;
}

// Parameters and bytes one token touches: routed experts count top_k / num_experts of their bytes; the
// embedding table counts one row unless it doubles as lm_head.
struct Footprint {
  double params = 0, bytes = 0, active_params = 0, active_bytes = 0;
};
Footprint footprint(const LoadedModel& m) {
  Footprint f;
  const ModelConfig& c = m.config;
  for (const auto& [name, t] : m.store.tensors()) {
    double n = 1;
    for (int64_t d : t.shape) n *= static_cast<double>(d);
    const double bytes = static_cast<double>(t.values.size() + t.scales.size());
    f.params += n;
    f.bytes += bytes;
    double share = 1;
    if (name.find(".mlp.experts.") != std::string::npos)
      share = static_cast<double>(c.num_experts_per_tok) / static_cast<double>(c.num_experts);
    if (name == "model.embed_tokens.weight" && !c.tie_word_embeddings)
      share = 1.0 / static_cast<double>(c.vocab_size);
    f.active_params += n * share;
    f.active_bytes += bytes * share;
  }
  return f;
}

#if MXQ_HAVE_CUDA
// Device-to-device copy bandwidth, bytes read + written per second (median of 5 copies of 1 GiB, CUDA
// events): the ceiling a decode step that streams its weights once can reach.
Result<double> copy_gbps() {
  const size_t n = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) {
    cudaFree(a);
    return fail("copy ceiling: cannot allocate 2 GiB");
  }
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(e0);
    cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  std::sort(ms.begin(), ms.end());
  return 2.0 * static_cast<double>(n) / (ms[2] * 1e-3) / 1e9;
}

// --breakdown: `batch` fresh sequences decode eagerly with a step profiler set on the model: a prompt step
// and two warm-up steps untimed, then `reps` (at least 5) profiled decode steps, whose per-op times are
// summed.
Result<StepOpTotals> profile_decode(cuda::CudaEngine& e, int32_t batch, const DecodeOptions& o,
                                    const std::vector<int32_t>& prompt, uint64_t& id) {
  Engine& engine = e.engine;
  cuda::Qwen3Cuda& model = e.runner->model();
  auto prof = cuda::StepProfiler::create();
  if (!prof) return tl::unexpected(prof.error());
  const int steps = std::max(o.reps, 5);
  GenerateParams gp;
  gp.ignore_eos = true;
  gp.sampling.temperature = 0;
  gp.max_new_tokens = steps + 4;
  for (int32_t i = 0; i < batch; ++i)
    if (auto st = engine.add(id++, prompt, gp); !st) return tl::unexpected(st.error());
  for (int i = 0; i < 3; ++i)  // the prompts, then two decode steps
    if (auto st = engine.step(); !st) return tl::unexpected(st.error());
  model.set_profiler(prof->get());
  Status st;
  for (int i = 0; i < steps && st; ++i) {
    auto out = engine.step();
    if (!out) st = tl::unexpected(out.error());
    if (st && (*prof)->in_step()) st = (*prof)->finish_step();
  }
  model.set_profiler(nullptr);
  if (!st) return tl::unexpected(st.error());
  while (!engine.idle())
    if (auto s2 = engine.step(); !s2) return tl::unexpected(s2.error());
  return (*prof)->totals();
}

// pp: `batch` prompts of pp tokens in one step (max_new_tokens 1); tg: `batch` sequences decoding tg tokens,
// timed from the second step on (each step replays the bucket's graph unless --enforce-eager). Wall time of
// engine steps, each of which ends with the tokens on the host.
int run_decode_cuda(const DecodeOptions& o, const std::string& dir, LoadOptions load) {
  auto bad = [](const std::string& msg) {
    fmt::print(stderr, "mxq-bench decode: {}\n", msg);
    return kExitBadInput;
  };
  load.target = cuda::cuda_load_target();
  auto m = load_model(dir, load);
  if (!m) return bad(m.error().message);
  auto act = parse_activation_quant(o.activation_quant, m->linear_format, m->activations);
  if (!act) return bad(act.error().message);
  const ModelConfig& c = m->config;
  const int64_t len = std::max(o.pp, o.depth + 1) + o.tg + 1;
  if (len > c.max_position_embeddings)
    return bad(fmt::format("--pp / --depth + --tg beyond the context of {} positions", c.max_position_embeddings));
  auto bw = copy_gbps();
  if (!bw) return bad(bw.error().message);
  const Footprint f = footprint(*m);
  const std::string name = std::filesystem::path(dir).filename().string();
  const std::string fmt_name = format_column(m->linear_format, *act);
  const std::string params = fmt::format("{:.2f} B", f.params / 1e9),
                    size = fmt::format("{:.2f} GiB", f.bytes / 1073741824.0);
  fmt::print("| {:<16} | {:>8} | {:>8} | {:>9} | {:>5} | {:>6} | {:>10} | {:>9} | {:>11} |\n", "model",
             "format", "params", "size", "batch", "test", "tok/s", "GB/s", "% roofline");
  fmt::print("|{:-<18}|{:->10}|{:->10}|{:->11}|{:->7}|{:->8}|{:->12}|{:->11}|{:->13}|\n", "", "", "", "", "",
             "", "", "", "");
  std::mt19937 rng(0);
  for (int32_t batch : o.batch) {
    if (batch < 1) return bad(fmt::format("--batch {}: expected >= 1", batch));
    cuda::CudaRunnerOptions ro;
    ro.model.max_num_seqs = batch;
    ro.model.max_num_batched_tokens = std::max<int64_t>(std::max(o.pp, o.depth + 1) * batch, 16);
    ro.model.max_model_len = len;
    ro.model.gpu_memory_utilization = o.gpu_memory_utilization;
    ro.model.act_quant = *act;
    ro.enforce_eager = o.enforce_eager;
    auto e = cuda::make_cuda_engine(c, nullptr, m->store, ro);
    if (!e) return bad(e.error().message);
    Engine& engine = e->engine;
    auto prompt = [&](int64_t n) {
      std::vector<int32_t> p(static_cast<size_t>(n));
      for (auto& id : p) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.vocab_size));
      return p;
    };
    GenerateParams gp;
    gp.ignore_eos = true;
    gp.sampling.temperature = 0;
    uint64_t id = 0;
    double pp_s = 1e300, tg_s = 1e300;
    for (int r = 0; r < o.reps + 1; ++r) {  // note: the first rep warms up (cuBLAS heuristics, graph capture)
      gp.max_new_tokens = 1;
      for (int32_t i = 0; i < batch; ++i)
        if (auto st = engine.add(id++, prompt(o.pp), gp); !st) return bad(st.error().message);
      double t0 = now_s();
      while (!engine.idle())
        if (auto st = engine.step(); !st) return bad(st.error().message);
      if (r > 0) pp_s = std::min(pp_s, now_s() - t0);
      gp.max_new_tokens = o.tg + 1;
      for (int32_t i = 0; i < batch; ++i)
        if (auto st = engine.add(id++, prompt(o.depth + 1), gp); !st) return bad(st.error().message);
      if (auto st = engine.step(); !st) return bad(st.error().message);  // the prompts (the depth)
      t0 = now_s();
      while (!engine.idle())
        if (auto st = engine.step(); !st) return bad(st.error().message);
      if (r > 0) tg_s = std::min(tg_s, now_s() - t0);
    }
    const double pp_tps = static_cast<double>(o.pp * batch) / pp_s;
    const double steps_per_s = static_cast<double>(o.tg) / tg_s;
    // note: a decode step streams the active weights once whatever the batch (KV reads are left out: short
    // contexts), so the roofline is copy bandwidth / bytes per step.
    const double gbps = f.active_bytes * steps_per_s / 1e9;
    fmt::print("| {:<16} | {:>8} | {:>8} | {:>9} | {:>5} | {:>6} | {:>10.1f} | {:>9} | {:>11} |\n", name,
               fmt_name, params, size, batch, fmt::format("pp{}", o.pp), pp_tps, "-", "-");
    fmt::print("| {:<16} | {:>8} | {:>8} | {:>9} | {:>5} | {:>6} | {:>10.1f} | {:>9.0f} | {:>10.1f}% |\n",
               name, fmt_name, params, size, batch, tg_label(o), steps_per_s * batch, gbps,
               100 * gbps / *bw);
    fmt::print(stderr, "batch {}: {} decode graphs captured, {} replays; KV pool {} blocks\n", batch,
               e->runner->graphs_captured(), e->runner->graph_replays(), e->runner->model().num_blocks());
    if (o.breakdown) {
      auto steps = profile_decode(*e, batch, o, prompt(1), id);
      if (!steps) return bad(steps.error().message);
      const double tg_us = 1e6 * tg_s / static_cast<double>(o.tg);
      fmt::print(
          "\nbreakdown: one decode step at batch {}, run eagerly with CUDA events (mean of {} steps)\n",
          batch, steps->steps);
      const auto rows = breakdown_rows(*steps, *bw);
      fmt::print("{}", format_breakdown(rows));
      const double eager_us = rows.empty() ? 0 : rows.back().us;
      fmt::print(
          "{} step {:.1f} µs (tg wall time per step, host included); eager sum of ops {:.1f} µs; difference "
          "{:+.1f} µs (on a launch-bound step the eager op times include launch gaps the graph removes)\n\n",
          o.enforce_eager ? "eager" : "graph", tg_us, eager_us, eager_us - tg_us);
    }
  }
  fmt::print("copy ceiling {:.0f} GB/s (device-to-device, read + write); best of {} after a warm-up; {}\n",
             *bw, o.reps, o.enforce_eager ? "eager" : "decode steps from CUDA graphs");
  return 0;
}
#endif

int run_decode(const DecodeOptions& o) {
  auto bad = [](const std::string& msg) {
    fmt::print(stderr, "mxq-bench decode: {}\n", msg);
    return kExitBadInput;
  };
  if (o.device != "cpu" && o.device != "cuda")
    return bad(fmt::format("--device {}: expected cpu or cuda", o.device));
#if !MXQ_HAVE_CUDA
  if (o.device == "cuda") return bad("--device cuda: this build has no CUDA backend");
#endif
  if (o.pp < 1 || o.tg < 1 || o.reps < 1 || o.depth < 0)
    return bad("--pp, --tg and --reps must be >= 1, --depth >= 0");
  if (o.breakdown && o.device != "cuda")
    return bad(
        fmt::format("--breakdown: a per-op profile of the CUDA engine's decode step (--device cuda), not "
                    "--device {}",
                    o.device));
  const bool default_model = o.model.empty();
  std::string dir = o.model;
  if (default_model) {
    auto found = default_model_dir();
    if (!found) return bad(found.error().message);
    dir = *found;
  }
  LoadOptions load;
  load.threads = o.threads;
  const std::string q = o.quantization.empty()
                            ? (default_model ? std::string(traits(kDefaultModelQuantization).name) : "none")
                            : o.quantization;
  if (q != "none") {
    auto f = parse_format(q);
    if (!f) return bad(fmt::format("--quantization {}: expected none, mxfp8, mxfp4 or fp8-b128", q));
    load.quantization = *f;
  }
#if MXQ_HAVE_CUDA
  if (o.device == "cuda") {
    cuda::set_pdl(!o.no_pdl);
    return run_decode_cuda(o, dir, std::move(load));
  }
#endif
  auto m = load_model(dir, load);
  if (!m) return bad(m.error().message);
  auto act = parse_activation_quant(o.activation_quant, m->linear_format, m->activations);
  if (!act) return bad(act.error().message);
  auto backend = make_cpu_backend(o.threads, *act);
  auto qwen = Qwen3Model::create(m->config, m->store, *backend);
  if (!qwen) return bad(qwen.error().message);
  const ModelConfig& c = m->config;
  if (o.pp > c.max_position_embeddings || o.depth + o.tg > c.max_position_embeddings)
    return bad(fmt::format("--pp / --depth + --tg beyond the context of {} positions", c.max_position_embeddings));

  std::mt19937 rng(0);
  std::vector<int32_t> prompt(static_cast<size_t>(o.pp));
  for (auto& id : prompt) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.vocab_size));
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  double pp_s = 1e300, tg_s = 1e300;
  for (int r = 0; r < o.reps; ++r) {
    auto seq = Sequence::create(*qwen, o.pp);
    if (!seq) return bad(seq.error().message);
    const double t0 = now_s();
    if (auto st = seq->append(prompt, logits.data()); !st) return bad(st.error().message);
    pp_s = std::min(pp_s, now_s() - t0);
  }
  for (int r = 0; r < o.reps; ++r) {
    auto seq = Sequence::create(*qwen, o.depth + o.tg);
    if (!seq) return bad(seq.error().message);
    if (o.depth > 0) {
      std::vector<int32_t> ctx(static_cast<size_t>(o.depth));
      for (auto& t : ctx) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.vocab_size));
      if (auto st = seq->append(ctx, logits.data()); !st) return bad(st.error().message);
    }
    int32_t id = prompt[0];
    const double t0 = now_s();
    for (int64_t i = 0; i < o.tg; ++i) {
      if (auto st = seq->append(std::span(&id, 1), logits.data()); !st) return bad(st.error().message);
      id = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    tg_s = std::min(tg_s, now_s() - t0);
  }
  const Footprint f = footprint(*m);
  const double bw = memcpy_gbps();
  const double pp_tps = static_cast<double>(o.pp) / pp_s, tg_tps = static_cast<double>(o.tg) / tg_s;
  const std::string name = std::filesystem::path(dir).filename().string();
  const std::string fmt_name = format_column(m->linear_format, *act);
  fmt::print("| {:<16} | {:>8} | {:>8} | {:>10} | {:>6} | {:>10} | {:>34} |\n", "model", "format", "params",
             "size", "test", "tok/s", "speed of light");
  fmt::print("|{:-<18}|{:->10}|{:->10}|{:->12}|{:->8}|{:->12}|{:->36}|\n", "", "", "", "", "", "", "");
  const std::string params = fmt::format("{:.2f} M", f.params / 1e6),
                    size = fmt::format("{:.2f} MiB", f.bytes / 1048576.0);
  fmt::print("| {:<16} | {:>8} | {:>8} | {:>10} | {:>6} | {:>10.2f} | {:>34} |\n", name, fmt_name, params,
             size, fmt::format("pp{}", o.pp), pp_tps,
             fmt::format("{:.1f} GFLOP/s", 2 * f.active_params * pp_tps / 1e9));
  const double tg_gbps = f.active_bytes * tg_tps / 1e9;
  fmt::print("| {:<16} | {:>8} | {:>8} | {:>10} | {:>6} | {:>10.2f} | {:>34} |\n", name, fmt_name, params,
             size, tg_label(o), tg_tps,
             fmt::format("{:.2f} GB/s = {:.0f}% of memcpy {:.1f}", tg_gbps, 100 * tg_gbps / bw, bw));
  fmt::print("threads: {}, best of {} (wall time)\n",
             o.threads > 0 ? o.threads : static_cast<int>(default_pool().threads()), o.reps);
  return 0;
}

}  // namespace

void add_bench_decode(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<DecodeOptions>();
  auto* cmd = bench.add_subcommand("decode", "Whole-model prompt processing (pp) and generation (tg) tok/s");
  cmd->add_option("--device", o->device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--batch", o->batch, "CUDA: sequences per step (list)")
      ->capture_default_str()
      ->delimiter(',');
  cmd->add_option("--gpu-memory-utilization", o->gpu_memory_utilization, "CUDA: KV pool sizing")
      ->capture_default_str();
  cmd->add_flag("--enforce-eager", o->enforce_eager, "CUDA: no CUDA graphs");
  cmd->add_flag("--breakdown", o->breakdown, "CUDA: per-op time of one decode step per batch (CUDA events)");
  cmd->add_flag("--no-pdl", o->no_pdl, "CUDA: launch decode kernels without programmatic dependent launch");
  cmd->add_option("--model", o->model, "Checkpoint directory (default: models/default as MXFP8)");
  cmd->add_option("--quantization", o->quantization, "none, mxfp8, mxfp4, fp8-b128");
  cmd->add_option("--activation-quant", o->activation_quant,
                  "auto (as the checkpoint declares), none, or mxfp8: MX projections see their input quantized to MXFP8 "
                  "(W8A8 / W4A8)")
      ->capture_default_str();
  cmd->add_option("--pp", o->pp, "Prompt tokens")->capture_default_str();
  cmd->add_option("--tg", o->tg, "Generated tokens")->capture_default_str();
  cmd->add_option("--depth", o->depth, "Tokens already in the KV cache when tg starts (llama-bench -d)")
      ->capture_default_str();
  cmd->add_option("--reps", o->reps, "Repetitions (best is reported)")->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all)");
  cmd->callback([o, &exit_code] { exit_code = run_decode(*o); });
}

}  // namespace mxq::cli
