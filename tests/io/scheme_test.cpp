#include "io/scheme.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <fstream>
#include <sstream>

#include "io/config.h"

namespace mxq {
namespace {

using nlohmann::json;

const std::string kGolden = MXQ_SOURCE_DIR "/tests/golden/ckpt";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A checkpoint as detect_scheme sees it: the header of model.safetensors read here with a few lines
// (the real reader is io/safetensors), the raw bytes for check_tensor_bytes, and the two config files.
struct Checkpoint {
  json quantization_config;
  std::optional<json> hf_quant_config;
  json tensors;  // {name: {"dtype", "shape"}} so cases can edit it with a JSON merge patch
  std::string file;
  size_t data_start = 0;
  json offsets;  // {name: [begin, end]}

  TensorMetaMap metas() const {
    TensorMetaMap out;
    for (const auto& [name, m] : tensors.items())
      out[name] = TensorMeta{m["dtype"].get<std::string>(), m["shape"].get<std::vector<int64_t>>()};
    return out;
  }
  std::span<const uint8_t> bytes(const std::string& name) const {
    const auto b = offsets[name][0].get<size_t>(), e = offsets[name][1].get<size_t>();
    return {reinterpret_cast<const uint8_t*>(file.data()) + data_start + b, e - b};
  }
};

Checkpoint load(const std::string& dir) {
  Checkpoint c;
  const std::string path = kGolden + "/" + dir;
  auto config = read_config(path);
  auto hf = read_hf_quant_config(path);
  EXPECT_TRUE(config && hf) << path;
  if (config) c.quantization_config = config->quantization_config;
  if (hf) c.hf_quant_config = *hf;
  c.file = slurp(path + "/model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, c.file.data(), 8);
  const json header = json::parse(c.file.substr(8, n));
  c.data_start = 8 + n;
  for (const auto& [name, m] : header.items()) {
    if (name == "__metadata__") continue;
    c.tensors[name] = {{"dtype", m["dtype"]}, {"shape", m["shape"]}};
    c.offsets[name] = m["data_offsets"];
  }
  return c;
}

Result<Scheme> detect(const Checkpoint& c) {
  return detect_scheme(c.quantization_config, c.hf_quant_config ? &*c.hf_quant_config : nullptr, c.metas());
}

std::string test_name(std::string n) {
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

// ---- the golden checkpoints, each written by another tool -----------------------------------------------
struct GoldenCase {
  std::string dir;
  SchemeKind kind;
  Format format;
  std::vector<std::string> ignored;  // as the producer's config lists them (resolved for globs)
};
void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.dir << " -> " << scheme_name(c.kind); }

class SchemeGolden : public testing::TestWithParam<GoldenCase> {};

TEST_P(SchemeGolden, DetectsTheProducersScheme) {
  const GoldenCase& g = GetParam();
  const Checkpoint c = load(g.dir);
  auto s = detect(c);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->kind, g.kind);
  EXPECT_EQ(s->format, g.format);
  EXPECT_EQ(s->ignored, g.ignored);
  // Every *_proj weight the producer wrote is a quantized linear, named as the writer side names it.
  size_t projections = 0;
  for (const auto& [name, m] : c.tensors.items()) {
    if (name.find("_proj.weight") == std::string::npos || name.ends_with("_scale") || name.ends_with("_inv"))
      continue;
    ++projections;
    const std::string module = name.substr(0, name.find("_proj.weight") + 5);
    if (g.kind == SchemeKind::kNone) continue;
    ASSERT_TRUE(s->linears.count(module)) << module;
    EXPECT_EQ(s->linears.at(module).values, values_tensor_name(g.kind, module));
    EXPECT_EQ(s->linears.at(module).scales, scales_tensor_name(g.kind, module));
    EXPECT_TRUE(c.tensors.contains(s->linears.at(module).scales));
  }
  EXPECT_EQ(s->linears.size(), g.kind == SchemeKind::kNone ? 0 : projections);
  // covers Q-07, Q-08 (accept side): real bytes from foreign producers pass the byte checks.
  for (const auto& [name, m] : c.tensors.items()) {
    auto st = check_tensor_bytes(*s, name, c.bytes(name));
    EXPECT_TRUE(st) << st.error().message;
  }
  EXPECT_TRUE(check_partitions(*s, 1));
}

const std::vector<std::string> kLmHead = {"lm_head"};
INSTANTIATE_TEST_SUITE_P(
    , SchemeGolden,
    testing::Values(GoldenCase{"qwen3-dense-bf16", SchemeKind::kNone, Format::kBF16, {}},
                    GoldenCase{"qwen3-moe-bf16", SchemeKind::kNone, Format::kBF16, {}},
                    GoldenCase{"modelopt-mxfp8", SchemeKind::kModelOptMxfp8, Format::kMXFP8, kLmHead},
                    GoldenCase{"modelopt-mxfp8-moe",
                               SchemeKind::kModelOptMxfp8,
                               Format::kMXFP8,
                               {"lm_head", "model.layers.0.mlp.gate", "model.layers.1.mlp.gate"}},
                    GoldenCase{"ct-mxfp8", SchemeKind::kCtMxfp8, Format::kMXFP8, kLmHead},
                    GoldenCase{"ct-mxfp4", SchemeKind::kCtMxfp4, Format::kMXFP4, kLmHead},
                    GoldenCase{"fp8-b128", SchemeKind::kFp8Block128, Format::kFP8_B128, kLmHead},
                    GoldenCase{"ct-fp8-block", SchemeKind::kCtFp8Block128, Format::kFP8_B128, kLmHead}),
    [](const auto& info) { return test_name(info.param.dir); });

// ---- refusals: a golden checkpoint, edited; every message is one line naming what it expected ----------
struct RefusalCase {
  std::string name;
  std::string config_dir;    // quantization_config + hf_quant_config.json from here
  std::string tensor_dir;    // tensors from here
  std::string config_patch;  // merge patch on quantization_config ("" = none; "null" = remove it)
  std::string tensor_patch;  // merge patch on {name: {dtype, shape}}
  std::string error;         // substring of the error; "" = accepted
};
void PrintTo(const RefusalCase& c, std::ostream* os) {
  *os << c.name << " cfg=" << c.config_dir << " " << c.config_patch << " tensors=" << c.tensor_dir << " "
      << c.tensor_patch;
}

class SchemeRefusal : public testing::TestWithParam<RefusalCase> {};

TEST_P(SchemeRefusal, RefusedByName) {
  const RefusalCase& r = GetParam();
  Checkpoint c = load(r.tensor_dir);
  const Checkpoint cfg = load(r.config_dir);
  c.quantization_config = cfg.quantization_config;
  c.hf_quant_config = cfg.hf_quant_config;
  if (r.config_patch == "null") {
    c.quantization_config = nullptr;
    c.hf_quant_config.reset();
  } else if (!r.config_patch.empty()) {
    c.quantization_config.merge_patch(json::parse(r.config_patch));
  }
  if (!r.tensor_patch.empty()) c.tensors.merge_patch(json::parse(r.tensor_patch));
  auto s = detect(c);
  if (r.error.empty()) {
    EXPECT_TRUE(s) << s.error().message;
    return;
  }
  ASSERT_FALSE(s) << "accepted as " << scheme_name(s->kind);
  EXPECT_NE(s.error().message.find(r.error), std::string::npos) << s.error().message;
  EXPECT_EQ(s.error().message.find('\n'), std::string::npos);
}

const std::string kQ = "model.layers.0.self_attn.q_proj";
const std::string kDown = "model.layers.0.mlp.down_proj";

const std::string kMxfp8Activations =
    R"({"config_groups": {"group_0": {"input_activations": {"dynamic": true, "num_bits": 8, "type": "float",
        "strategy": "group", "group_size": 32, "symmetric": true, "scale_dtype": "torch.uint8"}}}})";

