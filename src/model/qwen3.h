// Qwen3ForCausalLM and Qwen3MoeForCausalLM: one forward for dense and MoE layers, written against the
// Backend seam (model/backend.h) and reading its weights from a WeightStore by HF tensor name.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/error.h"
#include "io/config.h"
#include "model/backend.h"
#include "model/qwen3_weights.h"
#include "model/weight_store.h"

namespace mxq {

class Qwen3Model {
 public:
  // Binds every tensor the config needs in `store` (bind_qwen3_weights; the store must outlive the model, as
  // must `backend`). Refuses by name what bind_qwen3_weights refuses.
  static Result<Qwen3Model> create(const ModelConfig& config, const WeightStore& store, Backend& backend);

  // One batched, paged step (docs/one-forward.md): the tokens, positions, slots and block tables the runner
  // wrote into kv.host_meta(), over `kv` (a pool of backend().create_kv). Writes the logits of the step's
  // sampling rows to logits_host [shape.sample_rows, vocab_size]: every row of a decode step, else the rows
  // shape.sample_token_rows names. Each sequence gets the bits it gets alone (the ops are row-independent).
  // Refuses an empty step, sampling rows that do not match the shape, an id outside the vocabulary.
  Status step(KvPool& kv, const ForwardShape& shape, float* logits_host);

  const ModelConfig& config() const { return config_; }
  Backend& backend() const { return *backend_; }

 private:
  struct Scratch;

  Qwen3Model(const ModelConfig& config, Backend& backend) : config_(config), backend_(&backend) {}
  Status ensure_scratch(int64_t tokens, int64_t samples);
  // normed -> hidden
  Status mlp(const Qwen3LayerWeights& layer);
  Status sparse_moe_block(int64_t layer);

  ModelConfig config_;
  Backend* backend_;
  Qwen3Weights w_;
  std::shared_ptr<Scratch> scratch_;
};

}  // namespace mxq
