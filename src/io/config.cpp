#include "io/config.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>

#include "base/regular_file.h"
#include "io/safetensors.h"

namespace mxq {
namespace {

using json = nlohmann::json;

// note: config.json is a few KB; 16 MB and depth 64 are far above any real one and bound a hostile file.
constexpr size_t kMaxConfigBytes = size_t{16} << 20;
constexpr int kMaxJsonDepth = 64;

// note: every size is later used as int32 by kernels (G-06): 2^31-1 caps each field; tighter caps where a
// larger value could only be a corrupt file (layers, heads, experts).
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// One row per integer key: where it lands in ModelConfig, whether transformers would fall back to a default,
// and the range outside of which the file is corrupt rather than merely unusual.
struct IntField {
  const char* key;
  int64_t ModelConfig::*dst;
  bool required;
  int64_t min;
  int64_t max;
};

constexpr IntField kDenseFields[] = {
    {"hidden_size", &ModelConfig::hidden_size, true, 1, 1 << 20},
    {"intermediate_size", &ModelConfig::intermediate_size, true, 1, 1 << 22},
    {"num_hidden_layers", &ModelConfig::num_hidden_layers, true, 1, 4096},
    {"num_attention_heads", &ModelConfig::num_attention_heads, true, 1, 4096},
    {"vocab_size", &ModelConfig::vocab_size, true, 1, 1 << 24},
    {"max_position_embeddings", &ModelConfig::max_position_embeddings, true, 1, kInt32Max},
};
constexpr IntField kMoeFields[] = {
    {"num_experts_per_tok", &ModelConfig::num_experts_per_tok, true, 1, 4096},
    {"moe_intermediate_size", &ModelConfig::moe_intermediate_size, true, 1, 1 << 22},
    {"decoder_sparse_step", &ModelConfig::decoder_sparse_step, false, 1, 4096},
};

std::string_view type_name(const json& v) { return v.type_name(); }

// nlohmann keeps non-negative integers as number_unsigned and negative ones as number_integer; a value past
// u64 parses as a float. Each is checked before any cast so no size reaches int64 through a narrowing.

// Integer JSON value in [min, max]; floats (even 64.0), strings and out-of-range values are named errors.
Result<int64_t> get_int(const json& v, std::string_view key, int64_t min, int64_t max) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(max))
      return fail("{}: expected an integer in [{}, {}], got {}", key, min, max, u);
    const auto i = static_cast<int64_t>(u);
    if (i < min) return fail("{}: expected an integer in [{}, {}], got {}", key, min, max, i);
    return i;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < min || i > max) return fail("{}: expected an integer in [{}, {}], got {}", key, min, max, i);
    return i;
  }
  return fail("{}: expected an integer, got {} {}", key, type_name(v), printable(v.dump()));
}

// eps and theta: JSON floats or ints; NaN cannot be written in JSON but 1e400 parses to inf.
Result<double> get_positive_number(const json& v, std::string_view key) {
  if (!v.is_number()) return fail("{}: expected a number, got {}", key, type_name(v));
  const double d = v.get<double>();
  if (!std::isfinite(d) || d <= 0)
    return fail("{}: expected a positive finite number, got {}", key, printable(v.dump()));
  return d;
}

// null means "use transformers' default", as PreTrainedConfig treats an explicit None.
Result<bool> get_bool(const json& obj, const char* key, bool fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return fail("{}: expected true/false, got {}", key, type_name(*it));
  return it->get<bool>();
}

Result<std::string> get_string(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::string();
  if (!it->is_string()) return fail("{}: expected a string, got {}", key, type_name(*it));
  return it->get<std::string>();
}

// bos/eos_token_id: null, an int, or a list of ints (transformers' `int | list[int] | None`).
Result<std::vector<int64_t>> get_token_ids(const json& obj, const char* key, int64_t vocab) {
  std::vector<int64_t> ids;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return ids;
  auto add = [&](const json& v) -> Status {
    auto id = get_int(v, key, 0, vocab - 1);
    if (!id) return tl::unexpected(id.error());
    ids.push_back(*id);
    return {};
  };
  if (it->is_array()) {
    if (it->size() > 1024) return fail("{}: expected at most 1024 ids, got {}", key, it->size());
    for (const json& v : *it)
      if (auto s = add(v); !s) return tl::unexpected(s.error());
  } else if (auto s = add(*it); !s) {
    return tl::unexpected(s.error());
  }
  return ids;
}

