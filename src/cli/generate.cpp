// mxq generate: load a checkpoint (optionally quantizing it online), run one prompt, stream the text or print
// one JSON object. Without --model it runs the embedded default model (models/default) quantized to MXFP8.
// With --generation-config auto (the default, as vLLM's) the checkpoint's generation_config.json adds its
// eos ids as stop ids and gives the sampling defaults for flags not given on the command line.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "engine/default_model.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "io/chat_template.h"
#include "io/generation_config.h"
#include "io/safetensors.h"  // printable
#include "io/tokenizer.h"
#include "model/cpu_backend.h"
#include "model/load_model.h"
#include "refit/applier.h"
#if MXQ_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "engine/cuda_runner.h"
#include "model/qwen3_cuda.h"
#endif

namespace mxq::cli {
namespace {

// note: mxq generate's own defaults where neither a flag nor generation_config.json sets a value: greedy
// (vLLM's would be temperature 1.0) and 64 tokens.
constexpr float kDefaultTemperature = 0.0f;
constexpr int64_t kDefaultMaxNewTokens = 64;

struct GenerateOptions {
  std::string prompt_positional, prompt, prompt_ids, model, quantization, device = "auto";
  std::string activation_quant = "auto";
  std::string generation_config = "auto";
  int64_t max_new_tokens = kDefaultMaxNewTokens;
  float temperature = kDefaultTemperature, top_p = 1.0f, min_p = 0.0f;
  int64_t top_k = 0, top_logprobs = 0;
  std::string seed;  // decimal 0..2^64-1; empty: a random seed, reported in --json (vLLM's and llama.cpp's)
  std::vector<std::string> stop;
  std::vector<std::string> apply_delta;  // refit deltas applied in place after the load, in order
  bool ignore_eos = false, chat = false, json = false;
  int threads = 0;
  SamplingRequest given;  // the sampling flags given on the command line (the rest may come from the file)
  // CUDA engine (vLLM names)
  int32_t max_num_seqs = 256;
  int64_t max_model_len = 0;  // 0: the model's max_position_embeddings
  double gpu_memory_utilization = 0.9;
  bool enforce_eager = false;
  std::set<std::string> given_cuda_flags;  // the CUDA sizing flags given on the command line
  bool prompt_given = false;               // PROMPT or --prompt on the command line, even empty
};

// --model names a local checkpoint directory; the three mistakes a new user makes are named as such
// (issue 22: each said "no tokenizer.json ... (use --prompt-ids)").
Status check_model_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (st.type() == fs::file_type::regular)
    return fail("--model {}: a file; --model takes the checkpoint directory that holds it ({})", dir,
                fs::path(dir).parent_path().string());
  if (st.type() == fs::file_type::not_found) {
    const size_t slash = dir.find('/');
    const bool hub_id = slash != std::string::npos && slash > 0 && slash + 1 < dir.size() &&
                        dir.find('/', slash + 1) == std::string::npos && dir[0] != '.' &&
                        std::all_of(dir.begin(), dir.end(), [](char c) {
                          return std::isalnum(static_cast<unsigned char>(c)) || c == '/' || c == '-' ||
                                 c == '_' || c == '.';
                        });
    if (hub_id)
      return fail("--model {}: no such directory; mxq reads local checkpoints (a Hugging Face id? download it "
                  "first: huggingface-cli download {} --local-dir DIR)",
                  dir, dir);
    return fail("--model {}: no such directory (expected a local Hugging Face checkpoint directory)", dir);
  }
  if (st.type() != fs::file_type::directory)
    return fail("--model {}: not a directory (expected a local Hugging Face checkpoint directory)", dir);
  if (!fs::exists(fs::path(dir) / "config.json", ec))
    return fail("--model {}: no config.json (expected a Hugging Face checkpoint directory)", dir);
  return {};
}

// --seed as given: every digit of a decimal in [0, 2^64) (CLI11 wraps "-1" and clamps 2^64 in silence).
Result<uint64_t> parse_seed(const std::string& text) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    return fail("--seed {}: expected a decimal integer in [0, 18446744073709551615]", text);
  return v;
}