const RefusalCase kRefusals[] = {
    // covers Q-01: a quantization_config over 16-bit weights.
    {"Q01_ct_over_bf16", "ct-mxfp8", "qwen3-dense-bf16", "", "", "no linear weight is quantized"},
    {"Q01_modelopt_over_bf16", "modelopt-mxfp8", "qwen3-dense-bf16", "", "", "config/weights mismatch"},
    {"Q01_fp8_over_bf16", "fp8-b128", "qwen3-dense-bf16", "", "", "no linear weight is quantized"},
    // covers Q-02: weight_block_size must be a 2-D pair of sane positive integers, and mxq's is [128, 128].
    {"Q02_block_1d", "fp8-b128", "fp8-b128", R"({"weight_block_size": [128]})", "", "expected 2 dimensions"},
    {"Q02_block_3d", "fp8-b128", "fp8-b128", R"({"weight_block_size": [128, 128, 1]})", "",
     "expected 2 dimensions"},
    {"Q02_block_zero", "fp8-b128", "fp8-b128", R"({"weight_block_size": [0, 128]})", "", "positive integers"},
    {"Q02_block_negative", "fp8-b128", "fp8-b128", R"({"weight_block_size": [-128, 128]})", "",
     "positive integers"},
    {"Q02_block_huge", "fp8-b128", "fp8-b128", R"({"weight_block_size": [4294967296, 128]})", "",
     "positive integers"},
    {"Q02_block_string", "fp8-b128", "fp8-b128", R"({"weight_block_size": "128x128"})", "",
     "expected 2 dimensions"},
    {"Q02_block_64", "fp8-b128", "fp8-b128", R"({"weight_block_size": [64, 64]})", "", "expected [128, 128]"},
    // covers Q-04: scale tensor missing, of the wrong shape, or of the wrong dtype.
    {"Q04_mx_scale_missing", "ct-mxfp8", "ct-mxfp8", "", R"({")" + kQ + R"(.weight_scale": null})",
     "missing " + kQ + ".weight_scale"},
    {"Q04_mx_scale_f32", "modelopt-mxfp8", "modelopt-mxfp8", "",
     R"({")" + kQ + R"(.weight_scale": {"dtype": "F32"}})", "expected dtype U8"},
    {"Q04_mx_scale_shape", "ct-mxfp4", "ct-mxfp4", "",
     R"({")" + kQ + R"(.weight_scale": {"shape": [64, 4]}})", "expected shape [64, 2], got [64, 4]"},
    {"Q04_b128_scale_f16", "fp8-b128", "fp8-b128", "",
     R"({")" + kQ + R"(.weight_scale_inv": {"dtype": "F16"}})",
     "expected dtype F32 (or BF16, widened), got F16"},
    {"Q04_b128_scale_bf16_is_widened", "fp8-b128", "fp8-b128", "",
     R"({")" + kQ + R"(.weight_scale_inv": {"dtype": "BF16"}})", ""},
    {"Q04_b128_scale_shape", "fp8-b128", "fp8-b128", "",
     R"({")" + kQ + R"(.weight_scale_inv": {"shape": [64, 1]}})", "expected shape [1, 1]"},
    // The six FP8 block-128 refusals of formats.md.
    {"FP8_scale_inv_without_block_size", "fp8-b128", "fp8-b128", R"({"weight_block_size": null})", "",
     "without weight_block_size"},
    {"FP8_scale_inv_without_config", "fp8-b128", "fp8-b128", "null", "",
     "weight_scale_inv but config.json has no"},
    {"FP8_weight_without_scale_inv", "fp8-b128", "fp8-b128", "",
     R"({")" + kQ + R"(.weight_scale_inv": null})",
     "F8_E4M3 weight with weight_block_size but no " + kQ + ".weight_scale_inv"},
    {"FP8_not_converted_ships_scale", "fp8-b128", "fp8-b128", "",
     R"({"lm_head.weight_scale_inv": {"dtype": "F32", "shape": [2, 1]}})", "is not converted"},
    {"FP8_input_scale_with_dynamic", "fp8-b128", "fp8-b128", "",
     R"({")" + kQ + R"(.input_scale": {"dtype": "F32", "shape": []}})", "static input_scale"},
    {"FP8_activation_static", "fp8-b128", "fp8-b128", R"({"activation_scheme": "static"})", "",
     "activation_scheme: expected \"dynamic\""},
    {"FP8_activation_missing", "fp8-b128", "fp8-b128", R"({"activation_scheme": null})", "",
     "activation_scheme: expected \"dynamic\""},
    {"FP8_fmt_e5m2", "fp8-b128", "fp8-b128", R"({"fmt": "e5m2"})", "", "fmt: expected \"e4m3\""},
    {"FP8_ignored_layers_exact", "fp8-b128", "fp8-b128", R"({"ignored_layers": ["lm_head"]})", "", ""},
    // issue 22: transformers' FineGrainedFP8 save leaves lm_head (and a MoE router) in bf16 without listing it
    {"FP8_lm_head_unlisted_stays_float", "fp8-b128", "fp8-b128", R"({"modules_to_not_convert": null})", "", ""},
    {"FP8_projection_unlisted_float_refused", "fp8-b128", "fp8-b128", R"({"modules_to_not_convert": null})",
     R"({")" + kQ + R"(.weight": {"dtype": "BF16"}, ")" + kQ + R"(.weight_scale_inv": null})",
     "quantizes this module (not in its ignore list)"},
    // K must be a multiple of 32 for MX formats.
    {"MX_K_not_32", "ct-mxfp8", "ct-mxfp8", "",
     R"({")" + kQ + R"(.weight": {"shape": [64, 48]}, ")" + kQ + R"(.weight_scale": {"shape": [64, 1]}})",
     "K = 48 is not a multiple of 32"},
    {"MX4_K_not_32", "ct-mxfp4", "ct-mxfp4", "",
     R"({")" + kQ + R"(.weight_packed": {"shape": [64, 24]}, ")" + kQ +
         R"(.weight_scale": {"shape": [64, 1]}})",
     "K = 48 is not a multiple of 32"},
    // covers N-16: fp8 mixed with bf16 without a scale, or fp8 with no declared scheme.
    {"N16_fp8_without_config", "modelopt-mxfp8", "modelopt-mxfp8", "null", "", "N-16"},
    {"N16_bf16_next_to_scale", "ct-mxfp8", "ct-mxfp8", "", R"({")" + kQ + R"(.weight": {"dtype": "BF16"}})",
     "next to a scale"},
    {"N16_bf16_not_ignored", "ct-mxfp8", "ct-mxfp8", "",
     R"({")" + kQ + R"(.weight": {"dtype": "BF16"}, ")" + kQ + R"(.weight_scale": null})",
     "quantizes this module (not in its ignore list)"},
    {"N16_ignored_but_fp8", "modelopt-mxfp8", "modelopt-mxfp8", R"({"ignore": ["lm_head", ")" + kQ + R"("]})",
     "", "leaves unquantized (listed in its ignore list)"},
    // NVFP4 is refused by name wherever it shows.
    {"NVFP4_e4m3_scales", "ct-mxfp4", "ct-mxfp4", "",
     R"({")" + kQ + R"(.weight_scale": {"dtype": "F8_E4M3"}})", "NVFP4"},
    {"NVFP4_global_scale", "ct-mxfp4", "ct-mxfp4", "",
     R"({")" + kQ + R"(.weight_global_scale": {"dtype": "F32", "shape": [1]}})", "NVFP4"},
    {"NVFP4_group16", "ct-mxfp4", "ct-mxfp4",
     R"({"config_groups": {"group_0": {"weights": {"group_size": 16}}}})", "", "NVFP4"},
    {"NVFP4_scale_dtype", "ct-mxfp4", "ct-mxfp4",
     R"({"config_groups": {"group_0": {"weights": {"scale_dtype": "torch.float8_e4m3fn"}}}})", "", "NVFP4"},
    {"NVFP4_format", "ct-mxfp4", "ct-mxfp4",
     R"({"format": "nvfp4-pack-quantized", "config_groups": {"group_0": {"format": null}}})", "", "NVFP4"},
    {"NVFP4_modelopt", "ct-mxfp8", "modelopt-mxfp8", R"({"quant_method": "modelopt", "quant_algo": "NVFP4"})",
     "", "ModelOpt quant_algo \"NVFP4\" is not supported (NVFP4 is not supported)"},
    // Other configs mxq does not read.
    {"unknown_method", "fp8-b128", "fp8-b128", R"({"quant_method": "gptq"})", "",
     "quant_method \"gptq\" is not supported"},
    {"method_missing", "fp8-b128", "fp8-b128", R"({"quant_method": null})", "",
     "quant_method: expected a string"},
    {"per_tensor_fp8", "fp8-b128", "fp8-b128", R"({"weight_block_size": null})", "", "per-tensor FP8"},
    {"ct_float_quantized", "ct-mxfp8", "ct-mxfp8",
     R"({"format": "float-quantized", "config_groups": {"group_0": {"format": null}}})", "",
     "float-quantized is read only with strategy \"block\""},
    {"ct_bits_6", "ct-mxfp8", "ct-mxfp8", R"({"config_groups": {"group_0": {"weights": {"num_bits": 6}}}})",
     "", "num_bits: expected 8 (MXFP8) or 4 (MXFP4)"},
    {"ct_format_contradicts_bits", "ct-mxfp8", "ct-mxfp8",
     R"({"config_groups": {"group_0": {"weights": {"num_bits": 4}}}})", "", "contradicts weights.num_bits"},
    {"ct_static_activations", "ct-mxfp8", "ct-mxfp8",
     R"({"config_groups": {"group_0": {"input_activations": {"dynamic": false, "num_bits": 8}}}})", "",
     "input_activations: expected null or dynamic"},
    // issue 22: input_activations are read, not waved through: MXFP8 per 1x32 (W8A8) is run, 4-bit (the
    // MXFP4 preset's W4A4) and every other grouping are refused by name.
    {"ct_dynamic_mxfp8_activations_ok", "ct-mxfp8", "ct-mxfp8", kMxfp8Activations, "", ""},
    {"ct_mxfp4_with_mxfp8_activations_ok", "ct-mxfp4", "ct-mxfp4", kMxfp8Activations, "", ""},
    {"ct_dynamic_int8_activations", "ct-mxfp8", "ct-mxfp8",
     R"({"config_groups": {"group_0": {"input_activations": {"dynamic": true, "num_bits": 8}}}})", "",
     "input_activations: expected null or dynamic MXFP8 (num_bits 8, type \"float\", strategy \"group\", "
     "group_size 32)"},
    {"ct_mxfp4_preset_w4a4", "ct-mxfp4", "ct-mxfp4",
     R"({"config_groups": {"group_0": {"input_activations": {"dynamic": true, "num_bits": 4, "type": "float",
         "strategy": "group", "group_size": 32, "symmetric": true, "scale_dtype": "torch.uint8"}}}})",
     "", "config_groups.group_0.input_activations: num_bits 4 type \"float\" (dynamic 4-bit activations, W4A4) "
     "is not supported"},
    {"ct_mxfp4_fp8_group128_activations", "ct-mxfp4", "ct-mxfp4",
     R"({"config_groups": {"group_0": {"input_activations": {"dynamic": true, "num_bits": 8, "type": "float",
         "strategy": "group", "group_size": 128, "symmetric": true}}}})",
     "", "expected null or dynamic MXFP8"},
    // issue 22: compressed-tensors FP8_BLOCK is read; other float-quantized strategies are refused by name.
    {"ct_fp8_block_ok", "ct-fp8-block", "ct-fp8-block", "", "", ""},
    {"ct_fp8_block_weight_only_ok", "ct-fp8-block", "ct-fp8-block",
     R"({"config_groups": {"group_0": {"input_activations": null}}})", "", ""},
    {"ct_fp8_dynamic_per_channel", "ct-fp8-block", "ct-fp8-block",
     R"({"config_groups": {"group_0": {"weights": {"strategy": "channel", "block_structure": null},
         "input_activations": {"strategy": "token", "group_size": null}}}})",
     "", "weights.strategy: float-quantized is read only with strategy \"block\" and block_structure "
     "[128, 128] (FP8_BLOCK); got strategy \"channel\""},
    {"ct_fp8_per_tensor", "ct-fp8-block", "ct-fp8-block",
     R"({"config_groups": {"group_0": {"weights": {"strategy": "tensor", "block_structure": null}}}})", "",
     "got strategy \"tensor\""},
    {"ct_fp8_block_64", "ct-fp8-block", "ct-fp8-block",
     R"({"config_groups": {"group_0": {"weights": {"block_structure": [64, 64]}}}})", "",
     "weights.block_structure: expected [128, 128], got [64,64]"},
    {"ct_fp8_block_int8", "ct-fp8-block", "ct-fp8-block",
     R"({"config_groups": {"group_0": {"weights": {"type": "int"}}}})", "",
     "weights.type: expected \"float\" for FP8 block-128"},
    {"ct_fp8_block_token_activations", "ct-fp8-block", "ct-fp8-block",
     R"({"config_groups": {"group_0": {"input_activations": {"strategy": "token", "group_size": null}}}})", "",
     "expected null or dynamic FP8 per 1x128"},
    {"ct_fp8_block_scale_missing", "ct-fp8-block", "ct-fp8-block", "",
     R"({")" + kQ + R"(.weight_scale": null})",
     "F8_E4M3 weight with block_structure [128, 128] but no " + kQ + ".weight_scale"},
    {"ct_fp8_block_scale_inv_too", "ct-fp8-block", "ct-fp8-block", "",
     R"({")" + kQ + R"(.weight_scale_inv": {"dtype": "F32", "shape": [1, 1]}})", "expected weight_scale only"},
    {"ct_fp8_block_scale_shape", "ct-fp8-block", "ct-fp8-block", "",
     R"({")" + kQ + R"(.weight_scale": {"shape": [64, 1]}})", "expected shape [1, 1]"},
    {"ct_fp8_block_scale_f16", "ct-fp8-block", "ct-fp8-block", "",
     R"({")" + kQ + R"(.weight_scale": {"dtype": "F16"}})", "expected dtype F32 (or BF16, widened)"},
    {"ct_fp8_block_over_mxfp8_tensors", "ct-fp8-block", "ct-mxfp8", "", "",
     "weight_scale: expected dtype F32 (or BF16, widened), got U8"},
    {"ct_transform", "ct-mxfp8", "ct-mxfp8", R"({"transform_config": {"config_groups": {"u": {}}}})", "",
     "transform_config: expected empty"},
    {"ct_asymmetric", "ct-mxfp4", "ct-mxfp4",
     R"({"config_groups": {"group_0": {"weights": {"symmetric": false}}}})", "", "symmetric: expected true"},
    {"ct_regex_ignore", "ct-mxfp8", "ct-mxfp8", R"({"ignore": ["re:lm_.*"]})", "", ""},
    {"ct_bad_regex", "ct-mxfp8", "ct-mxfp8", R"({"ignore": ["re:(lm"]})", "",
     "is not a valid regular expression"},
    {"ct_regex_targets_leave_bf16", "ct-mxfp8", "ct-mxfp8",
     R"({"config_groups": {"group_0": {"targets": ["re:.*self_attn"]}}})", "", "matched by no config group"},
    {"modelopt_glob_ignore", "modelopt-mxfp8-moe", "modelopt-mxfp8-moe",
     R"({"ignore": ["lm_head", "*.mlp.gate"]})", "", ""},
    {"modelopt_hf_algo_contradicts", "modelopt-mxfp8", "modelopt-mxfp8", R"({"quant_algo": "FP8"})", "",
     "contradicts \"FP8\""},
    {"modelopt_group_size_16", "modelopt-mxfp8", "modelopt-mxfp8", R"({"group_size": 16})", "",
     "group_size 16 is not MXFP8's 32"},
    {"stray_scale", "ct-mxfp8", "ct-mxfp8", "",
     R"({"model.ghost.weight_scale": {"dtype": "U8", "shape": [1, 1]}})",
     "a scale tensor without model.ghost.weight"},
    {"shape_negative", "ct-mxfp8", "ct-mxfp8", "", R"({")" + kQ + R"(.weight": {"shape": [64, -64]}})",
     "shape [64, -64] is negative or overflows"},
    {"shape_zero_times_huge", "fp8-b128", "fp8-b128", "",
     R"({")" + kQ + R"(.weight": {"shape": [0, 9223372036854775807]}})", "is negative or overflows"},
    {"e5m2_embedding", "qwen3-dense-bf16", "qwen3-dense-bf16", "",
     R"({"model.embed_tokens.weight": {"dtype": "F8_E5M2"}})", "tensor mxq does not quantize"},
};

