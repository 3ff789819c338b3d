// generation_config.json of a Hugging Face checkpoint, read as vLLM applies it (`--generation-config auto`):
// its eos_token_id adds stop ids, and six sampling keys are defaults for what a request leaves out. vLLM's
// ModelConfig.get_diff_sampling_param reads exactly repetition_penalty, temperature, top_k, top_p, min_p and
// max_new_tokens (as max_tokens), dropping nulls; every other key (do_sample, pad_token_id, ...) is ignored
// here as there. note: `do_sample: false` does not mean greedy in vLLM (it never reads do_sample), so a file
// with do_sample false and temperature 0.7 samples at 0.7; only temperature 0 is greedy.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"

namespace mxq {

struct GenerationConfig {
  std::vector<int64_t> eos_token_ids;  // eos_token_id: an int or a list; empty if absent or null
  std::optional<float> temperature, top_p, min_p;
  std::optional<int64_t> top_k;
  // Exposed, not applied: mxq's sampler has no repetition penalty, while vLLM applies this default. A caller
  // running requests refuses a *request* that sets one != 1 (unsupported input is refused by name); for this
  // checkpoint default it logs one warning line that it is not applied (unsupported_repetition_penalty()).
  std::optional<float> repetition_penalty;
  std::optional<int64_t> max_new_tokens;

  bool empty() const;
  // The file's repetition_penalty when it is set to something other than 1 (which mxq cannot honour).
  std::optional<float> unsupported_repetition_penalty() const;
};

// Reads <dir>/generation_config.json. No file is an empty config, not an error (vLLM then falls back to
// config.json, whose eos_token_id ModelConfig already has). A file that is there but is not a regular file,
// is over 1 MiB, is not a JSON object, or has a used key of the wrong type or range (eos ids outside
// [0, 2^31), temperature < 0 or not finite, top_p outside (0, 1], min_p outside [0, 1], top_k < -1,
// repetition_penalty <= 0 or not finite, max_new_tokens < 1) is refused, naming the file, the key, and
// expected vs actual. The file is checked with fstat before any read, so a FIFO cannot block and a link to
// /dev/zero cannot grow the read.
Result<GenerationConfig> load_generation_config(const std::string& dir);
// The same checks on JSON text; `origin` names it in errors.
Result<GenerationConfig> parse_generation_config(std::string_view json_text, std::string_view origin);

// The sampling fields of one request; nullopt = the request did not set it (a CLI flag not given, a JSON
// field absent or null).
struct SamplingRequest {
  std::optional<float> temperature, top_p, min_p;
  std::optional<int64_t> top_k;
  std::optional<float> repetition_penalty;
  std::optional<int64_t> max_new_tokens;
};

// What applies when neither the request nor generation_config.json sets a field. The defaults are vLLM's
// (ChatCompletionRequest._DEFAULT_SAMPLING_PARAMS: temperature 1, top_p 1, top_k 0, min_p 0, repetition
// penalty 1; SamplingParams.max_tokens 16); a caller with other defaults (mxq generate: greedy, 64 tokens)
// passes its own.
struct SamplingFallback {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int64_t top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  int64_t max_new_tokens = 16;
};

struct ResolvedSampling {
  float temperature = 1.0f, top_p = 1.0f, min_p = 0.0f;
  int64_t top_k = 0;
  float repetition_penalty = 1.0f;  // see GenerationConfig::repetition_penalty: reported, not applied
  int64_t max_new_tokens = 16;
  // The keys whose value came from generation_config.json, in the order above (for logs and --json).
  std::vector<std::string> from_generation_config;
  bool max_new_tokens_from_generation_config() const;
};

// Per field: the request's value if set, else generation_config.json's, else the fallback (vLLM's
// `request.x if not None else default_sampling_params.get(x, default)`). With --generation-config auto,
// vLLM's max_new_tokens from the file is such a default, not a cap on a request's own max_tokens; it is
// then clamped to the context left after the prompt (get_max_tokens), which is the caller's to do since it
// alone knows the prompt. Values are not range-checked here: the request's go through the sampler's
// checks, the file's were checked at load.
ResolvedSampling apply_generation_defaults(const GenerationConfig& config, const SamplingRequest& request,
                                           const SamplingFallback& fallback = {});

// generation_config.json's eos ids that are not already config.json's (vLLM's update_from_generation_config
// discards the primary eos and adds the rest to stop_token_ids, unless ignore_eos), as stop token ids.
std::vector<int32_t> extra_stop_token_ids(const GenerationConfig& config, std::span<const int64_t> model_eos);

}  // namespace mxq
