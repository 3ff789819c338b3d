// The tensors a Qwen3 / Qwen3-MoE checkpoint must hold (HF names, logical shapes), written once: the check
// that a checkpoint holds exactly those under its quantization scheme (the loader and `mxq inspect` share
// it, so whatever loading refuses, inspect refuses the same way; L-21: missing or unexpected tensors are
// refused), and the binding of the same names to a WeightStore's live tensors that every forward reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "io/config.h"
#include "io/scheme.h"
#include "io/tensor_meta.h"
#include "model/weight_store.h"

namespace mxq {

struct WeightSpec {
  std::string name;            // "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // logical shape: [N, K] for projections, [E, N, K] for stacked experts
  bool linear = false;         // a projection that quantized schemes may store quantized
};

// Expected tensors for the config. `stacked_experts` selects transformers' fused expert tensors
// (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]) over per-expert projections.
Result<std::vector<WeightSpec>> qwen3_weight_specs(const ModelConfig& cfg, bool stacked_experts);

// Checks that `tensors` holds exactly the expected weights under `scheme`: plain tensors in a float dtype
// with the spec's shape, quantized projections as the scheme's (values, scales) pair with the logical [N, K].
// Returns the specs the checkpoint matched.
Result<std::vector<WeightSpec>> check_qwen3_tensors(const ModelConfig& cfg, const Scheme& scheme,
                                                    const TensorMetaMap& tensors);

// The weights of one Qwen3DecoderLayer / Qwen3MoeDecoderLayer, by their HF module names (live tensors of
// the store, read in place by every forward, so a refit is visible to the next step with nothing rebound).
struct Qwen3LayerWeights {
  const QTensor *input_layernorm = nullptr, *post_attention_layernorm = nullptr;
  const QTensor *q_proj = nullptr, *k_proj = nullptr, *v_proj = nullptr, *o_proj = nullptr;
  const QTensor *q_norm = nullptr, *k_norm = nullptr;
  const QTensor *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr, *o_bias = nullptr;  // attention_bias
  bool sparse = false;  // Qwen3MoeSparseMoeBlock instead of Qwen3MLP
  // Qwen3MLP
  const QTensor *gate_proj = nullptr, *up_proj = nullptr, *down_proj = nullptr;
  // Qwen3MoeSparseMoeBlock: mlp.gate, then the experts stacked ([E, 2I, H] and [E, H, I]) or one module each
  const QTensor* router = nullptr;
  const QTensor *gate_up_proj = nullptr, *experts_down_proj = nullptr;
  std::vector<const QTensor*> expert_gate, expert_up, expert_down;
};

struct Qwen3Weights {
  const QTensor *embed_tokens = nullptr, *norm = nullptr;
  const QTensor* lm_head = nullptr;  // the embedding matrix itself when tie_word_embeddings
  std::vector<Qwen3LayerWeights> layers;
  bool stacked_experts = false;
};

// Refuses by name a config the Qwen3 forward cannot run, on any backend: another architecture, a rope_type
// other than 'default', head counts that do not group, num_experts_per_tok outside [1, num_experts].
Status check_qwen3_config(const ModelConfig& cfg);

// Checks the config, then binds every tensor it needs to `store`'s live tensors (the store must outlive the
// result). Stacked experts are chosen by the store holding the first sparse layer's mlp.experts.gate_up_proj.
// Refuses by name the first missing tensor.
Result<Qwen3Weights> bind_qwen3_weights(const ModelConfig& cfg, const WeightStore& store);

}  // namespace mxq