INSTANTIATE_TEST_SUITE_P(, SchemeRefusal, testing::ValuesIn(kRefusals),
                         [](const auto& info) { return info.param.name; });

// Issue 22: the activation mode a checkpoint declares (run by default, --activation-quant auto).
TEST(SchemeActivations, DeclaredModeIsRecorded) {
  Checkpoint c = load("ct-mxfp8");
  auto none = detect(c);
  ASSERT_TRUE(none) << none.error().message;
  EXPECT_EQ(none->activations, Format::kBF16);
  c.quantization_config.merge_patch(json::parse(kMxfp8Activations));
  auto w8a8 = detect(c);
  ASSERT_TRUE(w8a8) << w8a8.error().message;
  EXPECT_EQ(w8a8->activations, Format::kMXFP8);
  auto block = detect(load("ct-fp8-block"));
  ASSERT_TRUE(block) << block.error().message;
  EXPECT_EQ(block->activations, Format::kFP8_B128);
  auto fp8 = detect(load("fp8-b128"));  // activation_scheme dynamic: the same 1x128 FP8 activations
  ASSERT_TRUE(fp8) << fp8.error().message;
  EXPECT_EQ(fp8->activations, Format::kFP8_B128);
}

TEST(SchemeHfQuantConfig, HfQuantConfigAloneIsModelOpt) {
  Checkpoint c = load("modelopt-mxfp8");
  c.quantization_config = nullptr;
  auto s = detect(c);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(s->kind, SchemeKind::kModelOptMxfp8);
}