Result<std::vector<int32_t>> parse_ids(const std::string& list) {
  std::vector<int32_t> ids;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < INT32_MIN || v > INT32_MAX)
      return fail("--prompt-ids: '{}' is not a token id", item);
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return fail("--prompt-ids: empty list");
  return ids;
}

nlohmann::json logprobs_json(const Generation& g) {
  nlohmann::json out = nlohmann::json::array();
  for (const SampledToken& t : g.tokens) {
    nlohmann::json top = nlohmann::json::array();
    for (const TokenLogprob& a : t.top_logprobs) top.push_back({{"token_id", a.id}, {"logprob", a.logprob}});
    out.push_back({{"token_id", t.id}, {"logprob", t.logprob}, {"top_logprobs", top}});
  }
  return out;
}

// Returns the exit code; errors are one line on stderr.
int run_generate(const GenerateOptions& o) {
  auto bad = [](const Error& e) {
    fmt::print(stderr, "mxq generate: {}\n", e.message);
    return kExitBadInput;
  };
  std::string dir = o.model;
  if (dir.empty()) {
    auto found = default_model_dir();
    if (!found) return bad(found.error());
    dir = *found;
  }
  if (!o.model.empty())
    if (auto st = check_model_dir(o.model); !st) return bad(st.error());
  LoadOptions load;
  load.threads = o.threads;
  if (o.device != "cpu" && o.device != "auto" && o.device != "cuda")
    return bad({fmt::format("--device {}: expected cpu, cuda or auto", o.device)});
  const bool on_cuda = o.device == "cuda" || (o.device == "auto" && cuda_device_visible());
  // note: the CUDA engine's sizing flags have no CPU meaning here (one sequence, a cache of its own length).
  if (!on_cuda)
    for (const char* flag : {"--max-num-seqs", "--max-model-len", "--gpu-memory-utilization"})
      if (o.given_cuda_flags.count(flag))
        return bad({fmt::format("{}: applies to --device cuda only (this run is on the CPU)", flag)});
  uint64_t seed = 0;
  if (o.seed.empty()) {
    std::random_device rd;
    seed = (uint64_t{rd()} << 32) ^ rd();
  } else {
    auto s = parse_seed(o.seed);
    if (!s) return bad(s.error());
    seed = *s;
  }
#if !MXQ_HAVE_CUDA
  if (on_cuda) return bad({"--device cuda: this build has no CUDA backend (use --device cpu)"});
#else
  if (on_cuda && !cuda_device_visible())
    return bad({"--device cuda: no CUDA device is visible (use --device cpu)"});
  if (on_cuda) load.target = cuda::cuda_load_target();
#endif
  // note: the embedded default model runs as MXFP8 unless told otherwise; a given --model runs as stored.
  const std::string q = o.quantization.empty()
                            ? (o.model.empty() ? std::string(traits(kDefaultModelQuantization).name) : "none")
                            : o.quantization;
  if (q != "none") {
    auto f = parse_format(q);
    if (!f) return bad({fmt::format("--quantization {}: expected none, mxfp8, mxfp4 or fp8-b128", q)});
    load.quantization = *f;
  }

  if (o.generation_config != "auto" && o.generation_config != "none")
    return bad({fmt::format("--generation-config {}: expected auto or none", o.generation_config)});
  // note: `none` reads nothing, so a broken generation_config.json does not stop a run that opts out.
  GenerationConfig gen_config;
  if (o.generation_config == "auto") {
    auto c = load_generation_config(dir);
    if (!c) return bad(c.error());
    gen_config = std::move(*c);
  }
  SamplingFallback fallback;
  fallback.temperature = kDefaultTemperature;
  fallback.max_new_tokens = kDefaultMaxNewTokens;
  ResolvedSampling sampling = apply_generation_defaults(gen_config, o.given, fallback);

  const std::string text = o.prompt.empty() ? o.prompt_positional : o.prompt;
  if (!o.prompt.empty() && !o.prompt_positional.empty())
    return bad({"give the prompt once: PROMPT or --prompt"});
  if (text.empty() && o.prompt_given && o.prompt_ids.empty())
    return bad({"the prompt is empty: give text to continue (PROMPT or --prompt) or --prompt-ids"});
  if (text.empty() == o.prompt_ids.empty())
    return bad({"give exactly one of PROMPT / --prompt and --prompt-ids"});
  if (o.chat && !o.prompt_ids.empty()) return bad({"--chat needs a text prompt, not --prompt-ids"});

  // The tokenizer is optional: checkpoints without tokenizer.json still run with --prompt-ids.
  std::optional<Tokenizer> tok;
  const std::string tok_path = dir + "/tokenizer.json";
  if (std::filesystem::exists(tok_path)) {
    auto t = Tokenizer::load(tok_path);
    if (!t) return bad(t.error());
    tok = std::move(*t);
  }
  std::vector<int32_t> prompt;
  if (!o.prompt_ids.empty()) {
    auto ids = parse_ids(o.prompt_ids);
    if (!ids) return bad(ids.error());
    prompt = std::move(*ids);
  } else {
    if (!tok)
      return bad(
          {fmt::format("{}: no tokenizer.json, so a text prompt cannot be encoded (use --prompt-ids)", dir)});
    std::string rendered = text;
    if (o.chat) {
      fmt::print(stderr, "{}\n", kChatTemplateNotice);
      const ChatMessage msg{"user", text, std::nullopt};
      auto r = render_qwen3_chat(std::span(&msg, 1), ChatOptions{true, std::nullopt});
      if (!r) return bad(r.error());
      rendered = std::move(*r);
    }
    // note: special tokens typed in a text prompt (`<|im_start|>`) encode as their ids, as HF's
    // Tokenizer.encode and vLLM's prompt path do; 1 MiB of text bounds the tokenizer's work (H-11).
    auto ids = tok->encode_checked(rendered, /*parse_special=*/true, size_t{1} << 20);
    if (!ids) return bad(ids.error());
    prompt = std::move(*ids);
  }

  // note: the library reports per weight; on a terminal the count is redrawn in place on stderr, elsewhere
  // nothing is printed (stdout may be JSON).
  if (isatty(STDERR_FILENO))
    load.progress = [](const Progress& p) {
      fmt::print(stderr, "\rloading {}/{} weights{}", p.done, p.total, p.done == p.total ? "\n" : "");
      return true;
    };
  auto model = load_model(dir, load);
  if (!model) return bad(model.error());
  auto act = parse_activation_quant(o.activation_quant, model->linear_format, model->activations);
  if (!act) return bad(act.error());
  if (auto notice = activation_mode_notice(dir, model->activations, *act); !notice.empty())
    fmt::print(stderr, "{}\n", notice);
  // note: the CPU engine's model; on CUDA the weights live on the device and the CUDA runner runs them, and
  // this one (bound to the store, nothing copied) stays unused.
  auto backend = make_cpu_backend(o.threads, *act);
  auto qwen = Qwen3Model::create(model->config, model->store, *backend);
  if (!qwen) return bad(qwen.error());
  if (!o.apply_delta.empty()) {
    // note: a loaded checkpoint is version 0, the base `mxq delta make` writes by default.
    uint64_t version = 0;
    const auto start = std::chrono::steady_clock::now();
    if (auto s = refit::apply_delta_files(model->store, version, o.apply_delta); !s) return bad(s.error());
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    fmt::print(stderr, "applied {} delta(s) in {:.1f} ms (read + apply): weights at version {}\n",
               o.apply_delta.size(), took.count() * 1e3, version);
  }
  if (tok && tok->vocab_size() > model->config.vocab_size)
    return bad({fmt::format("{}: tokenizer has {} ids, the model's vocab_size is {}", dir, tok->vocab_size(),
                            model->config.vocab_size)});

  for (int64_t id : gen_config.eos_token_ids)
    if (id >= model->config.vocab_size)
      return bad({fmt::format("{}/generation_config.json: eos_token_id {} is outside the vocabulary [0, {})",
                              dir, id, model->config.vocab_size)});
  if (auto rp = gen_config.unsupported_repetition_penalty())
    fmt::print(stderr, "{}/generation_config.json: repetition_penalty {} is not applied (mxq has none)\n",
               dir, *rp);
  // note: vLLM clamps a default max_tokens to the context the prompt leaves (get_max_tokens); an explicit
  // --max-new-tokens past it is still refused by the generator's check.
  const int64_t room = model->config.max_position_embeddings - static_cast<int64_t>(prompt.size());
  if (sampling.max_new_tokens_from_generation_config() && room >= 1)
    sampling.max_new_tokens = std::min(sampling.max_new_tokens, room);

  GenerateParams p;
  p.max_new_tokens = sampling.max_new_tokens;
  p.sampling =
      SamplingParams{sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p, o.top_logprobs};
  p.seed = seed;
  p.stop = o.stop;
  p.ignore_eos = o.ignore_eos;
  // note: as vLLM's update_from_generation_config, --ignore-eos also drops generation_config.json's eos ids.
  if (!o.ignore_eos) p.stop_token_ids = extra_stop_token_ids(gen_config, model->config.eos_token_ids);
#if MXQ_HAVE_CUDA
  std::optional<cuda::CudaEngine> cuda_engine;
  if (on_cuda) {
    cuda::CudaRunnerOptions ro;
    ro.model.max_num_seqs = o.max_num_seqs;
    ro.model.max_model_len = o.max_model_len;
    ro.model.gpu_memory_utilization = o.gpu_memory_utilization;
    ro.model.act_quant = *act;
    ro.enforce_eager = o.enforce_eager;
    auto e = cuda::make_cuda_engine(model->config, tok ? &*tok : nullptr, model->store, ro);
    if (!e) return bad(e.error());
    cuda_engine.emplace(std::move(*e));
  }
#endif
  Generator gen(*qwen, tok ? &*tok : nullptr);
  // Text streams as soon as it is final (the generator holds back possible stop strings and partial UTF-8);
  // --json prints one object at the end instead.
  const bool stream = !o.json;
  // note: like llama.cpp, a plain text prompt is echoed before its continuation (not a chat prompt), once
  // the request has passed its checks: with the first text, or after the run when it made none.
  bool echoed = !stream || !o.prompt_ids.empty() || o.chat;
  auto echo = [&] {
    if (echoed) return;
    echoed = true;
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  const TextCallback on_text = [&](std::string_view piece) {
    if (stream) {
      echo();
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
#if MXQ_HAVE_CUDA
  auto g =
      cuda_engine ? generate_one(cuda_engine->engine, prompt, p, on_text) : gen.generate(prompt, p, on_text);
#else
  auto g = gen.generate(prompt, p, on_text);
#endif
  if (!g) return bad(g.error());
  echo();
  if (o.json) {
    nlohmann::json j{{"token_ids", g->token_ids},
                     {"text", g->text},
                     {"logprobs", logprobs_json(*g)},
                     {"finish_reason", finish_reason_name(g->finish)},
                     {"prompt_tokens", prompt.size()},
                     {"model", dir},
                     {"format", traits(model->linear_format).name}};
    // The sampling parameters the run used, and which of them generation_config.json supplied.
    nlohmann::json s{{"temperature", sampling.temperature},
                     {"top_k", sampling.top_k},
                     {"top_p", sampling.top_p},
                     {"min_p", sampling.min_p},
                     {"max_new_tokens", sampling.max_new_tokens},
                     {"seed", seed},
                     {"seed_given", !o.seed.empty()},
                     {"stop_token_ids", p.stop_token_ids},
                     {"generation_config", o.generation_config},
                     {"from_generation_config", sampling.from_generation_config}};
    if (auto rp = gen_config.unsupported_repetition_penalty())
      s["not_applied"] = {{"repetition_penalty", *rp}};
    j["sampling"] = std::move(s);
    // note: replace keeps a token that decodes to invalid UTF-8 from throwing; decode already repairs it.
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    if (!tok) fmt::print("{}", fmt::join(g->token_ids, " "));
    fmt::print("\n");
    std::fflush(stdout);  // the text ends before the stats line on a shared terminal
    const double tg =
        g->decode_seconds > 0 ? static_cast<double>(g->token_ids.size() - 1) / g->decode_seconds : 0;
    fmt::print(stderr, "[{} prompt + {} generated tokens, {} ({}), prefill {:.1f} ms, {:.1f} tok/s, {}]\n",
               prompt.size(), g->token_ids.size(), dir, traits(model->linear_format).name,
               g->prefill_seconds * 1e3, tg, finish_reason_name(g->finish));
  }
  return 0;
}

}  // namespace

void add_generate(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "Generate text from a prompt (CPU or CUDA engine)");
  cmd->add_option("PROMPT", o->prompt_positional, "Prompt text");
  cmd->add_option("--prompt", o->prompt, "Prompt text");
  cmd->add_option("--prompt-ids", o->prompt_ids, "Prompt as comma-separated token ids");
  cmd->add_option("--model", o->model, "Checkpoint directory (default: models/default as MXFP8)");
  cmd->add_option("--quantization", o->quantization, "Quantize at load: none, mxfp8, mxfp4, fp8-b128");
  cmd->add_option(
         "--activation-quant", o->activation_quant,
         "auto (what the checkpoint's quantization_config declares), none (weight-only), or mxfp8: MXFP8/MXFP4 "
         "projections see their input quantized to MXFP8 per 1x32 (W8A8 / W4A8 numerics)")
      ->capture_default_str();
  cmd->add_option("--device", o->device, "cpu, cuda or auto (auto = cuda when a GPU is present)")
      ->capture_default_str();
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "CUDA: sequences in one step")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-model-len", o->max_model_len, "CUDA: context of one sequence (0 = the model's)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                  "CUDA: fraction of GPU memory for weights, buffers and KV blocks")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("--enforce-eager", o->enforce_eager, "CUDA: no CUDA graphs");
  cmd->add_option("--generation-config", o->generation_config,
                  "auto: the checkpoint's generation_config.json adds its eos_token_id as stop ids and gives "
                  "defaults for the sampling flags not given (temperature, top_k, top_p, min_p, "
                  "max_new_tokens; repetition_penalty is reported, not applied); none: ignore the file")
      ->capture_default_str();
  cmd->add_option("--max-new-tokens", o->max_new_tokens,
                  "Tokens to generate at most (default: generation_config.json's max_new_tokens, else 64)");
  cmd->add_option("--temperature", o->temperature,
                  "0 = greedy (default: generation_config.json's temperature, else 0, i.e. greedy)");
  cmd->add_option("--top-k", o->top_k, "0 = off (default: generation_config.json's, else 0)")
      ->check(CLI::Range(int64_t{0}, int64_t{INT32_MAX}));
  cmd->add_option("--top-p", o->top_p, "1 = off (default: generation_config.json's, else 1)");
  cmd->add_option("--min-p", o->min_p, "0 = off (default: generation_config.json's, else 0)");
  cmd->add_option("--seed", o->seed, "Sampling seed, 0..2^64-1 (default: random, reported in --json)");
  cmd->add_option("--stop", o->stop, "Stop string (repeatable)")->allow_extra_args(false);
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at EOS");
  cmd->add_option("--top-logprobs", o->top_logprobs, "Alternatives reported per token (with --json)");
  cmd->add_flag("--chat", o->chat, "Wrap the prompt in the Qwen3 chat template");
  cmd->add_flag("--json", o->json, "Print one JSON object: token_ids, text, logprobs");
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all)")->check(CLI::Range(0, 4096));
  cmd->add_option("--apply-delta", o->apply_delta,
                  "Refit delta applied in place after the load (repeatable, in order; the load is version 0)")
      ->allow_extra_args(false);
  cmd->callback([o, cmd, &exit_code] {
    // note: a flag the user gave wins over generation_config.json, even when it equals the CLI default.
    if (cmd->count("--temperature") > 0) o->given.temperature = o->temperature;
    if (cmd->count("--top-k") > 0) o->given.top_k = o->top_k;
    if (cmd->count("--top-p") > 0) o->given.top_p = o->top_p;
    if (cmd->count("--min-p") > 0) o->given.min_p = o->min_p;
    if (cmd->count("--max-new-tokens") > 0) o->given.max_new_tokens = o->max_new_tokens;
    for (const char* flag : {"--max-num-seqs", "--max-model-len", "--gpu-memory-utilization"})
      if (cmd->count(flag) > 0) o->given_cuda_flags.insert(flag);
    o->prompt_given = cmd->count("PROMPT") > 0 || cmd->count("--prompt") > 0;
    exit_code = run_generate(*o);
  });
}

}  // namespace mxq::cli