Status read_int_fields(const json& obj, std::span<const IntField> fields, ModelConfig& cfg) {
  for (const IntField& f : fields) {
    auto it = obj.find(f.key);
    if (it == obj.end() || it->is_null()) {
      if (f.required) return fail("missing required key \"{}\"", f.key);
      continue;
    }
    auto v = get_int(*it, f.key, f.min, f.max);
    if (!v) return tl::unexpected(v.error());
    cfg.*f.dst = *v;
  }
  return {};
}

// transformers 5 keeps RoPE in rope_parameters; older files have rope_theta at top level and rope_scaling.
// Priority as in transformers' RotaryEmbeddingConfigMixin.convert_rope_params_to_dict: rope_scaling, then
// rope_parameters; theta from that dict, else top-level rope_theta, else 10000.
Status read_rope(const json& obj, ModelConfig& cfg) {
  const json* params = nullptr;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) continue;
    if (!it->is_object()) return fail("{}: expected an object, got {}", key, type_name(*it));
    params = &*it;
    break;
  }
  if (auto it = obj.find("rope_theta"); it != obj.end() && !it->is_null()) {
    auto theta = get_positive_number(*it, "rope_theta");
    if (!theta) return tl::unexpected(theta.error());
    cfg.rope.theta = *theta;
  }
  if (params == nullptr) return {};
  cfg.rope.parameters = *params;
  if (auto it = params->find("rope_theta"); it != params->end() && !it->is_null()) {
    auto theta = get_positive_number(*it, "rope_parameters.rope_theta");
    if (!theta) return tl::unexpected(theta.error());
    cfg.rope.theta = *theta;
  }
  for (const char* key : {"rope_type", "type"}) {
    auto it = params->find(key);
    if (it == params->end() || it->is_null()) continue;
    if (!it->is_string()) return fail("rope_parameters.{}: expected a string, got {}", key, type_name(*it));
    cfg.rope.type = it->get<std::string>();
    break;
  }
  return {};
}

// remember every pointer to checkpoint code so the caller can show it; nothing here is executed.
void record_remote_code(const json& obj, std::string_view prefix, std::vector<std::string>& refs) {
  for (const char* key : {"auto_map", "trust_remote_code", "custom_pipelines"}) {
    auto it = obj.find(key);
    if (it == obj.end()) continue;
    if (it->is_object()) {
      for (const auto& [k, v] : it->items())
        refs.push_back(fmt::format("{}{}.{}={}", prefix, key, printable(k), printable(v.dump())));
    } else {
      refs.push_back(fmt::format("{}{}={}", prefix, key, printable(it->dump())));
    }
  }
}

// ModelConfig::unsupported. note: transformers 5's Qwen3Config writes layer_types for every model (all
// "full_attention" unless use_sliding_window), and sliding_window alone does nothing without
// use_sliding_window, as in the HF modelling code.
Status record_unsupported(const json& obj, ModelConfig& cfg) {
  auto act = get_string(obj, "hidden_act");
  if (!act) return tl::unexpected(act.error());
  if (!act->empty() && *act != "silu")
    cfg.unsupported.push_back(
        fmt::format("hidden_act \"{}\": the MLP runs SwiGLU with silu only", printable(act->substr(0, 64))));
  auto sliding = get_bool(obj, "use_sliding_window", false);
  if (!sliding) return tl::unexpected(sliding.error());
  if (*sliding) cfg.unsupported.push_back("use_sliding_window true: sliding-window attention is not implemented");
  if (auto it = obj.find("layer_types"); it != obj.end() && !it->is_null()) {
    if (!it->is_array()) return fail("layer_types: expected a list of strings, got {}", type_name(*it));
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      if (!t.is_string()) return fail("layer_types[{}]: expected a string, got {}", i, type_name(t));
      if (t.get<std::string>() != "full_attention") {
        cfg.unsupported.push_back(fmt::format("layer_types[{}] \"{}\": only full_attention is implemented", i,
                                              printable(t.get<std::string>().substr(0, 64))));
        break;
      }
    }
  }
  // note: inspect parsed yarn / linear RoPE that generate then refused; both refuse it here now. The CPU
  // and CUDA rope take only theta (cuda: an inv_freq table from it), with no attention_factor.
  if (cfg.rope.type != "default")
    cfg.unsupported.push_back(fmt::format(
        "rope_parameters.rope_type \"{}\" is not supported (expected \"default\"): mxq implements plain RoPE "
        "only, no yarn / linear / dynamic scaling",
        printable(cfg.rope.type.substr(0, 64))));
  if (cfg.quantization_config.is_object())
    if (auto it = cfg.quantization_config.find("kv_cache_scheme");
        it != cfg.quantization_config.end() && !it->is_null())
      cfg.unsupported.push_back("quantization_config.kv_cache_scheme: a quantized KV cache is not implemented");
  return {};
}

