#pragma once
// What one engine step hands the forward, on every device: the step metadata the runner fills (StepMeta),
// what sampling wrote back (StepOutputs), the forward's shape (ForwardShape) and what sampling needs per
// sequence (SampleSpec). In model/, below engine/, so that one Backend seam can take them
// (docs/one-forward.md).

#include <cstdint>
#include <random>
#include <span>

#include "cpu/sampling.h"

namespace mxq {

// The step metadata: host views into the pinned staging block (what the runner fills) and the matching
// device pointers (what the kernels read). Capacities: T tokens, S sequences, B blocks per sequence.
struct StepMeta {
  uint64_t *seed, *step;                    // [S] sampling draw (seed, index)
  float *temperature, *top_p, *min_p;       // [S]
  int32_t* top_k;                           // [S]
  int32_t *ids, *positions, *slot_mapping;  // [T]
  int32_t* block_tables;                    // [S, B]
  int32_t *seq_lens, *cu_seqlens;           // [S], [S + 1]
  int32_t *num_tokens, *num_seqs;           // [1] each: tokens of the step, sampling rows
};

// What sample() wrote, copied back in one piece.
struct StepOutputs {
  int32_t *token, *status;  // [S]
  float* logprob;           // [S]
  int32_t* bad_token;       // [1]: INT32_MAX unless a token id or slot was out of range (sticky)
};

// One forward's shape. Decode steps (one token per sequence, every sequence samples) run `rows` = a
// batch-size bucket with padding rows (graph-capturable); other steps run `rows` = their token count.
struct ForwardShape {
  int64_t rows = 0;                            // M of every linear layer (tokens, padding included)
  int32_t seqs = 0;                            // sequences of the step (bucket size for decode)
  bool decode = false;                         // paged decode attention instead of prefill attention
  int32_t sample_rows = 0;                     // logits rows: decode = seqs; else one per sampling chunk
  std::span<const int32_t> sample_token_rows;  // mixed steps: the token row each logits row comes from
};

// What the runner needs to sample one sequence's next token.
struct SampleSpec {
  const SamplingParams* params;
  std::mt19937_64* rng;  // the request's own generator (host samplers)
  uint64_t seed = 0;     // the request's seed and the index of the token being drawn (counter-based samplers)
  int64_t index = 0;
};

}  // namespace mxq