TEST(SchemeHfQuantConfig, HfQuantConfigBesideAnotherMethod) {
  Checkpoint c = load("fp8-b128");
  c.hf_quant_config = load("modelopt-mxfp8").hf_quant_config;
  auto s = detect(c);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("contradicts quantization_config.quant_method \"fp8\""),
            std::string::npos);
}

// ---- Q-07 / Q-08: the bytes, once read --------------------------------------------------------------------
struct BytesCase {
  std::string name;
  std::string dir;
  std::string tensor;
  size_t index;  // byte offset to overwrite in the real tensor bytes
  std::vector<uint8_t> patch;
  std::string error;  // "" = accepted
};
void PrintTo(const BytesCase& c, std::ostream* os) { *os << c.name << " " << c.tensor << "@" << c.index; }

class SchemeBytes : public testing::TestWithParam<BytesCase> {};

TEST_P(SchemeBytes, PolicyOnCheckpointBytes) {
  const BytesCase& b = GetParam();
  const Checkpoint c = load(b.dir);
  auto s = detect(c);
  ASSERT_TRUE(s) << s.error().message;
  auto src = c.bytes(b.tensor);
  std::vector<uint8_t> bytes(src.begin(), src.end());
  ASSERT_LE(b.index + b.patch.size(), bytes.size());
  std::copy(b.patch.begin(), b.patch.end(), bytes.begin() + static_cast<std::ptrdiff_t>(b.index));
  auto st = check_tensor_bytes(*s, b.tensor, bytes);
  if (b.error.empty()) {
    EXPECT_TRUE(st) << st.error().message;
    return;
  }
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find(b.error), std::string::npos) << st.error().message;
  EXPECT_EQ(st.error().message.rfind(b.tensor, 0), 0u) << "names the tensor first: " << st.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    , SchemeBytes,
    testing::Values(
        // covers Q-07: E8M0 0xFF refused, 0x00 accepted as 2^-127.
        BytesCase{"Q07_scale_ff", "ct-mxfp8", kQ + ".weight_scale", 5, {0xFF}, "scale 5 is 0xFF"},
        BytesCase{"Q07_scale_00_ok", "ct-mxfp8", kQ + ".weight_scale", 5, {0x00}, ""},
        BytesCase{"Q07_scale_fe_ok", "modelopt-mxfp8", kQ + ".weight_scale", 0, {0xFE}, ""},
        BytesCase{"Q07_mx4_scale_ff", "ct-mxfp4", kDown + ".weight_scale", 3, {0xFF}, "E8M0 NaN"},
        // covers Q-08: NaN codes / NaN and Inf values refused.
        BytesCase{
            "Q08_e4m3_7f", "ct-mxfp8", kQ + ".weight", 17, {0x7F}, "element 17 is an E4M3 NaN code 0x7F"},
        BytesCase{"Q08_e4m3_ff", "fp8-b128", kQ + ".weight", 0, {0xFF}, "E4M3 NaN code 0xFF"},
        BytesCase{"Q08_e4m3_max_ok", "fp8-b128", kQ + ".weight", 0, {0x7E, 0xFE}, ""},
        BytesCase{
            "Q08_bf16_nan", "qwen3-dense-bf16", kQ + ".weight", 2, {0xC0, 0x7F}, "element 1 is NaN or Inf"},
        BytesCase{"Q08_bf16_inf", "ct-mxfp8", "lm_head.weight", 0, {0x80, 0xFF}, "element 0 is NaN or Inf"},
        BytesCase{"Q08_norm_nan", "qwen3-moe-bf16", "model.norm.weight", 6, {0xC0, 0xFF}, "NaN or Inf"},
        BytesCase{"Q08_scale_inv_nan",
                  "fp8-b128",
                  kQ + ".weight_scale_inv",
                  0,
                  {0, 0, 0xC0, 0x7F},
                  "positive finite"},
        BytesCase{
            "Q08_scale_inv_zero", "fp8-b128", kQ + ".weight_scale_inv", 0, {0, 0, 0, 0}, "positive finite"},
        BytesCase{"Q08_scale_inv_negative",
                  "fp8-b128",
                  kQ + ".weight_scale_inv",
                  0,
                  {0, 0, 0x80, 0xBF},
                  "positive finite"},
        BytesCase{"fp4_any_byte_ok", "ct-mxfp4", kQ + ".weight_packed", 0, {0xFF, 0x88, 0x77}, ""}),
    [](const auto& info) { return info.param.name; });

