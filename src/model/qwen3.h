// Qwen3ForCausalLM and Qwen3MoeForCausalLM: one forward for dense and MoE layers, written against the
// Backend seam (model/backend.h) and reading its weights from a WeightStore by HF tensor name.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "base/error.h"
#include "io/config.h"
#include "model/backend.h"
#include "model/qwen3_weights.h"
#include "model/weight_store.h"

namespace mxq {

// One sequence's KV cache as the forward sees it (the engine owns the memory).
// note: per layer, K and V are [capacity, kv_heads, head_dim] f32 in backend memory, position-major, so the
// attention op reads the first `length` entries as one contiguous cache.
struct SequenceKv {
  std::vector<float*> k, v;
  int64_t capacity = 0;
  int64_t length = 0;  // positions already written
};

class Qwen3Model {
 public:
  // Binds every tensor the config needs in `store` (bind_qwen3_weights; the store must outlive the model, as
  // must `backend`). Refuses by name what bind_qwen3_weights refuses.
  static Result<Qwen3Model> create(const ModelConfig& config, const WeightStore& store, Backend& backend);

  // Runs `ids` (the next tokens of the sequence, at positions kv.length ..) through the model, appends their
  // K/V to `kv` and writes the logits of the last position to logits_host [vocab_size]. Refuses an empty
  // batch, an id outside the vocabulary, or a cache without room for the tokens (naming the limit).
  Status forward(std::span<const int32_t> ids, SequenceKv& kv, float* logits_host);

  // One batched, paged step (docs/one-forward.md): the tokens, positions, slots and block tables the runner
  // wrote into backend().host_meta(), over the KV pool of backend().create_kv. Writes the logits of the
  // step's sampling rows to logits_host [shape.sample_rows, vocab_size]: every row of a decode step, else the
  // rows shape.sample_token_rows names. Each sequence gets the bits forward() gives it alone.
  Status step(const ForwardShape& shape, float* logits_host);

  const ModelConfig& config() const { return config_; }
  Backend& backend() const { return *backend_; }

 private:
  struct Scratch;

  Qwen3Model(const ModelConfig& config, Backend& backend) : config_(config), backend_(&backend) {}
  Status ensure_scratch(int64_t tokens);
  // Every decoder layer over the n rows of s.normed / s.residual; `attend(layer)` turns s.q, s.k, s.v into
  // s.attn (the per-sequence or the paged attention), the rest is shared.
  Status layers(int64_t n, const std::function<Status(size_t)>& attend);
  Status mlp(const Qwen3LayerWeights& layer, int64_t tokens, const float* x, float* out);
  Status sparse_moe_block(const Qwen3LayerWeights& layer, int64_t tokens, const float* x, float* out);

  ModelConfig config_;
  Backend* backend_;
  Qwen3Weights w_;
  std::shared_ptr<Scratch> scratch_;
};

}  // namespace mxq
