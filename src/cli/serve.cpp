// mxq serve: an OpenAI-compatible rollout server (docs/serve.md). Loads a checkpoint as `mxq generate`
// does, starts the engine thread (CPU engine, or the batched CUDA engine with its decode graphs), binds
// 127.0.0.1:8000 unless told otherwise, and serves until SIGINT/SIGTERM, which drain it: no new requests,
// running ones finish within --drain-timeout (then are aborted), exit 0.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include "cli/commands.h"
#include "engine/default_model.h"
#include "engine/engine.h"
#include "io/chat_template.h"
#include "io/generation_config.h"
#include "io/tokenizer.h"
#include "model/cpu_backend.h"
#include "model/load_model.h"
#include "server/engine_loop.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/weight_update.h"
#if MXQ_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "engine/cuda_runner.h"
#include "model/qwen3_cuda.h"
#include "model/weight_memory_cuda.h"
#include "refit/tensor_update_cuda.h"
#endif

namespace mxq::cli {
namespace {

struct ServeOptions {
  std::string model_positional, model, served_model_name, quantization, device = "auto";
  std::string activation_quant = "auto", generation_config = "auto";
  server::ServerOptions server;
  int32_t max_num_seqs = 256;
  int64_t max_model_len = 0;  // 0: the model's max_position_embeddings
  int64_t max_num_batched_tokens = 0;  // 0: 8192 on CUDA, 2048 on the CPU (vLLM's defaults by device class)
  double gpu_memory_utilization = 0.9;
  bool gpu_memory_utilization_given = false;
  bool enforce_eager = false, prefix_caching = true, no_prefix_caching = false;
  double drain_timeout_s = 30;
  int64_t kv_cache_memory_bytes = 0;  // CPU: the KV block budget (0: 2 GiB)
  int threads = 0;
};

int run_serve(ServeOptions o) {
  auto bad = [](const std::string& message) {
    fmt::print(stderr, "mxq serve: {}\n", message);
    return kExitBadInput;
  };
  if (!o.model.empty() && !o.model_positional.empty() && o.model != o.model_positional)
    return bad("give the model once: MODEL_DIR or --model");
  const std::string given = o.model.empty() ? o.model_positional : o.model;
  std::string dir = given;
  if (dir.empty()) {
    auto found = default_model_dir();
    if (!found) return bad(found.error().message);
    dir = *found;
  }
  if (!std::filesystem::is_directory(dir))
    return bad(fmt::format("{}: not a checkpoint directory (expected a local Hugging Face directory with "
                           "config.json)",
                           dir));
  if (o.device != "cpu" && o.device != "cuda" && o.device != "auto")
    return bad(fmt::format("--device {}: expected cpu, cuda or auto", o.device));
  if (o.generation_config != "auto" && o.generation_config != "none")
    return bad(fmt::format("--generation-config {}: expected auto or none", o.generation_config));
  // note: SIGINT / SIGTERM are blocked before any thread starts and taken by sigwait below, so the drain
  // runs on a thread. Every thread inherits the mask: the CUDA runtime's own (its first call,
  // cuda_device_visible, starts them; on the H200 a SIGTERM reached one and killed serve, exit 143), the CPU
  // backend's pool, the engine thread and the HTTP workers.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const bool on_cuda = o.device == "cuda" || (o.device == "auto" && cuda_device_visible());
#if MXQ_HAVE_CUDA
  if (on_cuda && !cuda_device_visible()) return bad("--device cuda: no CUDA device is visible (use --device cpu)");
#else
  if (on_cuda) return bad("--device cuda: this build has no CUDA backend (use --device cpu)");
#endif
  if (on_cuda && o.kv_cache_memory_bytes > 0)
    return bad("--kv-cache-memory-bytes: applies to --device cpu (CUDA sizes its pool by --gpu-memory-utilization)");
  if (!on_cuda && o.gpu_memory_utilization_given)
    return bad("--gpu-memory-utilization: applies to --device cuda only (the CPU engine sizes its KV cache by "
               "--max-num-seqs x --max-model-len)");

  // note: a CPU step runs its chunks one after another, so its token budget bounds how long an abort or a
  // new request waits for the step in flight.
  if (o.max_num_batched_tokens == 0) o.max_num_batched_tokens = on_cuda ? 8192 : 2048;
  LoadOptions load;
  load.threads = o.threads;
#if MXQ_HAVE_CUDA
  if (on_cuda) load.target = cuda::cuda_load_target();
#endif
  const std::string q = o.quantization.empty()
                            ? (given.empty() ? std::string(traits(kDefaultModelQuantization).name) : "none")
                            : o.quantization;
  if (q != "none") {
    auto f = parse_format(q);
    if (!f) return bad(fmt::format("--quantization {}: expected none, mxfp8, mxfp4 or fp8-b128", q));
    load.quantization = *f;
  }
  std::optional<Tokenizer> tok;
  if (std::filesystem::exists(dir + "/tokenizer.json")) {
    auto t = Tokenizer::load(dir + "/tokenizer.json");
    if (!t) return bad(t.error().message);
    tok = std::move(*t);
  }
  GenerationConfig gen;
  if (o.generation_config == "auto") {
    auto g = load_generation_config(dir);
    if (!g) return bad(g.error().message);
    gen = std::move(*g);
    if (auto rp = gen.unsupported_repetition_penalty())
      fmt::print(stderr, "mxq serve: warning: {}/generation_config.json repetition_penalty {} is not applied "
                         "(mxq's sampler has none)\n", dir, *rp);
  }
  if (isatty(STDERR_FILENO))
    load.progress = [](const Progress& p) {
      fmt::print(stderr, "\rloading {}/{} weights{}", p.done, p.total, p.done == p.total ? "\n" : "");
      return true;
    };
  auto model = load_model(dir, load);
  if (!model) return bad(model.error().message);
  if (tok && tok->vocab_size() > model->config.vocab_size)
    return bad(fmt::format("{}: tokenizer has {} ids, the model's vocab_size is {}", dir, tok->vocab_size(),
                           model->config.vocab_size));
  auto act = parse_activation_quant(o.activation_quant, model->linear_format, model->activations);
  if (!act) return bad(act.error().message);
  if (auto notice = activation_mode_notice(dir, model->activations, *act); !notice.empty())
    fmt::print(stderr, "{}\n", notice);
  const Tokenizer* tp = tok ? &*tok : nullptr;
  // note: the CPU engine's backend and model before the engine, so the engine (its runner holds the model) goes
  // first
  std::unique_ptr<Backend> backend;
  std::optional<Qwen3Model> qwen;
  std::optional<Engine> engine;
#if MXQ_HAVE_CUDA
  std::optional<cuda::CudaEngine> cuda_engine;
  if (on_cuda) {
    cuda::CudaRunnerOptions ro;
    ro.model.max_num_seqs = o.max_num_seqs;
    ro.model.max_model_len = o.max_model_len;
    ro.model.max_num_batched_tokens = o.max_num_batched_tokens;
    ro.model.gpu_memory_utilization = o.gpu_memory_utilization;
    ro.model.act_quant = *act;
    ro.enforce_eager = o.enforce_eager;
    ro.enable_prefix_caching = !o.no_prefix_caching;
    // note: weight updates re-hash only the 1 KiB blocks a sparse delta touches (incremental checksums: 64
    // bytes of kept sums per KiB of weights, 6.25% more device memory), built here by one full hash, before
    // the KV cache takes its share of the memory.
    cuda::set_incremental_checksums(model->store.memory(), true);
    std::vector<std::string_view> names;
    for (const auto& [name, t] : model->store.tensors()) names.push_back(name);
    if (auto s = model->store.refresh_checksums(names); !s) return bad(s.error().message);
    auto e = cuda::make_cuda_engine(model->config, tp, model->store, ro);
    if (!e) return bad(e.error().message);
    cuda_engine.emplace(std::move(*e));
  }
#endif
  if (!on_cuda) {
    backend = make_cpu_backend(o.threads, *act);
    auto q = Qwen3Model::create(model->config, model->store, *backend);
    if (!q) return bad(q.error().message);
    qwen.emplace(std::move(*q));
    EngineConfig ec;
    ec.scheduler = {.max_num_seqs = o.max_num_seqs,
                    .max_num_batched_tokens = o.max_num_batched_tokens,
                    .max_model_len = o.max_model_len};
    ec.enable_prefix_caching = !o.no_prefix_caching;
    // note: the CPU runner's pool commits the pages its blocks touch and cached blocks are reused last, so
    // the pool is sized by a memory budget (f32 K and V of every layer), as vLLM's CPU backend sizes its
    // cache.
    const ModelConfig& mc = model->config;
    const int64_t block_bytes = int64_t{ec.block_size} * mc.num_hidden_layers * 2 * mc.num_key_value_heads *
                                mc.head_dim * static_cast<int64_t>(sizeof(float));
    const int64_t budget = o.kv_cache_memory_bytes > 0 ? o.kv_cache_memory_bytes : int64_t{2} << 30;
    const int64_t len = o.max_model_len > 0 ? o.max_model_len : mc.max_position_embeddings;
    const int64_t worst = int64_t{o.max_num_seqs} * ((len + ec.block_size - 1) / ec.block_size);
    ec.num_blocks = std::min(worst, budget / std::max<int64_t>(block_bytes, 1));
    if (ec.num_blocks < (len + ec.block_size - 1) / ec.block_size)
      return bad(fmt::format("--kv-cache-memory-bytes {}: holds {} blocks of {} tokens, one sequence of "
                             "--max-model-len {} needs {}",
                             budget, ec.num_blocks, ec.block_size, len, (len + ec.block_size - 1) / ec.block_size));
    auto e = Engine::create(model->config, tp, ec, make_cpu_runner(*qwen));
    if (!e) return bad(e.error().message);
    engine.emplace(std::move(*e));
  }
#if MXQ_HAVE_CUDA
  Engine& eng = cuda_engine ? cuda_engine->engine : *engine;
#else
  Engine& eng = *engine;
#endif

  const std::string name = !o.served_model_name.empty() ? o.served_model_name : given.empty() ? "default" : given;
  server::Metrics metrics(name);
  server::EngineLoop loop(eng, metrics);
  server::ServedModel served;
  served.name = name;
  served.root = dir;
  served.format = std::string(traits(model->linear_format).name) + (*act == Format::kMXFP8 ? "-a8" : "");
  served.quantization = std::string(traits(model->linear_format).name);
  served.activation_quant = *act == Format::kMXFP8 ? "mxfp8" : "none";
  served.device = on_cuda ? "cuda" : "cpu";
  served.tokenizer = tp;
  served.vocab_size = model->config.vocab_size;
  served.max_model_len = eng.scheduler().config().max_model_len;
  served.defaults = {gen.temperature, gen.top_p, gen.min_p, gen.top_k, gen.max_new_tokens};
  // note: generation_config.json's eos ids stop like config.json's (vLLM adds them to stop_token_ids).
  for (int64_t id : gen.eos_token_ids)
    if (std::find(model->config.eos_token_ids.begin(), model->config.eos_token_ids.end(), id) ==
        model->config.eos_token_ids.end())
      served.extra_stop_ids.push_back(static_cast<int32_t>(id));

  // note: weight updates (docs/serve.md "Weight updates") write model->store in place, on the engine thread;
  // a checkpoint update is quantized with the startup LoadOptions' rule.
  server::WeightUpdater weights(model->store, load, o.server.max_update_bytes);
#if MXQ_HAVE_CUDA
  // note: a colocated trainer's CUDA IPC buffer (/update_weights_from_tensor) is read by the CUDA engine only.
  if (on_cuda) weights.set_device_update(cuda::apply_ipc_manifest);
  // note: and a plain checkpoint that names every live tensor goes to the device and is quantized there
  if (on_cuda) weights.set_device_checkpoint(cuda::apply_checkpoint_on_device);
#endif
  server::HttpServer http(o.server, served, loop, metrics, &weights);
  auto port = http.bind();
  if (!port) return bad(port.error().message);
  loop.start();
  fmt::print(stderr, "{}\n", kChatTemplateNotice);
  fmt::print(stderr, "mxq serve: listening on http://{}:{} (model {}, {}, {})\n", o.server.host, *port, name,
             served.format, served.device);
  std::fflush(stderr);
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    fmt::print(stderr, "mxq serve: {} received, draining (up to {:.0f} s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
               o.drain_timeout_s);
    loop.drain(std::chrono::milliseconds(static_cast<int64_t>(o.drain_timeout_s * 1000)));
    http.stop();
  });
  http.listen();
  waiter.join();
  fmt::print(stderr, "mxq serve: stopped\n");
  return 0;
}

}  // namespace