TEST(SchemeByteLength, WrongLengthIsRefused) {
  const Checkpoint c = load("ct-mxfp8");
  auto s = detect(c);
  ASSERT_TRUE(s);
  auto src = c.bytes(kQ + ".weight_scale");
  auto st = check_tensor_bytes(*s, kQ + ".weight_scale", src.subspan(1));
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("expected 128 bytes, got 127"), std::string::npos) << st.error().message;
}

// ---- Q-03: partitions of the weights over tensor-parallel ranks
// ----------------------------------------------
struct PartitionCase {
  std::string dir;
  int64_t tp;
  std::string error;
};
void PrintTo(const PartitionCase& c, std::ostream* os) { *os << c.dir << " tp=" << c.tp; }

class SchemePartitions : public testing::TestWithParam<PartitionCase> {};

// covers Q-03
TEST_P(SchemePartitions, WholeBlocksPerRank) {
  const PartitionCase& p = GetParam();
  auto s = detect(load(p.dir));
  ASSERT_TRUE(s) << s.error().message;
  auto st = check_partitions(*s, p.tp);
  if (p.error.empty()) {
    EXPECT_TRUE(st) << st.error().message;
    return;
  }
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find(p.error), std::string::npos) << st.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    , SchemePartitions,
    testing::Values(PartitionCase{"fp8-b128", 1, ""},
                    // note: the tiny model's N = 32..128 cannot hold a 128-row block per rank at tp = 2.
                    PartitionCase{"fp8-b128", 2, "is not a multiple of the fp8-b128 block 128"},
                    PartitionCase{"ct-mxfp8", 2, ""},
                    PartitionCase{"ct-mxfp8", 4, "not a multiple of the mxfp8 block 32"},
                    PartitionCase{"ct-mxfp4", 3, "does not split over 3 ranks"},
                    PartitionCase{"modelopt-mxfp8", 0, "must be >= 1"}),
    [](const auto& info) { return test_name(info.param.dir + "_tp" + std::to_string(info.param.tp)); });

