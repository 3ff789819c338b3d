#include "io/config.h"

#include <gtest/gtest.h>

#include <cctype>
#include <fstream>
#include <sstream>

namespace mxq {
namespace {

using nlohmann::json;

const std::string kGolden = MXQ_SOURCE_DIR "/tests/golden/ckpt";

json load_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

// ---- oracle: transformers' own reading of config variants (tests/golden/make_checkpoints.py) ----------
struct OracleCase {
  std::string name;
  json config;
  json expect;
};
void PrintTo(const OracleCase& c, std::ostream* os) { *os << c.name; }

std::vector<OracleCase> oracle_cases() {
  std::vector<OracleCase> out;
  for (const json& c : load_json(kGolden + "/config_cases.json"))
    out.push_back({c["name"].get<std::string>(), c["config"], c["expect"]});
  return out;
}

class ConfigOracle : public testing::TestWithParam<OracleCase> {};

TEST_P(ConfigOracle, MatchesTransformers) {
  const OracleCase& c = GetParam();
  auto cfg = parse_config(c.config.dump(), c.name);
  ASSERT_TRUE(cfg) << cfg.error().message;
  EXPECT_EQ(cfg->head_dim, c.expect["head_dim"].get<int64_t>());
  EXPECT_EQ(cfg->rope.theta, c.expect["rope_theta"].get<double>());
  EXPECT_EQ(cfg->rope.type, c.expect["rope_type"].get<std::string>());
  EXPECT_EQ(cfg->num_experts, c.expect["num_experts"].get<int64_t>());
  EXPECT_EQ(cfg->eos_token_ids, c.expect["eos_token_ids"].get<std::vector<int64_t>>());
  std::vector<int64_t> sparse;
  for (int64_t l = 0; l < cfg->num_hidden_layers; ++l)
    if (cfg->layer_is_sparse(l)) sparse.push_back(l);
  EXPECT_EQ(sparse, c.expect["sparse_layers"].get<std::vector<int64_t>>());
  EXPECT_TRUE(cfg->architecture_known);
  EXPECT_EQ(cfg->dtype, "bfloat16");
}

INSTANTIATE_TEST_SUITE_P(, ConfigOracle, testing::ValuesIn(oracle_cases()), [](const auto& info) {
  std::string n = info.param.name;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
});

// ---- the golden checkpoints read from disk ---------------------------------------------------------------
TEST(ConfigRead, GoldenCheckpointsMatchTheirConfigJson) {
  for (const char* dir : {"qwen3-dense-bf16", "qwen3-moe-bf16", "modelopt-mxfp8", "ct-mxfp4", "fp8-b128"}) {
    SCOPED_TRACE(dir);
    const json raw = load_json(kGolden + "/" + dir + "/config.json");
    auto cfg = read_config(kGolden + "/" + dir);
    ASSERT_TRUE(cfg) << cfg.error().message;
    EXPECT_EQ(cfg->hidden_size, raw["hidden_size"].get<int64_t>());
    EXPECT_EQ(cfg->intermediate_size, raw["intermediate_size"].get<int64_t>());
    EXPECT_EQ(cfg->num_hidden_layers, raw["num_hidden_layers"].get<int64_t>());
    EXPECT_EQ(cfg->num_attention_heads, raw["num_attention_heads"].get<int64_t>());
    EXPECT_EQ(cfg->num_key_value_heads, raw["num_key_value_heads"].get<int64_t>());
    EXPECT_EQ(cfg->vocab_size, raw["vocab_size"].get<int64_t>());
    EXPECT_EQ(cfg->max_position_embeddings, raw["max_position_embeddings"].get<int64_t>());
    EXPECT_EQ(cfg->rms_norm_eps, raw["rms_norm_eps"].get<double>());
    EXPECT_EQ(cfg->tie_word_embeddings, raw["tie_word_embeddings"].get<bool>());
    EXPECT_EQ(cfg->architecture, raw["architectures"][0].get<std::string>());
    EXPECT_EQ(cfg->quantization_config, raw.value("quantization_config", json()));
    EXPECT_TRUE(cfg->remote_code_refs.empty());
  }
  auto moe = read_config(kGolden + "/qwen3-moe-bf16");
  ASSERT_TRUE(moe);
  const json raw = load_json(kGolden + "/qwen3-moe-bf16/config.json");
  EXPECT_EQ(moe->num_experts, raw["num_local_experts"].get<int64_t>());
  EXPECT_EQ(moe->num_experts_per_tok, raw["num_experts_per_tok"].get<int64_t>());
  EXPECT_EQ(moe->moe_intermediate_size, raw["moe_intermediate_size"].get<int64_t>());
  EXPECT_EQ(moe->norm_topk_prob, raw["norm_topk_prob"].get<bool>());
}

TEST(ConfigRead, MissingDirectoryIsANamedError) {
  auto cfg = read_config(kGolden + "/no-such-checkpoint");
  ASSERT_FALSE(cfg);
  EXPECT_NE(cfg.error().message.find("no-such-checkpoint/config.json"), std::string::npos);
}

// ---- edits of the dense golden config: accepted ones check a field, refused ones name the problem ------
struct EditCase {
  std::string name;
  std::string patch;  // JSON merge patch (RFC 7386) applied to qwen3-dense-bf16/config.json
  std::string error;  // substring of the one-line error; "" = accepted
};
void PrintTo(const EditCase& c, std::ostream* os) { *os << c.name << " " << c.patch; }

class ConfigEdit : public testing::TestWithParam<EditCase> {};

TEST_P(ConfigEdit, AcceptsOrRefusesByName) {
  const EditCase& c = GetParam();
  json cfg = load_json(kGolden + "/qwen3-dense-bf16/config.json");
  cfg.merge_patch(json::parse(c.patch));
  auto parsed = parse_config(cfg.dump(), "ckpt/config.json");
  if (c.error.empty()) {
    EXPECT_TRUE(parsed) << parsed.error().message;
    return;
  }
  ASSERT_FALSE(parsed) << "accepted " << c.patch;
  const std::string& msg = parsed.error().message;
  EXPECT_NE(msg.find(c.error), std::string::npos) << msg;
  EXPECT_NE(msg.find("ckpt/config.json"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
}

const EditCase kEdits[] = {
    {"eos_list", R"({"eos_token_id": [2, 3]})", ""},
    {"bos_null", R"({"bos_token_id": null})", ""},
    {"unknown_arch_parses", R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})", ""},
    // issue 22: recorded in ModelConfig::unsupported (refused by the loader, ConfigUnsupported below)
    {"hidden_act_gelu_parses", R"({"hidden_act": "gelu"})", ""},
    {"layer_types_not_a_list", R"({"layer_types": "full_attention"})", "layer_types: expected a list"},
    {"layer_types_number", R"({"layer_types": [1]})", "layer_types[0]: expected a string"},
    {"sliding_not_bool", R"({"use_sliding_window": "no"})", "use_sliding_window: expected true/false"},
    {"hidden_act_number", R"({"hidden_act": 1})", "hidden_act: expected a string"},
    {"missing_hidden", R"({"hidden_size": null})", "missing required key \"hidden_size\""},
    {"hidden_string", R"({"hidden_size": "64"})", "hidden_size: expected an integer, got string"},
    {"hidden_float", R"({"hidden_size": 64.0})", "hidden_size: expected an integer, got number"},
    {"hidden_zero", R"({"hidden_size": 0})", "hidden_size: expected an integer in [1,"},
    {"layers_negative", R"({"num_hidden_layers": -2})", "num_hidden_layers: expected an integer in [1,"},
    // covers G-06: sizes that would not survive narrowing to int32 are refused before any use.
    {"vocab_huge", R"({"vocab_size": 4294967296})", "vocab_size: expected an integer in [1, 16777216]"},
    {"max_pos_huge", R"({"max_position_embeddings": 18446744073709551615})", "max_position_embeddings"},
    {"beyond_u64", R"({"hidden_size": 1e30})", "hidden_size: expected an integer"},
    {"kv_not_dividing", R"({"num_key_value_heads": 3})", "multiple of num_key_value_heads 3"},
    {"kv_above_heads", R"({"num_key_value_heads": 8})", "multiple of num_key_value_heads 8"},
    {"head_dim_odd", R"({"head_dim": 15})", "head_dim: expected an even number"},
    {"eos_out_of_vocab", R"({"eos_token_id": 256})", "eos_token_id: expected an integer in [0, 255]"},
    {"eos_string", R"({"eos_token_id": ["2"]})", "eos_token_id: expected an integer, got string"},
    {"eps_negative", R"({"rms_norm_eps": -1e-6})", "rms_norm_eps: expected a positive finite number"},
    {"theta_string", R"({"rope_parameters": {"rope_theta": "1e4"}})",
     "rope_parameters.rope_theta: expected a number"},
    {"rope_not_object", R"({"rope_parameters": [1]})", "rope_parameters: expected an object"},
    {"tie_string", R"({"tie_word_embeddings": "yes"})", "tie_word_embeddings: expected true/false"},
    {"arch_not_list", R"({"architectures": "Qwen3ForCausalLM"})", "architectures: expected a non-empty list"},
    {"no_arch_no_type", R"({"architectures": null, "model_type": null})", "missing both"},
    {"quant_config_string", R"({"quantization_config": "fp8"})", "quantization_config: expected an object"},
    {"moe_without_experts", R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"})",
     "missing required key \"num_experts\""},
    {"moe_topk_above_experts",
     R"({"model_type": "qwen3_moe", "num_experts": 2, "num_experts_per_tok": 4, "moe_intermediate_size": 64})",
     "num_experts_per_tok 4 exceeds num_experts 2"},
    {"moe_missing_topk", R"({"model_type": "qwen3_moe", "num_experts": 2, "moe_intermediate_size": 64})",
     "missing required key \"num_experts_per_tok\""},
    {"moe_only_layer_out_of_range",
     R"({"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
         "mlp_only_layers": [2]})",
     "mlp_only_layers: layer 2 is not below num_hidden_layers 2"},
    {"moe_sparse_step_zero",
     R"({"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
         "decoder_sparse_step": 0})",
     "decoder_sparse_step: expected an integer in [1,"},
};

