#include "model/qwen3_weights.h"

#include <set>

namespace mxq {
namespace {

bool is_float_dtype(const std::string& d) { return d == "BF16" || d == "F16" || d == "F32"; }

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// Strips a trailing ".weight": the module name a scheme keys its quantized linears by.
std::string module_of(const std::string& name) {
  constexpr std::string_view kSuffix = ".weight";
  if (name.size() > kSuffix.size() && name.ends_with(kSuffix)) return name.substr(0, name.size() - kSuffix.size());
  return name;
}

}  // namespace

Result<std::vector<WeightSpec>> qwen3_weight_specs(const ModelConfig& cfg, bool stacked_experts) {
  const int64_t h = cfg.hidden_size, d = cfg.head_dim, q = cfg.num_attention_heads * d,
                kv = cfg.num_key_value_heads * d, v = cfg.vocab_size;
  std::vector<WeightSpec> s;
  s.push_back({"model.embed_tokens.weight", {v, h}, false});
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    s.push_back({p + "input_layernorm.weight", {h}, false});
    s.push_back({p + "post_attention_layernorm.weight", {h}, false});
    s.push_back({p + "self_attn.q_proj.weight", {q, h}, true});
    s.push_back({p + "self_attn.k_proj.weight", {kv, h}, true});
    s.push_back({p + "self_attn.v_proj.weight", {kv, h}, true});
    s.push_back({p + "self_attn.o_proj.weight", {h, q}, true});
    if (cfg.attention_bias) {
      s.push_back({p + "self_attn.q_proj.bias", {q}, false});
      s.push_back({p + "self_attn.k_proj.bias", {kv}, false});
      s.push_back({p + "self_attn.v_proj.bias", {kv}, false});
      s.push_back({p + "self_attn.o_proj.bias", {h}, false});
    }
    s.push_back({p + "self_attn.q_norm.weight", {d}, false});
    s.push_back({p + "self_attn.k_norm.weight", {d}, false});
    if (cfg.layer_is_sparse(i)) {
      const int64_t e = cfg.num_experts, im = cfg.moe_intermediate_size;
      s.push_back({p + "mlp.gate.weight", {e, h}, false});  // the router stays in its dtype
      if (stacked_experts) {
        s.push_back({p + "mlp.experts.gate_up_proj", {e, 2 * im, h}, true});
        s.push_back({p + "mlp.experts.down_proj", {e, h, im}, true});
      } else {
        for (int64_t x = 0; x < e; ++x) {
          const std::string ep = fmt::format("{}mlp.experts.{}.", p, x);
          s.push_back({ep + "gate_proj.weight", {im, h}, true});
          s.push_back({ep + "up_proj.weight", {im, h}, true});
          s.push_back({ep + "down_proj.weight", {h, im}, true});
        }
      }
    } else {
      const int64_t im = cfg.intermediate_size;
      s.push_back({p + "mlp.gate_proj.weight", {im, h}, true});
      s.push_back({p + "mlp.up_proj.weight", {im, h}, true});
      s.push_back({p + "mlp.down_proj.weight", {h, im}, true});
    }
  }
  s.push_back({"model.norm.weight", {h}, false});
  if (!cfg.tie_word_embeddings) s.push_back({"lm_head.weight", {v, h}, false});
  return s;
}

Result<std::vector<WeightSpec>> check_qwen3_tensors(const ModelConfig& cfg, const Scheme& scheme,
                                                   const TensorMetaMap& tensors) {
  bool stacked = false;
  for (const auto& [name, meta] : tensors)
    if (name.ends_with(".mlp.experts.gate_up_proj") || name.ends_with(".mlp.experts.gate_up_proj.weight"))
      stacked = true;
  auto specs = qwen3_weight_specs(cfg, stacked);
  if (!specs) return tl::unexpected(specs.error());

  std::set<std::string> used;
  for (const WeightSpec& w : *specs) {
    auto lin = w.linear ? scheme.linears.find(module_of(w.name)) : scheme.linears.end();
    if (lin != scheme.linears.end()) {
      // A quantized projection: the values plane carries the logical [.., N, K] (MXFP4 packs two per byte).
      const QuantizedLinear& ql = lin->second;
      if (ql.shape != w.shape)
        return fail("{}: logical shape {}, expected {} from config.json", ql.values, shape_str(ql.shape),
                    shape_str(w.shape));
      used.insert(ql.values);
      used.insert(ql.scales);
      continue;
    }
    auto t = tensors.find(w.name);
    if (t == tensors.end()) return fail("missing tensor '{}' (expected {} from config.json)", w.name, shape_str(w.shape));
    if (!is_float_dtype(t->second.dtype))
      return fail("{}: dtype {} without a quantization scheme for it, expected BF16, F16 or F32", w.name,
                  t->second.dtype);
    if (t->second.shape != w.shape)
      return fail("{}: shape {}, expected {} from config.json", w.name, shape_str(t->second.shape),
                  shape_str(w.shape));
    used.insert(w.name);
  }
  for (const auto& [name, meta] : tensors) {
    // note: tied checkpoints sometimes ship lm_head.weight anyway (transformers writes it for some models);
    // it is then ignored, as transformers ignores it.
    if (used.count(name) || (cfg.tie_word_embeddings && name == "lm_head.weight")) continue;
    return fail("unexpected tensor '{}' {} {} for {} (policy: refuse what the model does not use)", name,
                meta.dtype, shape_str(meta.shape), cfg.architecture);
  }
  return specs;
}

}  // namespace mxq