// ---- the writer: what mxq writes, read back, and compared with what the producers wrote ------------------
struct WriterCase {
  SchemeKind kind;
  std::string golden;  // checkpoint whose tensors the written config must describe
};
void PrintTo(const WriterCase& c, std::ostream* os) { *os << scheme_name(c.kind); }

class SchemeWriter : public testing::TestWithParam<WriterCase> {};

TEST_P(SchemeWriter, RoundTripsThroughDetection) {
  const WriterCase& w = GetParam();
  Checkpoint c = load(w.golden);
  auto original = detect(c);
  ASSERT_TRUE(original) << original.error().message;
  c.quantization_config = make_quantization_config(w.kind, original->ignored);
  c.hf_quant_config = make_hf_quant_config(w.kind, original->ignored);
  EXPECT_EQ(c.hf_quant_config.has_value(), w.kind == SchemeKind::kModelOptMxfp8);
  auto again = detect(c);
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(again->kind, w.kind);
  EXPECT_EQ(again->ignored, original->ignored);
  ASSERT_EQ(again->linears.size(), original->linears.size());
  for (const auto& [m, q] : original->linears) {
    EXPECT_EQ(again->linears.at(m).values, q.values);
    EXPECT_EQ(again->linears.at(m).scales, q.scales);
    EXPECT_EQ(again->linears.at(m).shape, q.shape);
  }
}

