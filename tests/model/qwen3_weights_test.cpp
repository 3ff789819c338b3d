// bind_qwen3_weights: the names the checkpoint check expects are the names the forward binds, tied and
// stacked variants included, and a missing tensor or an unsupported config is refused by name.
#include "model/qwen3_weights.h"

#include <gtest/gtest.h>

namespace mxq {
namespace {

ModelConfig small_moe(bool tied) {
  ModelConfig c;
  c.architecture = "Qwen3MoeForCausalLM";
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 50;
  c.max_position_embeddings = 32;
  c.rope.type = "default";
  c.tie_word_embeddings = tied;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.mlp_only_layers = {1};  // layer 1 is a dense Qwen3MLP
  return c;
}

// A host store holding exactly the specs' tensors (bf16; zero bytes are fine: nothing is computed).
WeightStore store_of(const std::vector<WeightSpec>& specs, std::string_view skip = {}) {
  WeightStore s;
  for (const WeightSpec& w : specs) {
    if (w.name == skip) continue;
    EXPECT_TRUE(s.add(w.name, Format::kBF16, w.shape));
  }
  return s;
}

TEST(Qwen3Weights, BindsEveryNameTheSpecsList) {
  for (bool stacked : {false, true})
    for (bool tied : {false, true}) {
      const ModelConfig c = small_moe(tied);
      auto specs = qwen3_weight_specs(c, stacked);
      ASSERT_TRUE(specs);
      const WeightStore s = store_of(*specs);
      auto w = bind_qwen3_weights(c, s);
      ASSERT_TRUE(w) << w.error().message;
      EXPECT_EQ(w->stacked_experts, stacked);
      ASSERT_EQ(w->layers.size(), 3u);
      EXPECT_EQ(w->embed_tokens, s.find("model.embed_tokens.weight"));
      EXPECT_EQ(w->lm_head, tied ? w->embed_tokens : s.find("lm_head.weight"));
      EXPECT_EQ(w->norm, s.find("model.norm.weight"));
      const Qwen3LayerWeights& dense = w->layers[1];
      EXPECT_FALSE(dense.sparse);
      EXPECT_EQ(dense.down_proj, s.find("model.layers.1.mlp.down_proj.weight"));
      EXPECT_EQ(dense.router, nullptr);
      const Qwen3LayerWeights& moe = w->layers[2];
      EXPECT_TRUE(moe.sparse);
      EXPECT_EQ(moe.q_norm, s.find("model.layers.2.self_attn.q_norm.weight"));
      EXPECT_EQ(moe.router, s.find("model.layers.2.mlp.gate.weight"));
      if (stacked) {
        EXPECT_EQ(moe.gate_up_proj, s.find("model.layers.2.mlp.experts.gate_up_proj"));
        EXPECT_EQ(moe.experts_down_proj, s.find("model.layers.2.mlp.experts.down_proj"));
        EXPECT_TRUE(moe.expert_gate.empty());
      } else {
        ASSERT_EQ(moe.expert_up.size(), 4u);
        EXPECT_EQ(moe.expert_up[3], s.find("model.layers.2.mlp.experts.3.up_proj.weight"));
        EXPECT_EQ(moe.gate_up_proj, nullptr);
      }
      // every bound pointer is a distinct store tensor, and every store tensor is bound
      size_t bound = 0;
      for (const auto& l : w->layers) {
        for (const QTensor* t :
             {l.input_layernorm, l.post_attention_layernorm, l.q_proj, l.k_proj, l.v_proj, l.o_proj, l.q_norm,
              l.k_norm, l.gate_proj, l.up_proj, l.down_proj, l.router, l.gate_up_proj, l.experts_down_proj})
          bound += t != nullptr;
        bound += l.expert_gate.size() + l.expert_up.size() + l.expert_down.size();
      }
      bound += 2 + (tied ? 0 : 1);
      EXPECT_EQ(bound, s.tensors().size());
    }
}

TEST(Qwen3Weights, RefusesAMissingTensorByName) {
  const ModelConfig c = small_moe(false);
  auto specs = qwen3_weight_specs(c, false);
  ASSERT_TRUE(specs);
  const WeightStore s = store_of(*specs, "model.layers.2.mlp.experts.1.down_proj.weight");
  auto w = bind_qwen3_weights(c, s);
  ASSERT_FALSE(w);
  EXPECT_EQ(
      w.error().message,
      "Qwen3MoeForCausalLM: weight 'model.layers.2.mlp.experts.1.down_proj.weight' is not in the weight "
      "store");
}

TEST(Qwen3Weights, RefusesAConfigTheForwardCannotRun) {
  const WeightStore empty;
  ModelConfig c = small_moe(false);
  c.rope.type = "yarn";
  EXPECT_EQ(bind_qwen3_weights(c, empty).error().message,
            "Qwen3MoeForCausalLM: rope_type 'yarn' is not supported (expected 'default')");
  c = small_moe(false);
  c.num_key_value_heads = 3;
  EXPECT_EQ(check_qwen3_config(c).error().message,
            "Qwen3MoeForCausalLM: num_attention_heads 4 is not a multiple of num_key_value_heads 3");
  c = small_moe(false);
  c.num_experts_per_tok = 5;
  EXPECT_EQ(check_qwen3_config(c).error().message,
            "Qwen3MoeForCausalLM: num_experts_per_tok 5 outside [1, num_experts = 4]");
  c.architecture = "LlamaForCausalLM";
  EXPECT_EQ(
      check_qwen3_config(c).error().message,
      "architecture 'LlamaForCausalLM' is not supported (expected Qwen3ForCausalLM or Qwen3MoeForCausalLM)");
}

}  // namespace
}  // namespace mxq
