// The configs mxq writes for `mxq quantize`, shaped like each producer's own output (sources in
// scheme_config.cpp) so that vLLM, transformers and mxq itself read them back. `ignored` holds exact module
// names; detect_scheme resolves them to the same list (scheme_test round-trips every kind).
#include <nlohmann/json.hpp>

#include "io/scheme.h"

namespace mxq {
namespace {

using json = nlohmann::json;

// note: the producer entry tells a reader which tool wrote the file; ModelOpt readers only look at
// quant_algo.
const json kProducer = {{"name", "mxq"}, {"version", "0.1.0"}};

json ct_config(std::string_view format, int num_bits, const std::vector<std::string>& ignored) {
  // Mirrors compressed-tensors' MXFP8A16 / MXFP4A16 presets as ModelCompressor.update_config serializes them.
  const json weights = {
      {"dynamic", false},    {"group_size", 32},  {"num_bits", num_bits}, {"scale_dtype", "torch.uint8"},
      {"strategy", "group"}, {"symmetric", true}, {"type", "float"}};
  const json group = {{"format", format},
                      {"input_activations", nullptr},
                      {"output_activations", nullptr},
                      {"targets", {"Linear"}},
                      {"weights", weights}};
  return {{"config_groups", {{"group_0", group}}},
          {"format", format},
          {"global_compression_ratio", nullptr},
          {"ignore", ignored},
          {"kv_cache_scheme", nullptr},
          {"quant_method", "compressed-tensors"},
          {"quantization_status", "compressed"},
          {"sparsity_config", json::object()},
          {"transform_config", json::object()}};
}

}  // namespace

json make_quantization_config(SchemeKind kind, const std::vector<std::string>& ignored) {
  switch (kind) {
    case SchemeKind::kNone:
      return nullptr;
    case SchemeKind::kModelOptMxfp8:
      // convert_hf_quant_config_format's output for MXFP8: flat, no config_groups.
      return {{"ignore", ignored},
              {"producer", kProducer},
              {"quant_algo", "MXFP8"},
              {"quant_method", "modelopt"}};
    case SchemeKind::kCtMxfp8:
      return ct_config("mxfp8-quantized", 8, ignored);
    case SchemeKind::kCtMxfp4:
      return ct_config("mxfp4-pack-quantized", 4, ignored);
    case SchemeKind::kFp8Block128:
      // note: both ignore keys: vLLM's Fp8Config reads ignored_layers, transformers' FineGrainedFP8Config
      // modules_to_not_convert.
      return {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"},
              {"ignored_layers", ignored},      {"modules_to_not_convert", ignored},
              {"quant_method", "fp8"},          {"weight_block_size", {128, 128}}};
    case SchemeKind::kCtFp8Block128:
      return nullptr;  // read only: `mxq quantize --to fp8-b128` writes quant_method fp8
  }
  return nullptr;
}

std::optional<json> make_hf_quant_config(SchemeKind kind, const std::vector<std::string>& ignored) {
  if (kind != SchemeKind::kModelOptMxfp8) return std::nullopt;
  // vLLM requires kv_cache_quant_algo and exclude_modules to be present in this nested form.
  return json{{"producer", kProducer},
              {"quantization",
               {{"exclude_modules", ignored},
                {"group_size", 32},
                {"kv_cache_quant_algo", nullptr},
                {"quant_algo", "MXFP8"}}}};
}

std::string values_tensor_name(SchemeKind kind, std::string_view module) {
  return std::string(module) + (kind == SchemeKind::kCtMxfp4 ? ".weight_packed" : ".weight");
}

std::string scales_tensor_name(SchemeKind kind, std::string_view module) {
  switch (kind) {
    case SchemeKind::kNone:
      return "";
    case SchemeKind::kFp8Block128:
      return std::string(module) + ".weight_scale_inv";
    default:
      return std::string(module) + ".weight_scale";
  }
}

}  // namespace mxq
