// The CUDA ModelRunner: runs each scheduler plan as one batched, paged forward of model/qwen3_cuda.h, samples
// on the GPU (Philox draw (seed, index) of each request's SampleSpec) and brings the tokens back once a step.
// Per step: the metadata (token ids, positions, slot mapping, block tables, sequence lengths, cu_seqlens,
// sampling parameters) is written into one pinned block and uploaded in one copy; the outputs (token,
// logprob, status, bad_token) come back in one copy.
// Decode steps (every sequence one token, every sequence sampling) are padded to a batch-size bucket
// (1, 2, 4, ... up to max_num_seqs) and replayed from a CUDA graph captured lazily per bucket; other steps,
// and every step of an MoE model (its expert loop is host-driven) or of a model with a step profiler set, run
// eagerly. enforce_eager runs every step
// eagerly with the same bucket padding, so a replay equals an eager run bit for bit.
// Prefix caching: a chunk's K/V writes (slot mapping) cover only its own positions [start, start + count),
// which never fall in a shared block (the scheduler shares only blocks wholly before a sequence's first
// computed position); shared blocks are only read, through the block tables and seq_lens. The plan's block
// copies (copy-on-write of a prompt's partial block into a fresh block) run first, as device copies on the
// model's stream (Qwen3Cuda::copy_kv_block), outside any graph.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "model/qwen3_cuda.h"

namespace mxq::cuda {

struct CudaRunnerOptions {
  Qwen3CudaOptions model;
  bool enforce_eager = false;         // vLLM --enforce-eager: never capture graphs
  bool enable_prefix_caching = true;  // EngineConfig::enable_prefix_caching of make_cuda_engine's engine
};

class CudaRunner final : public ModelRunner {
 public:
  // `store` must be a CUDA store loaded with cuda_load_target() and outlive the runner.
  static Result<std::unique_ptr<CudaRunner>> create(const ModelConfig& config, const WeightStore& store,
                                                    const CudaRunnerOptions& options);
  ~CudaRunner() override;

  Result<std::vector<SampledToken>> run(const StepPlan& plan, const Scheduler& scheduler,
                                        std::span<const SampleSpec> specs) override;
  void drop(uint64_t) override {}  // the KV blocks belong to the scheduler's pool

  // The EngineConfig this runner serves: scheduler capacities and the KV pool's block count.
  EngineConfig engine_config() const;
  Qwen3Cuda& model() { return *model_; }
  // Logits f32 [vocab] of sampling row `row` of the last step (tests compare them with the CPU model).
  Result<std::vector<float>> last_logits(int32_t row);
  int graphs_captured() const;
  int64_t graph_replays() const { return replays_; }
  // The bucket a decode step of `seqs` sequences runs at.
  int32_t bucket(int32_t seqs) const;

 private:
  CudaRunner() = default;
  Status launch_decode(int32_t rows, bool use_graph);

  std::unique_ptr<Qwen3Cuda> model_;
  CudaRunnerOptions options_;
  std::map<int32_t, cudaGraphExec_t> graphs_;  // per decode bucket, captured on first use
  int64_t replays_ = 0;
};

// The engine on the GPU: a runner from `options` and an Engine whose pool has the runner's KV blocks.
// `model` is the checkpoint's config.
struct CudaEngine {
  Engine engine;
  CudaRunner* runner;  // owned by the engine
};
Result<CudaEngine> make_cuda_engine(const ModelConfig& model, const Tokenizer* tokenizer,
                                    const WeightStore& store, const CudaRunnerOptions& options);

}  // namespace mxq::cuda
