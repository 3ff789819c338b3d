// Reads top to bottom like transformers' models/qwen3/modeling_qwen3.py and qwen3_moe/modeling_qwen3_moe.py;
// each step names the HF module it computes. All activations are f32 (HF in float32 is the oracle).
#include "model/qwen3.h"

#include <fmt/format.h>

namespace mxq {

// Activation buffers for up to `tokens` positions, grown on demand and reused across calls.
struct Qwen3Model::Scratch {
  int64_t tokens = 0;
  BackendBuffer<float> residual, normed, q, k, v, q_rope, attn, hidden, logits;
  BackendBuffer<float> gate, up, act;              // Qwen3MLP, [tokens, intermediate_size]
  BackendBuffer<float> router_logits, xe, gu, ye;  // MoE: [tokens, E], [tokens, H], [tokens, 2I], [tokens, H]
  std::vector<int32_t> expert_ids;                 // host, [tokens, top_k]
  std::vector<float> expert_weights;
  std::vector<int64_t> rows;  // host: token rows routed to one expert
  std::vector<float> row_weights;
  std::vector<int64_t> positions;
};

Result<Qwen3Model> Qwen3Model::create(const ModelConfig& cfg, const WeightStore& store, Backend& backend) {
  auto w = bind_qwen3_weights(cfg, store);
  if (!w) return tl::unexpected(w.error());
  Qwen3Model m(cfg, backend);
  m.w_ = std::move(*w);
  m.scratch_ = std::make_shared<Scratch>();
  return m;
}

Status Qwen3Model::ensure_scratch(int64_t tokens) {
  Scratch& s = *scratch_;
  if (tokens <= s.tokens) return {};
  Backend& b = *backend_;
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim;
  s.residual = b.alloc_f32(tokens * h);
  s.normed = b.alloc_f32(tokens * h);
  s.hidden = b.alloc_f32(tokens * h);
  s.q = b.alloc_f32(tokens * q);
  s.q_rope = b.alloc_f32(tokens * q);
  s.attn = b.alloc_f32(tokens * q);
  s.k = b.alloc_f32(tokens * kv);
  s.v = b.alloc_f32(tokens * kv);
  s.logits = b.alloc_f32(c.vocab_size);
  const int64_t dense_im = c.dense_intermediate_size();
  s.gate = b.alloc_f32(tokens * dense_im);
  s.up = b.alloc_f32(tokens * dense_im);
  s.act = b.alloc_f32(tokens * std::max(dense_im, c.moe_intermediate_size));
  if (c.is_moe()) {
    s.router_logits = b.alloc_f32(tokens * c.num_experts);
    s.xe = b.alloc_f32(tokens * h);
    s.gu = b.alloc_f32(tokens * 2 * c.moe_intermediate_size);
    s.ye = b.alloc_f32(tokens * h);
  }
  s.tokens = tokens;
  return {};
}

Status Qwen3Model::forward(std::span<const int32_t> ids, SequenceKv& kv, float* logits_host) {
  const ModelConfig& c = config_;
  Backend& b = *backend_;
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n == 0) return fail("forward: no tokens to run");
  if (kv.length + n > kv.capacity)
    return fail("forward: {} cached + {} new tokens exceed the KV cache capacity of {} positions", kv.length,
                n, kv.capacity);
  if (static_cast<int64_t>(kv.k.size()) != c.num_hidden_layers || kv.v.size() != kv.k.size())
    return fail("forward: KV cache has {} layers, the model {}", kv.k.size(), c.num_hidden_layers);
  if (auto st = ensure_scratch(n); !st) return st;
  Scratch& s = *scratch_;
  const int64_t H = c.hidden_size, D = c.head_dim, NH = c.num_attention_heads, KVH = c.num_key_value_heads;
  const float eps = static_cast<float>(c.rms_norm_eps), theta = static_cast<float>(c.rope.theta);
  s.positions.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) s.positions[t] = kv.length + t;

  // model.embed_tokens
  if (auto st = b.embedding(ids.data(), n, *w_.embed_tokens, s.residual.get()); !st) return st;
  auto st = layers(n, [&](size_t i) -> Status {
    // self_attn.q_norm / k_norm (per head, before RoPE)
    b.head_rms_norm(s.q.get(), n, NH, D, *w_.layers[i].q_norm, eps);
    b.head_rms_norm(s.k.get(), n, KVH, D, *w_.layers[i].k_norm, eps);
    // rotary_emb + apply_rotary_pos_emb
    if (auto st = b.rope(s.q.get(), n, NH, D, s.positions.data(), theta); !st) return st;
    if (auto st = b.rope(s.k.get(), n, KVH, D, s.positions.data(), theta); !st) return st;
    // past_key_values.update: append this step's K/V at positions kv.length ..
    b.copy(s.k.get(), n * KVH * D, kv.k[i] + kv.length * KVH * D);
    b.copy(s.v.get(), n * KVH * D, kv.v[i] + kv.length * KVH * D);
    // eager_attention_forward (causal, GQA via repeat_kv, scaling head_dim^-0.5)
    return b.attention(s.q.get(), n, NH, kv.k[i], kv.v[i], kv.length + n, KVH, D, s.attn.get());
  });
  if (!st) return st;
  kv.length += n;

  // lm_head, on the last position only (generation needs no other logits)
  if (auto st = b.linear(s.normed.get() + (n - 1) * H, 1, *w_.lm_head, -1, nullptr, s.logits.get()); !st)
    return st;
  b.to_host(s.logits.get(), c.vocab_size, logits_host);
  return {};
}