// Cross-field checks the modelling code relies on: GQA groups whole heads, RoPE rotates pairs, the router
// picks at most every expert.
Status check_shapes(const ModelConfig& c) {
  if (c.num_key_value_heads > c.num_attention_heads || c.num_attention_heads % c.num_key_value_heads != 0)
    return fail("num_attention_heads {} must be a multiple of num_key_value_heads {}", c.num_attention_heads,
                c.num_key_value_heads);
  // note: q_proj is [heads*head_dim, hidden]; its row count must fit int32 like every other size.
  if (c.num_attention_heads * c.head_dim > kInt32Max)
    return fail("num_attention_heads {} x head_dim {} exceeds 2^31-1", c.num_attention_heads, c.head_dim);
  if (c.head_dim < 2) return fail("head_dim: expected at least 2, got {}", c.head_dim);
  if (c.head_dim % 2 != 0)
    return fail("head_dim: expected an even number (RoPE rotates pairs), got {}", c.head_dim);
  if (c.is_moe()) {
    if (c.num_experts_per_tok > c.num_experts)
      return fail("num_experts_per_tok {} exceeds num_experts {}", c.num_experts_per_tok, c.num_experts);
    for (int64_t layer : c.mlp_only_layers)
      if (layer >= c.num_hidden_layers)
        return fail("mlp_only_layers: layer {} is not below num_hidden_layers {}", layer,
                    c.num_hidden_layers);
  }
  return {};
}