// Every key mxq writes has the value the producer itself wrote (except who the producer is).
TEST_P(SchemeWriter, MatchesTheProducersConfig) {
  const WriterCase& w = GetParam();
  const Checkpoint c = load(w.golden);
  const json written = make_quantization_config(w.kind, {"lm_head"});
  json theirs = c.quantization_config;
  if (w.kind == SchemeKind::kModelOptMxfp8) theirs.erase("producer");
  if (w.kind == SchemeKind::kFp8Block128) theirs["ignored_layers"] = theirs["modules_to_not_convert"];
  for (const auto& [key, value] : written.items()) {
    if (key == "producer") continue;
    ASSERT_TRUE(theirs.contains(key)) << key;
    EXPECT_EQ(value, theirs[key]) << key;
  }
  if (w.kind == SchemeKind::kModelOptMxfp8) {
    json hf = *make_hf_quant_config(w.kind, {"lm_head"});
    EXPECT_EQ(hf["quantization"], (*c.hf_quant_config)["quantization"]);
  }
}

INSTANTIATE_TEST_SUITE_P(, SchemeWriter,
                         testing::Values(WriterCase{SchemeKind::kModelOptMxfp8, "modelopt-mxfp8"},
                                         WriterCase{SchemeKind::kCtMxfp8, "ct-mxfp8"},
                                         WriterCase{SchemeKind::kCtMxfp4, "ct-mxfp4"},
                                         WriterCase{SchemeKind::kFp8Block128, "fp8-b128"}),
                         [](const auto& info) {
                           return test_name(std::string(scheme_name(info.param.kind)));
                         });

TEST(SchemeWriterNone, NoneWritesNothing) {
  EXPECT_TRUE(make_quantization_config(SchemeKind::kNone, {}).is_null());
  EXPECT_FALSE(make_hf_quant_config(SchemeKind::kNone, {}).has_value());
  EXPECT_EQ(values_tensor_name(SchemeKind::kNone, "m"), "m.weight");
  EXPECT_EQ(scales_tensor_name(SchemeKind::kNone, "m"), "");
}

}  // namespace
}  // namespace mxq