Status Qwen3Model::step(const ForwardShape& shape, float* logits_host) {
  const ModelConfig& c = config_;
  Backend& b = *backend_;
  const StepMeta& m = b.host_meta();
  const int64_t n = *m.num_tokens;
  if (n <= 0) return fail("step: no tokens to run");
  if (!shape.decode && static_cast<int64_t>(shape.sample_token_rows.size()) != shape.sample_rows)
    return fail("step: {} sampling rows, {} token rows named", shape.sample_rows,
                shape.sample_token_rows.size());
  if (shape.decode && shape.sample_rows != n)
    return fail("step: a decode step samples every row ({}), not {}", n, shape.sample_rows);
  if (auto st = ensure_scratch(n); !st) return st;
  Scratch& s = *scratch_;
  const int64_t H = c.hidden_size, NH = c.num_attention_heads;
  const float eps = static_cast<float>(c.rms_norm_eps), theta = static_cast<float>(c.rope.theta);
  return b.run_step(shape, [&]() -> Status {
    // model.embed_tokens
    if (auto st = b.embedding(m.ids, n, *w_.embed_tokens, s.residual.get()); !st) return st;
    auto st = layers(n, [&](size_t i) -> Status {
      const Qwen3LayerWeights& l = w_.layers[i];
      // q_norm / k_norm, rotary_emb, past_key_values.update (into the pool at the step's slots)
      const int64_t layer = static_cast<int64_t>(i);
      if (auto st = b.qk_norm_rope_cache(layer, s.q.get(), s.k.get(), s.v.get(), NH, *l.q_norm, *l.k_norm,
                                         eps, theta, s.q_rope.get());
          !st)
        return st;
      // eager_attention_forward over each sequence's blocks
      return shape.decode ? b.paged_attention_decode(layer, s.q_rope.get(), NH, s.attn.get())
                          : b.attention_prefill(layer, s.q_rope.get(), NH, s.attn.get());
    });
    if (!st) return st;
    // lm_head on the sampling rows. note: one row at a time; the CPU linear sums a row alike at any M
    for (int32_t r = 0; r < shape.sample_rows; ++r) {
      const int64_t row = shape.decode ? r : shape.sample_token_rows[r];
      if (row < 0 || row >= n) return fail("step: sampling row {} names token row {} of {}", r, row, n);
      if (auto st = b.linear(s.normed.get() + row * H, 1, *w_.lm_head, -1, nullptr, s.logits.get()); !st)
        return st;
      b.to_host(s.logits.get(), c.vocab_size, logits_host + r * c.vocab_size);
    }
    return {};
  });
}

Status Qwen3Model::layers(int64_t n, const std::function<Status(size_t)>& attend) {
  const ModelConfig& c = config_;
  Backend& b = *backend_;
  Scratch& s = *scratch_;
  const int64_t H = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // layers[0].input_layernorm (each later input_layernorm is fused with the residual add below)
  b.rms_norm(s.residual.get(), n, H, *w_.layers[0].input_layernorm, eps, s.normed.get());

  for (size_t i = 0; i < w_.layers.size(); ++i) {
    const Qwen3LayerWeights& l = w_.layers[i];
    // self_attn.q_proj / k_proj / v_proj
    if (auto st = b.linear(s.normed.get(), n, *l.q_proj, -1, l.q_bias, s.q.get()); !st) return st;
    if (auto st = b.linear(s.normed.get(), n, *l.k_proj, -1, l.k_bias, s.k.get()); !st) return st;
    if (auto st = b.linear(s.normed.get(), n, *l.v_proj, -1, l.v_bias, s.v.get()); !st) return st;
    if (auto st = attend(i); !st) return st;
    // self_attn.o_proj
    if (auto st = b.linear(s.attn.get(), n, *l.o_proj, -1, l.o_bias, s.hidden.get()); !st) return st;
    // residual add, post_attention_layernorm
    b.add_rms_norm(s.hidden.get(), s.residual.get(), n, H, *l.post_attention_layernorm, eps, s.normed.get());
    // mlp: Qwen3MoeSparseMoeBlock on sparse layers, Qwen3MLP otherwise
    auto st = l.sparse ? sparse_moe_block(l, n, s.normed.get(), s.hidden.get())
                       : mlp(l, n, s.normed.get(), s.hidden.get());
    if (!st) return st;
    // residual add, then the next layer's input_layernorm or the final model.norm
    const QTensor& next_norm = i + 1 < w_.layers.size() ? *w_.layers[i + 1].input_layernorm : *w_.norm;
    b.add_rms_norm(s.hidden.get(), s.residual.get(), n, H, next_norm, eps, s.normed.get());
  }
  return {};
}

