// A random Qwen3 / Qwen3-MoE checkpoint the CUDA engine runs (head_dim 64; the golden checkpoints' 16 it
// refuses), shared by the engine and backend GPU tests.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "format/codec.h"
#include "gpu_test_util.h"
#include "io/safetensors_writer.h"

namespace mxq::cuda {

enum class Kind { kDense, kMoeStacked, kMoeExperts };

// A random Qwen3 / Qwen3-MoE checkpoint in bf16: head_dim 64, 4 query heads over 2 KV heads, 2 layers (the
// MoE one: layer 0 sparse, 8 experts, top `top_k`; layer 1 a dense MLP). Dense ties lm_head to the embedding.
// note: a tied embedding of std 1 makes the residual stream mostly the token's own embedding, so every model
// predicts its input token with logprob 0 (a run on the H200 showed it: refit and greedy checks that could
// not fail). The tied table is std 0.05, under the layers' O(1) outputs: logits ~ N(0, 1).
inline void write_checkpoint(const std::string& dir, Kind kind, uint64_t seed, int64_t top_k = 2) {
  std::filesystem::create_directories(dir);
  const int64_t H = 256, D = 64, Hq = 4, Hkv = 2, I = 512, V = 512, E = 8, Im = 128, L = 2;
  const bool moe = kind != Kind::kDense;
  nlohmann::json cfg = {{"architectures", {moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"}},
                        {"model_type", moe ? "qwen3_moe" : "qwen3"},
                        {"attention_bias", false},
                        {"bos_token_id", 1},
                        {"eos_token_id", 2},
                        {"head_dim", D},
                        {"hidden_act", "silu"},
                        {"hidden_size", H},
                        {"intermediate_size", I},
                        {"max_position_embeddings", 256},
                        {"num_attention_heads", Hq},
                        {"num_hidden_layers", L},
                        {"num_key_value_heads", Hkv},
                        {"rms_norm_eps", 1e-6},
                        {"rope_parameters", {{"rope_theta", 10000.0}, {"rope_type", "default"}}},
                        {"tie_word_embeddings", kind == Kind::kDense},
                        {"vocab_size", V},
                        {"dtype", "bfloat16"}};
  if (moe) {
    cfg["num_experts"] = E;
    cfg["num_experts_per_tok"] = top_k;
    cfg["moe_intermediate_size"] = Im;
    cfg["decoder_sparse_step"] = 1;
    cfg["norm_topk_prob"] = true;
    cfg["mlp_only_layers"] = nlohmann::json::array({1});
  }
  std::ofstream(dir + "/config.json") << cfg.dump(2);

  std::mt19937_64 rng(seed);
  std::vector<std::pair<std::string, std::vector<int64_t>>> specs;
  std::vector<std::vector<uint8_t>> data;
  auto add = [&](std::string name, std::vector<int64_t> shape, float stddev, float mean = 0) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::normal_distribution<float> dist(mean, stddev);
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * 2);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = f32_to_bf16(dist(rng));
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
    specs.push_back({std::move(name), std::move(shape)});
    data.push_back(std::move(bytes));
  };
  auto linear = [&](std::string name, std::vector<int64_t> shape) {
    add(std::move(name), shape, 1.0f / std::sqrt(static_cast<float>(shape.back())));
  };
  add("model.embed_tokens.weight", {V, H}, kind == Kind::kDense ? 0.05f : 1.0f);
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    add(p + "input_layernorm.weight", {H}, 0.1f, 1.0f);
    add(p + "post_attention_layernorm.weight", {H}, 0.1f, 1.0f);
    linear(p + "self_attn.q_proj.weight", {Hq * D, H});
    linear(p + "self_attn.k_proj.weight", {Hkv * D, H});
    linear(p + "self_attn.v_proj.weight", {Hkv * D, H});
    linear(p + "self_attn.o_proj.weight", {H, Hq * D});
    add(p + "self_attn.q_norm.weight", {D}, 0.1f, 1.0f);
    add(p + "self_attn.k_norm.weight", {D}, 0.1f, 1.0f);
    if (moe && l == 0) {
      linear(p + "mlp.gate.weight", {E, H});
      if (kind == Kind::kMoeStacked) {
        linear(p + "mlp.experts.gate_up_proj", {E, 2 * Im, H});
        linear(p + "mlp.experts.down_proj", {E, H, Im});
      } else {
        for (int64_t e = 0; e < E; ++e) {
          linear(fmt::format("{}mlp.experts.{}.gate_proj.weight", p, e), {Im, H});
          linear(fmt::format("{}mlp.experts.{}.up_proj.weight", p, e), {Im, H});
          linear(fmt::format("{}mlp.experts.{}.down_proj.weight", p, e), {H, Im});
        }
      }
    } else {
      linear(p + "mlp.gate_proj.weight", {I, H});
      linear(p + "mlp.up_proj.weight", {I, H});
      linear(p + "mlp.down_proj.weight", {H, I});
    }
  }
  add("model.norm.weight", {H}, 0.1f, 1.0f);
  if (kind != Kind::kDense) linear("lm_head.weight", {V, H});
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < specs.size(); ++i)
    tensors.push_back({specs[i].first, Dtype::kBF16, specs[i].second, data[i]});
  auto st = write_safetensors(dir + "/model.safetensors", tensors, {});
  ASSERT_TRUE(st) << st.error().message;
}

inline std::string temp_dir(const std::string& name) {
  const auto d =
      std::filesystem::temp_directory_path() / fmt::format("mxq_engine_cuda_{}_{}", name, test::fresh_seed());
  return d.string();
}

}  // namespace mxq::cuda
