// config.json of a Hugging Face checkpoint: what Qwen3ForCausalLM / Qwen3MoeForCausalLM need, read strictly.
// Keys follow transformers' Qwen3Config / Qwen3MoeConfig (both the 4.x and the 5.x spellings). The raw
// quantization_config is kept for scheme detection (io/scheme.h); unknown architectures are reported by name
// and left to the loader to refuse.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"

namespace mxq {

struct RopeConfig {
  double theta = 10000.0;        // rope_parameters.rope_theta, else legacy top-level rope_theta
  std::string type = "default";  // rope_parameters.rope_type (legacy rope_scaling.type)
  nlohmann::json parameters;     // the whole rope_parameters / rope_scaling object (null if absent)
};

struct ModelConfig {
  std::string architecture;         // architectures[0]
  std::string model_type;           // "qwen3", "qwen3_moe", ...
  bool architecture_known = false;  // one mxq has a forward for

  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  std::string dtype;  // "bfloat16", ... ("dtype" in transformers 5, "torch_dtype" before); "" if absent
  std::vector<int64_t> bos_token_ids;  // int or list in config.json; empty if null/absent
  std::vector<int64_t> eos_token_ids;

  // MoE (Qwen3MoeForCausalLM); num_experts == 0 for dense models.
  int64_t num_experts = 0;  // "num_experts" (4.x) or "num_local_experts" (5.x)
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t decoder_sparse_step = 1;
  bool norm_topk_prob = false;
  std::vector<int64_t> mlp_only_layers;

  nlohmann::json quantization_config;  // top level, else text_config's; null if absent

  // auto_map / trust_remote_code / custom code entries, recorded as "key=value". mxq never executes
  // checkpoint code; parse_config logs one warning line when this is non-empty.
  std::vector<std::string> remote_code_refs;
  // Features config.json asks for that the Qwen3 forward does not implement, one line each (a hidden_act
  // other than silu, sliding-window attention, a quantized KV cache): parse_config records them, the loader
  // (and inspect, which validates as the load does) refuses them through check_architecture. Never run in
  // silence.
  std::vector<std::string> unsupported;

  bool is_moe() const { return num_experts > 0; }
  // Whether decoder layer `layer` uses the sparse MoE block (transformers' Qwen3MoeDecoderLayer rule).
  bool layer_is_sparse(int64_t layer) const;
  // intermediate_size when some layer has a dense MLP, else 0: an all-sparse MoE config's intermediate_size
  // names no tensor, so nothing may be sized by it (issue 22: 4,194,304 made a 60-token prompt take 3 GB).
  int64_t dense_intermediate_size() const;
};

// Parses config.json text; `origin` names it in errors ("ckpt/config.json").
Result<ModelConfig> parse_config(std::string_view json_text, std::string_view origin);
// Reads <dir>/config.json.
Result<ModelConfig> read_config(const std::string& dir);

// Reads <dir>/hf_quant_config.json (ModelOpt's file); nullopt when the checkpoint has none.
Result<std::optional<nlohmann::json>> read_hf_quant_config(const std::string& dir);

// The loader's refusal of an architecture mxq has no forward for, naming it and the ones it has, or of the
// first of config.unsupported.
Status check_architecture(const ModelConfig& config);

// Parses JSON text with a nesting limit, naming `origin` on failure (shared with hf_quant_config.json).
Result<nlohmann::json> parse_json_text(std::string_view json_text, std::string_view origin);

}  // namespace mxq