INSTANTIATE_TEST_SUITE_P(, ConfigEdit, testing::ValuesIn(kEdits),
                         [](const auto& info) { return info.param.name; });

// ---- raw text: broken JSON is one named line, never an exception -------------------------------------
struct TextCase {
  std::string name;
  std::string text;
  std::string error;
};
void PrintTo(const TextCase& c, std::ostream* os) { *os << c.name; }

class ConfigText : public testing::TestWithParam<TextCase> {};

TEST_P(ConfigText, RefusedByName) {
  auto parsed = parse_config(GetParam().text, "x/config.json");
  ASSERT_FALSE(parsed);
  EXPECT_NE(parsed.error().message.find(GetParam().error), std::string::npos) << parsed.error().message;
  EXPECT_EQ(parsed.error().message.find('\n'), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    , ConfigText,
    testing::Values(TextCase{"empty", "", "x/config.json: invalid JSON"},
                    TextCase{"truncated", R"({"hidden_size": 6)", "x/config.json: invalid JSON"},
                    TextCase{"top_level_array", "[1, 2]", "expected a JSON object at top level, got array"},
                    TextCase{"deep_nesting", std::string(10000, '[') + std::string(10000, ']'),
                             "nested deeper than 64 levels"},
                    TextCase{"not_utf8", "{\"model_type\": \"\xff\xfe\"}", "x/config.json: invalid JSON"}),
    [](const auto& info) { return info.param.name; });

// covers Q-05: code references are recorded and reported, never executed (mxq has no code path that could).
TEST(ConfigRemoteCode, AutoMapIsRecordedNotRun) {
  json cfg = load_json(kGolden + "/qwen3-dense-bf16/config.json");
  cfg["auto_map"] = {{"AutoModelForCausalLM", "modeling_evil.EvilForCausalLM"}};
  cfg["trust_remote_code"] = true;
  cfg["text_config"] = {{"auto_map", {{"AutoConfig", "configuration_evil.EvilConfig"}}}};
  auto parsed = parse_config(cfg.dump(), "ckpt/config.json");
  ASSERT_TRUE(parsed) << parsed.error().message;
  const std::vector<std::string> want = {
      R"(auto_map.AutoModelForCausalLM="modeling_evil.EvilForCausalLM")", "trust_remote_code=true",
      R"(text_config.auto_map.AutoConfig="configuration_evil.EvilConfig")"};
  EXPECT_EQ(parsed->remote_code_refs, want);
}

TEST(ConfigQuantization, TakenFromTextConfigWhenNotAtTopLevel) {
  json cfg = load_json(kGolden + "/qwen3-dense-bf16/config.json");
  const json qc = load_json(kGolden + "/fp8-b128/config.json")["quantization_config"];
  cfg["text_config"] = {{"quantization_config", qc}};
  auto parsed = parse_config(cfg.dump(), "ckpt/config.json");
  ASSERT_TRUE(parsed) << parsed.error().message;
  EXPECT_EQ(parsed->quantization_config, qc);
}

TEST(ConfigArchitecture, UnknownIsRefusedByNameWhenTheLoaderAsks) {
  json cfg = load_json(kGolden + "/qwen3-dense-bf16/config.json");
  auto dense = parse_config(cfg.dump(), "a/config.json");
  ASSERT_TRUE(dense);
  EXPECT_TRUE(check_architecture(*dense));
  cfg["architectures"] = {"LlamaForCausalLM"};
  cfg["model_type"] = "llama";
  auto llama = parse_config(cfg.dump(), "a/config.json");
  ASSERT_TRUE(llama) << llama.error().message;
  auto st = check_architecture(*llama);
  ASSERT_FALSE(st);
  EXPECT_NE(
      st.error().message.find("architecture \"LlamaForCausalLM\" (model_type \"llama\") is not supported"),
      std::string::npos)
      << st.error().message;
}

// issue 22: a config.json without "architectures" (PretrainedConfig.save_pretrained) resolves from model_type,
// as transformers' Auto classes do.
TEST(ConfigArchitecture, ResolvedFromModelTypeWhenAbsent) {
  json cfg = load_json(kGolden + "/qwen3-dense-bf16/config.json");
  cfg.erase("architectures");
  auto dense = parse_config(cfg.dump(), "a/config.json");
  ASSERT_TRUE(dense) << dense.error().message;
  EXPECT_EQ(dense->architecture, "Qwen3ForCausalLM");
  EXPECT_TRUE(check_architecture(*dense));
  json moe = load_json(kGolden + "/qwen3-moe-bf16/config.json");
  moe.erase("architectures");
  auto m = parse_config(moe.dump(), "b/config.json");
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->architecture, "Qwen3MoeForCausalLM");
}

