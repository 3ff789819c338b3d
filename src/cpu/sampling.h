// Token sampling from one row of logits: greedy, temperature, min-p, top-k, top-p (vLLM's order and
// masking rules), a caller-seeded std::mt19937_64, and logprobs of the unmodified distribution.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "base/error.h"

namespace mxq {

struct SamplingParams {
  float temperature = 1.0f;  // < 1e-5 (vLLM's epsilon) means greedy
  int64_t top_k = 0;         // 0 or -1 = off; otherwise keep logits >= the k-th largest (ties kept)
  float top_p = 1.0f;        // in (0, 1]; 1 = off
  float min_p = 0.0f;        // in [0, 1]; 0 = off; drops tokens with prob < min_p * max prob
  int64_t num_logprobs = 0;  // alternatives reported, in [0, vocab]
};

struct TokenLogprob {
  int32_t id;
  float logprob;
};

struct SampledToken {
  int32_t id;
  float logprob;                           // log_softmax of the raw logits at id
  std::vector<TokenLogprob> top_logprobs;  // num_logprobs best raw logprobs, ties by lower id
};

// Refuses, naming the field and its range, parameters a request may carry but sampling cannot honour
// (NaN or negative temperature, top_p outside (0, 1], min_p outside [0, 1], top_k < -1, num_logprobs
// outside [0, vocab]).
Status check_sampling_params(const SamplingParams& params, int64_t vocab);

// Picks one token from logits[0, vocab); refuses NaN or +inf logits and a row that is all -inf. Same logits,
// params and rng state -> same token. Greedy draws nothing from rng; every other mode draws exactly one
// 64-bit number. note: the order is vLLM's: logits / temperature, then min-p, top-k, top-p, then one draw.
Result<SampledToken> sample(const float* logits, int64_t vocab, const SamplingParams& params,
                            std::mt19937_64& rng);

// The same, with the one 64-bit draw given (unused when greedy): the CPU twin of cuda/sample, which passes
// philox_random_bits(seed, step) (cpu/philox.h) so every draw of a batch is reproducible from its request.
Result<SampledToken> sample(const float* logits, int64_t vocab, const SamplingParams& params,
                            uint64_t random_bits);

}  // namespace mxq
