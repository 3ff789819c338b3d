// Generation for one sequence: prefill, then one token at a time through the model's KV cache, sampling
// with src/cpu/sampling.h, stopping on stop token ids (EOS unless ignored), stop strings or max_new_tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "cpu/sampling.h"
#include "io/tokenizer.h"
#include "model/qwen3.h"

namespace mxq {

struct GenerateParams {
  int64_t max_new_tokens = 16;
  SamplingParams sampling;              // sampling.num_logprobs = top-k alternatives reported per token
  uint64_t seed = 0;                    // seeds one std::mt19937_64 per request
  std::vector<std::string> stop;        // stop strings (need a tokenizer); excluded from the text
  std::vector<int32_t> stop_token_ids;  // besides config.json's eos_token_id
  bool ignore_eos = false;              // keep going through EOS (stop_token_ids still stop)
  bool skip_special_tokens = false;     // leave special tokens out of the text (the server's default, vLLM's)
};

enum class FinishReason { kLength, kStopToken, kStopString, kAbort };
std::string_view finish_reason_name(FinishReason r);  // "length", "stop", "abort"

struct Generation {
  std::vector<int32_t> token_ids;    // generated only, including a stop token that ended generation
  std::vector<SampledToken> tokens;  // id, logprob and top alternatives of each generated token
  std::string text;                  // decoded text, without a stop token's text or a stop string
  FinishReason finish = FinishReason::kLength;
  double prefill_seconds = 0, decode_seconds = 0;  // wall time of the prompt forward / the later forwards
};

// Called with each piece of text as soon as it is final (never inside a possible stop string, never half a
// UTF-8 character); returning false stops generation (finish = kLength as if the budget ran out).
using TextCallback = std::function<bool(std::string_view piece)>;

class Generator {
 public:
  // `tokenizer` may be null: token ids only, and stop strings are refused.
  Generator(Qwen3Model& model, const Tokenizer* tokenizer) : model_(&model), tokenizer_(tokenizer) {}

  // Refuses, naming the field and its limit: an empty prompt, a prompt id or stop token id outside
  // [0, vocab_size) (H-07), max_new_tokens < 1, prompt + max_new_tokens beyond max_position_embeddings
  // (H-03, H-04), bad sampling parameters (H-06), an empty stop string or stop strings without a tokenizer.
  Result<Generation> generate(std::span<const int32_t> prompt, const GenerateParams& params,
                              const TextCallback& on_text = {});

  // The same checks generate() runs before its first forward (check_request below).
  Status check_request(std::span<const int32_t> prompt, const GenerateParams& params) const;

 private:
  Qwen3Model* model_;
  const Tokenizer* tokenizer_;
};

// Refuses, naming the field and its limit, what Generator::generate and Engine::add refuse for a model of
// `config` (tokenizer may be null).
Status check_request(const ModelConfig& config, const Tokenizer* tokenizer, std::span<const int32_t> prompt,
                     const GenerateParams& params);

}  // namespace mxq