void add_serve(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible rollout server (continuous batching, metrics)");
  cmd->add_option("MODEL_DIR", o->model_positional, "Checkpoint directory (default: models/default as MXFP8)");
  cmd->add_option("--model", o->model, "Checkpoint directory (same as MODEL_DIR)");
  cmd->add_option("--served-model-name", o->served_model_name,
                  "Model id in the API (default: the directory as given, or 'default')");
  cmd->add_option("--quantization", o->quantization, "Quantize at load: none, mxfp8, mxfp4, fp8-b128");
  cmd->add_option("--activation-quant", o->activation_quant,
                  "auto (as the checkpoint declares), none, or mxfp8 (W8A8 / W4A8 numerics)")
      ->capture_default_str();
  cmd->add_option("--device", o->device, "cpu, cuda or auto")->capture_default_str();
  cmd->add_option("--host", o->server.host, "Address to bind (127.0.0.1: this machine only)")->capture_default_str();
  cmd->add_option("--port", o->server.port, "Port (0: any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->server.api_key, "Require 'Authorization: Bearer KEY' on every route but /health")
      ->envname("MXQ_API_KEY");
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "Sequences in one step")->capture_default_str()->check(CLI::Range(1, 65536));
  cmd->add_option("--max-model-len", o->max_model_len, "Context of one sequence (0 = the model's)")
      ->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd->add_option("--max-num-batched-tokens", o->max_num_batched_tokens,
                  "Tokens in one step (0: 8192 on CUDA, 2048 on the CPU)")
      ->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd->add_option_function<double>(
         "--gpu-memory-utilization",
         [o](double v) {
           o->gpu_memory_utilization = v;
           o->gpu_memory_utilization_given = true;
         },
         "CUDA: fraction of GPU memory for weights, buffers and KV blocks (default 0.9)")
      ->check(CLI::Range(0.01, 1.0));
  cmd->add_flag("--enforce-eager", o->enforce_eager, "CUDA: no CUDA graphs");
  cmd->add_option("--kv-cache-memory-bytes", o->kv_cache_memory_bytes,
                  "CPU: bytes of KV blocks (0: 2 GiB; vLLM's flag name)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--generation-config", o->generation_config,
                  "auto: generation_config.json's eos ids and sampling defaults apply; none: ignore it")
      ->capture_default_str();
  cmd->add_flag("--enable-prefix-caching", o->prefix_caching, "Share KV blocks of equal prompt prefixes (default)");
  cmd->add_flag("--no-enable-prefix-caching", o->no_prefix_caching, "Turn prefix caching off");
  cmd->add_option("--max-n", o->server.limits.max_n, "Largest n (samples per prompt) a request may ask for")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--max-logprobs", o->server.limits.max_logprobs, "Largest logprobs / top_logprobs")
      ->capture_default_str()->check(CLI::Range(int64_t{0}, int64_t{1024}));
  cmd->add_option("--max-body-bytes", o->server.max_body_bytes, "Largest request body (413 beyond)")
      ->capture_default_str()->check(CLI::Range(size_t{1024}, size_t{1} << 31));
  cmd->add_option("--max-update-bytes", o->server.max_update_bytes,
                  "Largest /update_weights_from_delta body or delta file (413 beyond)")
      ->capture_default_str()->check(CLI::Range(size_t{1024}, size_t{1} << 50));
  cmd->add_option("--max-connections", o->server.max_connections, "Connections served at once (503 past twice)")
      ->capture_default_str()->check(CLI::Range(size_t{1}, size_t{16384}));
  cmd->add_option("--timeout-keep-alive", o->server.keep_alive_timeout_s, "Idle keep-alive seconds")
      ->capture_default_str()->check(CLI::Range(1, 3600));
  cmd->add_option("--header-timeout", o->server.header_timeout_s,
                  "Seconds a connection may take to send a whole request's headers")
      ->capture_default_str()->check(CLI::Range(1, 3600));
  cmd->add_option("--read-timeout", o->server.read_timeout_s, "Seconds a client may send nothing mid-request")
      ->capture_default_str()->check(CLI::Range(1, 3600));
  cmd->add_option("--drain-timeout", o->drain_timeout_s, "Seconds running requests get to finish at shutdown")
      ->capture_default_str()->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all)")->check(CLI::Range(0, 4096));
  cmd->callback([o, &exit_code] { exit_code = run_serve(*o); });
}

}  // namespace mxq::cli