Result<ModelConfig> parse_object(const json& obj) {
  if (!obj.is_object()) return fail("expected a JSON object at top level, got {}", type_name(obj));
  ModelConfig cfg;
  if (auto it = obj.find("architectures"); it != obj.end() && !it->is_null()) {
    if (!it->is_array() || it->empty() || !(*it)[0].is_string())
      return fail("architectures: expected a non-empty list of strings, got {}", it->dump().substr(0, 80));
    cfg.architecture = (*it)[0].get<std::string>();
  }
  auto model_type = get_string(obj, "model_type");
  if (!model_type) return tl::unexpected(model_type.error());
  cfg.model_type = *model_type;
  if (cfg.architecture.empty() && cfg.model_type.empty())
    return fail("missing both \"architectures\" and \"model_type\"");
  // note: PretrainedConfig.save_pretrained writes no "architectures"; transformers' Auto classes resolve the
  // class from model_type, and so does mxq for the two it runs.
  if (cfg.architecture.empty() && cfg.model_type == "qwen3") cfg.architecture = "Qwen3ForCausalLM";
  if (cfg.architecture.empty() && cfg.model_type == "qwen3_moe") cfg.architecture = "Qwen3MoeForCausalLM";
  cfg.architecture_known =
      cfg.architecture == "Qwen3ForCausalLM" || cfg.architecture == "Qwen3MoeForCausalLM";

  if (auto s = read_int_fields(obj, kDenseFields, cfg); !s) return tl::unexpected(s.error());
  cfg.num_key_value_heads = cfg.num_attention_heads;  // transformers' default when the key is absent (MHA)
  if (auto it = obj.find("num_key_value_heads"); it != obj.end() && !it->is_null()) {
    auto v = get_int(*it, "num_key_value_heads", 1, 4096);
    if (!v) return tl::unexpected(v.error());
    cfg.num_key_value_heads = *v;
  }
  // note: Qwen3Config declares head_dim = 128 when config.json omits it; Qwen3MoeConfig has no such field
  // and the modelling code falls back to hidden_size / num_attention_heads.
  cfg.head_dim = cfg.model_type == "qwen3" ? 128 : cfg.hidden_size / cfg.num_attention_heads;
  if (auto it = obj.find("head_dim"); it != obj.end() && !it->is_null()) {
    auto v = get_int(*it, "head_dim", 1, 1 << 16);
    if (!v) return tl::unexpected(v.error());
    cfg.head_dim = *v;
  } else if (cfg.model_type != "qwen3" && cfg.hidden_size % cfg.num_attention_heads != 0) {
    return fail("hidden_size {} is not a multiple of num_attention_heads {} and head_dim is absent",
                cfg.hidden_size, cfg.num_attention_heads);
  }
  if (auto it = obj.find("rms_norm_eps"); it != obj.end() && !it->is_null()) {
    auto eps = get_positive_number(*it, "rms_norm_eps");
    if (!eps) return tl::unexpected(eps.error());
    cfg.rms_norm_eps = *eps;
  }
  if (auto s = read_rope(obj, cfg); !s) return tl::unexpected(s.error());
  auto tie = get_bool(obj, "tie_word_embeddings", false);
  auto bias = get_bool(obj, "attention_bias", false);
  if (!tie) return tl::unexpected(tie.error());
  if (!bias) return tl::unexpected(bias.error());
  cfg.tie_word_embeddings = *tie;
  cfg.attention_bias = *bias;
  // transformers 5 writes "dtype", 4.x wrote "torch_dtype"; the newer key wins when both are present.
  for (const char* key : {"dtype", "torch_dtype"}) {
    auto d = get_string(obj, key);
    if (!d) return tl::unexpected(d.error());
    if (!d->empty()) {
      cfg.dtype = *d;
      break;
    }
  }
  auto bos = get_token_ids(obj, "bos_token_id", cfg.vocab_size);
  auto eos = get_token_ids(obj, "eos_token_id", cfg.vocab_size);
  if (!bos) return tl::unexpected(bos.error());
  if (!eos) return tl::unexpected(eos.error());
  cfg.bos_token_ids = std::move(*bos);
  cfg.eos_token_ids = std::move(*eos);

  // Qwen3MoeConfig 5.x stores num_local_experts (attribute_map aliases num_experts); 4.x files say
  // num_experts.
  for (const char* key : {"num_experts", "num_local_experts"}) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) continue;
    auto v = get_int(*it, key, 0, 1 << 16);
    if (!v) return tl::unexpected(v.error());
    cfg.num_experts = *v;
    break;
  }
  if (cfg.is_moe()) {
    if (auto s = read_int_fields(obj, kMoeFields, cfg); !s) return tl::unexpected(s.error());
    auto norm = get_bool(obj, "norm_topk_prob", false);
    if (!norm) return tl::unexpected(norm.error());
    cfg.norm_topk_prob = *norm;
    if (auto it = obj.find("mlp_only_layers"); it != obj.end() && !it->is_null()) {
      if (!it->is_array())
        return fail("mlp_only_layers: expected a list of layer indices, got {}", type_name(*it));
      for (const json& v : *it) {
        auto layer = get_int(v, "mlp_only_layers[]", 0, 4095);
        if (!layer) return tl::unexpected(layer.error());
        cfg.mlp_only_layers.push_back(*layer);
      }
    }
  } else if (cfg.model_type == "qwen3_moe" || cfg.architecture == "Qwen3MoeForCausalLM") {
    return fail("missing required key \"num_experts\" (or \"num_local_experts\") for {}", cfg.architecture);
  }
  if (auto s = check_shapes(cfg); !s) return tl::unexpected(s.error());

  // Multimodal wrappers nest the language model's config (and its quantization_config) under text_config;
  // the vt engine and vLLM look there after the top level.
  const json* text_config = nullptr;
  if (auto it = obj.find("text_config"); it != obj.end() && it->is_object()) text_config = &*it;
  for (const json* where : {&obj, text_config}) {
    if (where == nullptr) continue;
    auto it = where->find("quantization_config");
    if (it == where->end() || it->is_null()) continue;
    if (!it->is_object()) return fail("quantization_config: expected an object, got {}", type_name(*it));
    cfg.quantization_config = *it;
    break;
  }
  record_remote_code(obj, "", cfg.remote_code_refs);
  if (text_config != nullptr) record_remote_code(*text_config, "text_config.", cfg.remote_code_refs);
  if (auto s = record_unsupported(obj, cfg); !s) return tl::unexpected(s.error());
  return cfg;
}

}  // namespace