// issue 22: what the forward does not implement was ignored in silence; now the loader refuses it by name.
TEST(ConfigUnsupported, RefusedByTheLoaderByName) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"hidden_act": "gelu"})", "hidden_act \"gelu\": the MLP runs SwiGLU with silu only"},
      {R"({"use_sliding_window": true, "sliding_window": 4096})", "use_sliding_window true"},
      {R"({"layer_types": ["full_attention", "sliding_attention"]})", "layer_types[1] \"sliding_attention\""},
      {R"({"quantization_config": {"quant_method": "compressed-tensors", "kv_cache_scheme": {"num_bits": 8}}})",
       "quantization_config.kv_cache_scheme"},
      // issue 22: inspect accepted what generate refused; both refuse through check_architecture now
      {R"({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}})",
       "rope_parameters.rope_type \"yarn\" is not supported (expected \"default\")"},
      {R"({"rope_parameters": {"rope_type": "linear", "factor": 2.0}})", "rope_type \"linear\" is not supported"},
      {R"({"rope_scaling": {"type": "dynamic", "factor": 2.0}})", "rope_type \"dynamic\" is not supported"},
  };
  for (const auto& [patch, want] : cases) {
    json cfg = load_json(kGolden + "/qwen3-dense-bf16/config.json");
    cfg.merge_patch(json::parse(patch));
    auto parsed = parse_config(cfg.dump(), "a/config.json");
    ASSERT_TRUE(parsed) << parsed.error().message;
    auto st = check_architecture(*parsed);
    ASSERT_FALSE(st) << patch;
    EXPECT_NE(st.error().message.find(want), std::string::npos) << st.error().message;
  }
  // what transformers 5 writes for every Qwen3 model: accepted
  json cfg = load_json(kGolden + "/qwen3-dense-bf16/config.json");
  cfg.merge_patch(json::parse(
      R"({"hidden_act": "silu", "use_sliding_window": false, "sliding_window": null,
          "layer_types": ["full_attention", "full_attention"]})"));
  auto ok = parse_config(cfg.dump(), "a/config.json");
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_TRUE(check_architecture(*ok)) << check_architecture(*ok).error().message;
}

}  // namespace
}  // namespace mxq
