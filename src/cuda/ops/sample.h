// GPU token sampling, one sequence per CTA, per-sequence parameters in device buffers (twin: cpu/sampling.h
// sample(..., random_bits) with random_bits = philox_random_bits(seed, step)). Graph-capturable: the batch
// size, parameters, seeds and steps are read on device. Tensors and algorithm: sample.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mxq::cuda {

enum SampleStatus : int32_t { kSampleOk = 0, kSampleBadLogit = 1, kSampleAllMasked = 2 };

struct SampleArgs {
  const float* logits;       // f32 [max_seqs, vocab]
  const float* temperature;  // f32 [max_seqs]; < 1e-5: greedy
  const int32_t* top_k;      // int32 [max_seqs]; 0 or -1: off
  const float* top_p;        // f32 [max_seqs]; 1: off
  const float* min_p;        // f32 [max_seqs]; 0: off
  const uint64_t* seed;      // u64 [max_seqs]
  const uint64_t* step;      // u64 [max_seqs]: draw counter of the request (e.g. tokens generated so far)
  const int32_t* num_seqs;   // int32 [1] (null = max_seqs)
  int32_t* token;            // int32 [max_seqs] out (-1 on a bad row)
  float* logprob;            // f32 [max_seqs] out: log_softmax of the raw logits at token
  int32_t* status;           // int32 [max_seqs] out: SampleStatus
  int64_t vocab;
  int max_seqs;
};

// Parameters must have passed cpu/sampling check_sampling_params (the engine checks at admission).
// cudaErrorInvalidValue: vocab outside [1, 2^31 - 1], max_seqs < 1, a null pointer.
cudaError_t launch_sample(const SampleArgs& a, cudaStream_t stream);

}  // namespace mxq::cuda
