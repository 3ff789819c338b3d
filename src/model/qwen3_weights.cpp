#include "model/qwen3_weights.h"

#include <set>

namespace mxq {
namespace {

bool is_float_dtype(const std::string& d) { return d == "BF16" || d == "F16" || d == "F32"; }

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// Strips a trailing ".weight": the module name a scheme keys its quantized linears by.
std::string module_of(const std::string& name) {
  constexpr std::string_view kSuffix = ".weight";
  if (name.size() > kSuffix.size() && name.ends_with(kSuffix))
    return name.substr(0, name.size() - kSuffix.size());
  return name;
}

// Calls f(spec, slot) for every tensor the config needs, in checkpoint order, where `slot` is the field of
// `w` that binds it: the one list of names that the checkpoint check and the binding share.
template <class F>
void for_each_weight(const ModelConfig& cfg, bool stacked_experts, Qwen3Weights& w, F&& f) {
  const int64_t h = cfg.hidden_size, d = cfg.head_dim, q = cfg.num_attention_heads * d,
                kv = cfg.num_key_value_heads * d, v = cfg.vocab_size;
  auto plain = [&](std::string name, std::vector<int64_t> shape, const QTensor*& slot) {
    f(WeightSpec{std::move(name), std::move(shape), false}, slot);
  };
  auto linear = [&](std::string name, std::vector<int64_t> shape, const QTensor*& slot) {
    f(WeightSpec{std::move(name), std::move(shape), true}, slot);
  };
  w.stacked_experts = stacked_experts;
  w.layers.assign(static_cast<size_t>(cfg.num_hidden_layers), {});
  plain("model.embed_tokens.weight", {v, h}, w.embed_tokens);
  for (int i = 0; i < cfg.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    Qwen3LayerWeights& l = w.layers[static_cast<size_t>(i)];
    plain(p + "input_layernorm.weight", {h}, l.input_layernorm);
    plain(p + "post_attention_layernorm.weight", {h}, l.post_attention_layernorm);
    linear(p + "self_attn.q_proj.weight", {q, h}, l.q_proj);
    linear(p + "self_attn.k_proj.weight", {kv, h}, l.k_proj);
    linear(p + "self_attn.v_proj.weight", {kv, h}, l.v_proj);
    linear(p + "self_attn.o_proj.weight", {h, q}, l.o_proj);
    if (cfg.attention_bias) {
      plain(p + "self_attn.q_proj.bias", {q}, l.q_bias);
      plain(p + "self_attn.k_proj.bias", {kv}, l.k_bias);
      plain(p + "self_attn.v_proj.bias", {kv}, l.v_bias);
      plain(p + "self_attn.o_proj.bias", {h}, l.o_bias);
    }
    plain(p + "self_attn.q_norm.weight", {d}, l.q_norm);
    plain(p + "self_attn.k_norm.weight", {d}, l.k_norm);
    l.sparse = cfg.layer_is_sparse(i);
    if (l.sparse) {
      const int64_t e = cfg.num_experts, im = cfg.moe_intermediate_size;
      plain(p + "mlp.gate.weight", {e, h}, l.router);  // the router stays in its dtype
      if (stacked_experts) {
        linear(p + "mlp.experts.gate_up_proj", {e, 2 * im, h}, l.gate_up_proj);
        linear(p + "mlp.experts.down_proj", {e, h, im}, l.experts_down_proj);
      } else {
        l.expert_gate.assign(static_cast<size_t>(e), nullptr);
        l.expert_up.assign(static_cast<size_t>(e), nullptr);
        l.expert_down.assign(static_cast<size_t>(e), nullptr);
        for (size_t x = 0; x < static_cast<size_t>(e); ++x) {
          const std::string ep = fmt::format("{}mlp.experts.{}.", p, x);
          linear(ep + "gate_proj.weight", {im, h}, l.expert_gate[x]);
          linear(ep + "up_proj.weight", {im, h}, l.expert_up[x]);
          linear(ep + "down_proj.weight", {h, im}, l.expert_down[x]);
        }
      }
    } else {
      const int64_t im = cfg.intermediate_size;
      linear(p + "mlp.gate_proj.weight", {im, h}, l.gate_proj);
      linear(p + "mlp.up_proj.weight", {im, h}, l.up_proj);
      linear(p + "mlp.down_proj.weight", {h, im}, l.down_proj);
    }
  }
  plain("model.norm.weight", {h}, w.norm);
  // note: tied checkpoints reuse the embedding matrix as lm_head (HF tie_word_embeddings).
  if (cfg.tie_word_embeddings)
    w.lm_head = w.embed_tokens;
  else
    plain("lm_head.weight", {v, h}, w.lm_head);
}

}  // namespace

Result<std::vector<WeightSpec>> qwen3_weight_specs(const ModelConfig& cfg, bool stacked_experts) {
  std::vector<WeightSpec> s;
  Qwen3Weights unbound;
  for_each_weight(cfg, stacked_experts, unbound,
                  [&](WeightSpec spec, const QTensor*&) { s.push_back(spec); });
  return s;
}

Status check_qwen3_config(const ModelConfig& cfg) {
  if (cfg.architecture != "Qwen3ForCausalLM" && cfg.architecture != "Qwen3MoeForCausalLM")
    return fail("architecture '{}' is not supported (expected Qwen3ForCausalLM or Qwen3MoeForCausalLM)",
                cfg.architecture);
  if (cfg.rope.type != "default")
    return fail("{}: rope_type '{}' is not supported (expected 'default')", cfg.architecture, cfg.rope.type);
  if (cfg.num_key_value_heads <= 0 || cfg.num_attention_heads % cfg.num_key_value_heads != 0)
    return fail("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", cfg.architecture,
                cfg.num_attention_heads, cfg.num_key_value_heads);
  if (cfg.is_moe() && (cfg.num_experts_per_tok < 1 || cfg.num_experts_per_tok > cfg.num_experts))
    return fail("{}: num_experts_per_tok {} outside [1, num_experts = {}]", cfg.architecture,
                cfg.num_experts_per_tok, cfg.num_experts);
  return {};
}

Result<Qwen3Weights> bind_qwen3_weights(const ModelConfig& cfg, const WeightStore& store) {
  if (auto st = check_qwen3_config(cfg); !st) return tl::unexpected(st.error());
  bool stacked = false;
  for (int i = 0; i < cfg.num_hidden_layers; ++i)
    if (cfg.layer_is_sparse(i)) {
      stacked = store.find(fmt::format("model.layers.{}.mlp.experts.gate_up_proj", i)) != nullptr;
      break;
    }
  Qwen3Weights w;
  std::string missing;
  for_each_weight(cfg, stacked, w, [&](const WeightSpec& spec, const QTensor*& slot) {
    slot = store.find(spec.name);
    if (!slot && missing.empty()) missing = spec.name;
  });
  if (!missing.empty()) return fail("{}: weight '{}' is not in the weight store", cfg.architecture, missing);
  return w;
}

Result<std::vector<WeightSpec>> check_qwen3_tensors(const ModelConfig& cfg, const Scheme& scheme,
                                                    const TensorMetaMap& tensors) {
  // Stacked experts, plain ("<p>.mlp.experts.gate_up_proj") or quantized ("...gate_up_proj.weight_packed",
  // "...gate_up_proj.weight" + scale, as `mxq quantize` writes them).
  bool stacked = false;
  for (const auto& [name, meta] : tensors)
    if (name.find(".mlp.experts.gate_up_proj") != std::string::npos) stacked = true;
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
    if (t == tensors.end())
      return fail("missing tensor '{}' (expected {} from config.json)", w.name, shape_str(w.shape));
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
