// Reads top to bottom like transformers' models/qwen3/modeling_qwen3.py and qwen3_moe/modeling_qwen3_moe.py;
// each step names the HF module it computes. Batched over the step's tokens and paged; the activations are
// the backend's (f32 on the CPU, where HF in float32 is the oracle).
#include "model/qwen3.h"

#include <fmt/format.h>

#include <algorithm>

namespace mxq {

// Activation buffers for up to `tokens` token rows and `samples` sampling rows, grown on demand and reused
// across steps.
struct Qwen3Model::Scratch {
  int64_t tokens = 0, samples = 0;
  Act residual, normed, q, k, v, q_rope, attn, hidden;  // residual f32
  Act gate, up, act;                                    // Qwen3MLP, [tokens, intermediate_size]
  Act router_logits, gate_up, expert_act, expert_out;   // MoE: f32 [tokens, E]; per entry 2I, I, H
  Act logits;                                           // f32 [samples, vocab]
};

Result<Qwen3Model> Qwen3Model::create(const ModelConfig& cfg, const WeightStore& store, Backend& backend) {
  auto w = bind_qwen3_weights(cfg, store);
  if (!w) return tl::unexpected(w.error());
  Qwen3Model m(cfg, backend);
  m.w_ = std::move(*w);
  m.scratch_ = std::make_shared<Scratch>();
  return m;
}

Status Qwen3Model::ensure_scratch(int64_t tokens, int64_t samples) {
  Scratch& s = *scratch_;
  Backend& b = *backend_;
  const ModelConfig& c = config_;
  Status st;
  auto alloc = [&](Act& a, ActType t, int64_t rows, int64_t width) {
    if (!st) return;
    auto r = b.alloc(t, rows, width);
    if (!r)
      st = tl::unexpected(r.error());
    else
      a = std::move(*r);
  };
  if (tokens > s.tokens) {
    const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                  kv = c.num_key_value_heads * c.head_dim, im = c.dense_intermediate_size();
    alloc(s.residual, ActType::kF32, tokens, h);
    alloc(s.normed, ActType::kAct, tokens, h);
    alloc(s.hidden, ActType::kAct, tokens, h);
    alloc(s.q, ActType::kAct, tokens, q);
    alloc(s.q_rope, ActType::kAct, tokens, q);
    alloc(s.attn, ActType::kAct, tokens, q);
    alloc(s.k, ActType::kAct, tokens, kv);
    alloc(s.v, ActType::kAct, tokens, kv);
    alloc(s.gate, ActType::kAct, tokens, im);
    alloc(s.up, ActType::kAct, tokens, im);
    alloc(s.act, ActType::kAct, tokens, im);
    if (c.is_moe()) {
      const int64_t entries = tokens * c.num_experts_per_tok, mi = c.moe_intermediate_size;
      alloc(s.router_logits, ActType::kF32, tokens, c.num_experts);
      alloc(s.gate_up, ActType::kAct, entries, 2 * mi);
      alloc(s.expert_act, ActType::kAct, entries, mi);
      alloc(s.expert_out, ActType::kAct, entries, h);
    }
    if (!st) return st;
    s.tokens = tokens;
  }
  if (samples > s.samples) {
    alloc(s.logits, ActType::kF32, samples, c.vocab_size);
    if (!st) return st;
    s.samples = samples;
  }
  return {};
}

Status Qwen3Model::step(KvPool& kv, const ForwardShape& shape, float* logits_host) {
  const ModelConfig& c = config_;
  Backend& b = *backend_;
  const StepMeta& m = kv.host_meta();
  const int64_t n = *m.num_tokens;
  if (n <= 0) return fail("step: no tokens to run");
  if (!shape.decode && static_cast<int64_t>(shape.sample_token_rows.size()) != shape.sample_rows)
    return fail("step: {} sampling rows, {} token rows named", shape.sample_rows,
                shape.sample_token_rows.size());
  // note: a decode step samples every row, padding rows of a CUDA graph bucket included (rows >= n there)
  if (shape.decode && shape.sample_rows != shape.rows)
    return fail("step: a decode step samples every row ({}), not {}", shape.rows, shape.sample_rows);
  if (auto st = ensure_scratch(std::max(n, shape.rows), shape.sample_rows); !st) return st;
  Scratch& s = *scratch_;
  const float eps = static_cast<float>(c.rms_norm_eps), theta = static_cast<float>(c.rope.theta);
  return b.run_step(kv, shape, [&]() -> Status {
    // model.embed_tokens
    if (auto st = b.embedding(*w_.embed_tokens, s.residual); !st) return st;
    // layers[0].input_layernorm (each later input_layernorm is fused with the residual add below)
    if (auto st = b.rms_norm(s.residual, *w_.layers[0].input_layernorm, eps, s.normed); !st) return st;

    for (size_t i = 0; i < w_.layers.size(); ++i) {
      const Qwen3LayerWeights& l = w_.layers[i];
      const int64_t layer = static_cast<int64_t>(i);
      // self_attn.q_proj / k_proj / v_proj
      const LinearPart qkv[] = {
          {l.q_proj, l.q_bias, &s.q}, {l.k_proj, l.k_bias, &s.k}, {l.v_proj, l.v_bias, &s.v}};
      if (auto st = b.linear_parts(s.normed, qkv); !st) return st;
      // self_attn.q_norm / k_norm, rotary_emb, past_key_values.update (into the pool at the step's slots)
      if (auto st = b.qk_norm_rope_cache(layer, s.q, s.k, s.v, *l.q_norm, *l.k_norm, eps, theta, s.q_rope);
          !st)
        return st;
      // eager_attention_forward over each sequence's blocks
      auto st = shape.decode ? b.paged_attention_decode(layer, s.q_rope, s.attn)
                             : b.attention_prefill(layer, s.q_rope, s.attn);
      if (!st) return st;
      // self_attn.o_proj
      if (auto st2 = b.linear(s.attn, *l.o_proj, l.o_bias, s.hidden); !st2) return st2;
      // residual add, post_attention_layernorm
      if (auto st2 = b.add_rms_norm(s.hidden, s.residual, *l.post_attention_layernorm, eps, s.normed); !st2)
        return st2;
      // mlp: Qwen3MoeSparseMoeBlock on sparse layers, Qwen3MLP otherwise (normed -> hidden)
      st = l.sparse ? sparse_moe_block(layer) : mlp(l);
      if (!st) return st;
      // residual add, then the next layer's input_layernorm or the final model.norm
      const QTensor& next_norm = i + 1 < w_.layers.size() ? *w_.layers[i + 1].input_layernorm : *w_.norm;
      if (auto st2 = b.add_rms_norm(s.hidden, s.residual, next_norm, eps, s.normed); !st2) return st2;
    }

    // lm_head on the sampling rows
    if (shape.sample_rows == 0) return Status{};
    if (auto st = b.lm_head(s.normed, *w_.lm_head, s.logits); !st) return st;
    return b.to_host(s.logits, shape.sample_rows, logits_host);
  });
}

// Qwen3MLP: down_proj(act_fn(gate_proj(x)) * up_proj(x))
Status Qwen3Model::mlp(const Qwen3LayerWeights& l) {
  Backend& b = *backend_;
  Scratch& s = *scratch_;
  const LinearPart gate_up[] = {{l.gate_proj, nullptr, &s.gate}, {l.up_proj, nullptr, &s.up}};
  if (auto st = b.linear_parts(s.normed, gate_up); !st) return st;
  if (auto st = b.swiglu(s.gate, s.up, s.act); !st) return st;
  return b.linear(s.act, *l.down_proj, nullptr, s.hidden);
}

// Qwen3MoeSparseMoeBlock: router over mlp.gate, then each selected expert on the tokens routed to it, its
// output scaled by the routing weight and summed in expert order (HF's index_add_ loop over expert_hit).
Status Qwen3Model::sparse_moe_block(int64_t layer) {
  Backend& b = *backend_;
  Scratch& s = *scratch_;
  const ModelConfig& c = config_;
  const Qwen3LayerWeights& l = w_.layers[static_cast<size_t>(layer)];
  const MoeExperts ex{.gate_up = l.gate_up_proj,
                      .down = l.experts_down_proj,
                      .gate = l.expert_gate,
                      .up = l.expert_up,
                      .down_each = l.expert_down};
  // mlp.gate (router logits, f32)
  if (auto st = b.linear_f32(s.normed, *l.router, s.router_logits); !st) return st;
  // softmax, topk, norm_topk_prob, and the grouping of the (token, choice) entries by expert
  if (auto st = b.moe_route(layer, s.router_logits, c.num_experts_per_tok, c.norm_topk_prob); !st) return st;
  // mlp.experts.gate_up_proj [E, 2I, H] / mlp.experts.<e>.gate_proj, up_proj, on each expert's tokens
  if (auto st = b.moe_grouped_linear(layer, ex, MoeProj::kGateUp, s.normed, s.gate_up); !st) return st;
  // act_fn(gate) * up
  if (auto st = b.moe_swiglu(layer, s.gate_up, s.expert_act); !st) return st;
  // mlp.experts.down_proj [E, H, I] / mlp.experts.<e>.down_proj
  if (auto st = b.moe_grouped_linear(layer, ex, MoeProj::kDown, s.expert_act, s.expert_out); !st) return st;
  // routing weights, summed per token in increasing expert id
  return b.moe_combine(layer, s.expert_out, s.hidden);
}

}  // namespace mxq