// Qwen3MLP: down_proj(act_fn(gate_proj(x)) * up_proj(x))
Status Qwen3Model::mlp(const Qwen3LayerWeights& l, int64_t n, const float* x, float* out) {
  Backend& b = *backend_;
  Scratch& s = *scratch_;
  const int64_t im = config_.intermediate_size;
  if (auto st = b.linear(x, n, *l.gate_proj, -1, nullptr, s.gate.get()); !st) return st;
  if (auto st = b.linear(x, n, *l.up_proj, -1, nullptr, s.up.get()); !st) return st;
  b.swiglu(s.gate.get(), s.up.get(), n, im, im, s.act.get());
  return b.linear(s.act.get(), n, *l.down_proj, -1, nullptr, out);
}

// Qwen3MoeSparseMoeBlock: router over mlp.gate, then each selected expert on the tokens routed to it, its
// output scaled by the routing weight and summed in expert order (HF's index_add_ loop over expert_hit).
Status Qwen3Model::sparse_moe_block(const Qwen3LayerWeights& l, int64_t n, const float* x, float* out) {
  Backend& b = *backend_;
  Scratch& s = *scratch_;
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, E = c.num_experts, K = c.num_experts_per_tok, im = c.moe_intermediate_size;
  // mlp.gate (router logits)
  if (auto st = b.linear(x, n, *l.router, -1, nullptr, s.router_logits.get()); !st) return st;
  // softmax, topk, norm_topk_prob
  s.expert_ids.resize(static_cast<size_t>(n * K));
  s.expert_weights.resize(static_cast<size_t>(n * K));
  if (auto st = b.moe_router(s.router_logits.get(), n, E, K, c.norm_topk_prob, s.expert_ids.data(),
                             s.expert_weights.data());
      !st)
    return st;
  b.fill_zero(out, n * H);
  for (int64_t e = 0; e < E; ++e) {
    s.rows.clear();
    s.row_weights.clear();
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < K; ++j)
        if (s.expert_ids[t * K + j] == e) {
          s.rows.push_back(t);
          s.row_weights.push_back(s.expert_weights[t * K + j]);
        }
    const int64_t cnt = static_cast<int64_t>(s.rows.size());
    if (cnt == 0) continue;
    b.gather_rows(x, H, s.rows.data(), cnt, s.xe.get());
    if (l.gate_up_proj) {
      // mlp.experts.gate_up_proj [E, 2I, H]: rows [0, I) are gate, [I, 2I) up
      if (auto st = b.linear(s.xe.get(), cnt, *l.gate_up_proj, e, nullptr, s.gu.get()); !st) return st;
      b.swiglu(s.gu.get(), s.gu.get() + im, cnt, im, 2 * im, s.act.get());
      // mlp.experts.down_proj [E, H, I]
      if (auto st = b.linear(s.act.get(), cnt, *l.experts_down_proj, e, nullptr, s.ye.get()); !st) return st;
    } else {
      // mlp.experts.<e>.gate_proj / up_proj / down_proj
      float* gate = s.gu.get();
      float* up = s.gu.get() + cnt * im;
      if (auto st = b.linear(s.xe.get(), cnt, *l.expert_gate[e], -1, nullptr, gate); !st) return st;
      if (auto st = b.linear(s.xe.get(), cnt, *l.expert_up[e], -1, nullptr, up); !st) return st;
      b.swiglu(gate, up, cnt, im, im, s.act.get());
      if (auto st = b.linear(s.act.get(), cnt, *l.expert_down[e], -1, nullptr, s.ye.get()); !st) return st;
    }
    b.scatter_add_rows(s.ye.get(), H, s.rows.data(), s.row_weights.data(), cnt, out);
  }
  return {};
}

}  // namespace mxq