int64_t ModelConfig::dense_intermediate_size() const {
  for (int64_t l = 0; l < num_hidden_layers; ++l)
    if (!layer_is_sparse(l)) return intermediate_size;
  return 0;
}

bool ModelConfig::layer_is_sparse(int64_t layer) const {
  if (!is_moe()) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

Status check_architecture(const ModelConfig& config) {
  if (config.architecture_known && !config.unsupported.empty()) return fail("{}", config.unsupported.front());
  if (config.architecture_known) return {};
  return fail(
      "architecture \"{}\" (model_type \"{}\") is not supported; mxq runs Qwen3ForCausalLM and "
      "Qwen3MoeForCausalLM",
      printable(config.architecture), printable(config.model_type));
}

Result<json> parse_json_text(std::string_view json_text, std::string_view origin) {
  if (json_text.size() > kMaxConfigBytes)
    return fail("{}: expected at most {} bytes of JSON, got {}", origin, kMaxConfigBytes, json_text.size());
  bool too_deep = false;
  // note: the callback sees every value with its depth; rejecting past the limit keeps a hostile nest from
  // building a deep tree (nlohmann's parser itself is iterative).
  json::parser_callback_t depth_guard = [&too_deep](int depth, json::parse_event_t, json&) {
    if (depth > kMaxJsonDepth) too_deep = true;
    return !too_deep;
  };
  json parsed;
  try {
    parsed = json::parse(json_text.begin(), json_text.end(), depth_guard);
  } catch (const json::exception& e) {
    return fail("{}: invalid JSON: {}", origin, e.what());
  }
  if (too_deep) return fail("{}: JSON nested deeper than {} levels", origin, kMaxJsonDepth);
  return parsed;
}

Result<ModelConfig> parse_config(std::string_view json_text, std::string_view origin) {
  auto parsed = parse_json_text(json_text, origin);
  if (!parsed) return tl::unexpected(parsed.error());
  auto cfg = parse_object(*parsed);
  if (!cfg) return fail_in(origin, cfg.error());
  if (!cfg->remote_code_refs.empty())
    spdlog::warn("{}: references checkpoint code ({}); mxq never executes checkpoint code and ignores it",
                 origin, fmt::join(cfg->remote_code_refs, ", "));
  return cfg;
}

// note: regular files only, with a running size check, so a multi-GB "config.json", a FIFO or /dev/zero is
// refused without being loaded (base/regular_file.h).
static Result<std::optional<std::string>> read_small_file(const std::string& path) {
  return read_regular_file(path, kMaxConfigBytes);
}

Result<ModelConfig> read_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  auto text = read_small_file(path);
  if (!text) return tl::unexpected(text.error());
  if (!*text) return fail("{}: missing", path);
  return parse_config(**text, path);
}

Result<std::optional<json>> read_hf_quant_config(const std::string& dir) {
  const std::string path = dir + "/hf_quant_config.json";
  auto text = read_small_file(path);
  if (!text) return tl::unexpected(text.error());
  if (!*text) return std::optional<json>();
  auto parsed = parse_json_text(**text, path);
  if (!parsed) return tl::unexpected(parsed.error());
  return std::optional<json>(std::move(*parsed));
}

}  // namespace mxq
