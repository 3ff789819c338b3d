// What each producer writes, and where it was read:
// - ModelOpt: hf_quant_config.json = {"producer": {...}, "quantization": {"quant_algo": "MXFP8",
//   "kv_cache_quant_algo": ..., "group_size": 32, "exclude_modules": [fnmatch patterns]}}
//   (NVIDIA/Model-Optimizer modelopt/torch/export/quant_utils.py get_quant_config /
//   process_layer_quant_config); config.json's quantization_config = convert_hf_quant_config_format() =
//   {"quant_method": "modelopt", "quant_algo": "MXFP8", "ignore": [...], "producer": {...}} with no
//   config_groups for MXFP8 (modelopt/torch/export/convert_hf_config.py). vLLM's ModelOptMxFp8Config accepts
//   both that flat form and the nested {"quantization": {...}} form, and requires kv_cache_quant_algo and
//   exclude_modules in the nested one (vllm/model_executor/layers/quantization/modelopt.py).
// - compressed-tensors: {"quant_method": "compressed-tensors", "format": "mxfp8-quantized" |
//   "mxfp4-pack-quantized", "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8|4,
//   "type": "float", "strategy": "group", "group_size": 32, "symmetric": true, "dynamic": false,
//   "scale_dtype": "torch.uint8", ...}, "input_activations": null | dynamic}}, "ignore": [...]}
//   (compressed_tensors quant_scheme.py presets MXFP8A16 / MXFP4A16, ModelCompressor.update_config;
//   ignore entries are names or "re:" regexes, utils/match.py match_name). NVFP4 = fp4 with group 16 and
//   F8_E4M3 scales (nvfp4-pack-quantized). Presets MXFP8 / MXFP6A8 declare input_activations dynamic MXFP8
//   (group 32, scale_dtype torch.uint8), MXFP4 declares 4-bit ones (W4A4). FP8_BLOCK: format
//   "float-quantized", weights {"strategy": "block", "block_structure": [128, 128], ...} with a weight_scale
//   in the weight's dtype (scale = amax / 448, a multiplier; calculate_qparams), input_activations dynamic
//   {"strategy": "group", "group_size": 128} (compressed_tensors 0.20 quant_scheme.py, quant_args.py).
// - FP8 block-128: {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
//   "weight_block_size": [128, 128]} + "ignored_layers" (vLLM Fp8Config) or "modules_to_not_convert"
//   (Qwen3-*-FP8, transformers FineGrainedFP8Config); DeepSeek-V3 README_WEIGHTS.md.
#include "io/scheme_config.h"

#include <fnmatch.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include "io/safetensors.h"  // printable

namespace mxq {
namespace {

using json = nlohmann::json;

// note: real ignore lists hold a few hundred names (Qwen3-FP8 ~400); these caps only bound hostile files.
constexpr size_t kMaxPatterns = 1 << 16;
constexpr size_t kMaxPatternChars = 4096;
constexpr uint32_t kRegexMatchLimit = 100000;  // PCRE2 backtracking budget per match

// Python re.match semantics: anchored at the start, not at the end. A pattern PCRE2 cannot compile or
// that runs out of its backtracking budget matches nothing (compile errors are caught at parse time).
bool regex_match_prefix(const std::string& pattern, std::string_view subject) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> code(
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_ANCHORED, &err,
                    &err_off, nullptr),
      &pcre2_code_free);
  if (!code) return false;
  std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> ctx(
      pcre2_match_context_create(nullptr), &pcre2_match_context_free);
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code.get(), nullptr), &pcre2_match_data_free);
  if (!ctx || !md) return false;
  pcre2_set_match_limit(ctx.get(), kRegexMatchLimit);
  pcre2_set_depth_limit(ctx.get(), kRegexMatchLimit);
  return pcre2_match(code.get(), reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0, 0, md.get(),
                     ctx.get()) >= 0;
}

Status check_regex(const std::string& pattern, std::string_view where) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_ANCHORED, &err, &err_off, nullptr);
  if (code == nullptr) return fail("{}: \"re:{}\" is not a valid regular expression", where, pattern);
  pcre2_code_free(code);
  return {};
}

// A list of module names / patterns; absent or null = empty.
Result<std::vector<std::string>> get_name_list(const json& obj, const char* key, std::string_view where) {
  std::vector<std::string> out;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return out;
  if (!it->is_array())
    return fail("{}.{}: expected a list of module names, got {}", where, key, it->type_name());
  if (it->size() > kMaxPatterns) return fail("{}.{}: expected at most {} entries", where, key, kMaxPatterns);
  for (const json& v : *it) {
    if (!v.is_string())
      return fail("{}.{}: expected module names (strings), got {}", where, key, v.type_name());
    std::string s = v.get<std::string>();
    if (s.size() > kMaxPatternChars || s.find('\0') != std::string::npos)
      return fail("{}.{}: entry of {} bytes (or with NUL) is not a module name", where, key, s.size());
    out.push_back(std::move(s));
  }
  return out;
}

std::string get_str(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

Result<DeclaredScheme> parse_modelopt(const json& qc, const json* hf) {
  // Flat form (config.json) or nested {"quantization": {...}} (hf_quant_config.json, older config.json).
  std::string algo;
  std::vector<std::string> ignore;
  auto read_section = [&](const json& obj, std::string_view where) -> Status {
    const json* sec = &obj;
    if (auto it = obj.find("quantization"); it != obj.end()) {
      if (!it->is_object())
        return fail("{}.quantization: expected an object, got {}", where, it->type_name());
      sec = &*it;
    }
    const std::string a = get_str(*sec, "quant_algo");
    if (a.empty()) return fail("{}: missing \"quant_algo\" (expected \"MXFP8\")", where);
    if (!algo.empty() && a != algo)
      return fail("{}: quant_algo \"{}\" contradicts \"{}\" declared elsewhere", where, a, algo);
    algo = a;
    for (const char* key : {"ignore", "exclude_modules"}) {
      auto names = get_name_list(*sec, key, where);
      if (!names) return tl::unexpected(names.error());
      ignore.insert(ignore.end(), names->begin(), names->end());
    }
    if (auto it = sec->find("group_size"); it != sec->end() && !it->is_null() && *it != json(32))
      return fail("{}: group_size {} is not MXFP8's 32", where, it->dump());
    return {};
  };
  if (!qc.is_null())
    if (auto s = read_section(qc, "quantization_config"); !s) return tl::unexpected(s.error());
  if (hf != nullptr)
    if (auto s = read_section(*hf, "hf_quant_config.json"); !s) return tl::unexpected(s.error());
  if (algo != "MXFP8") {
    const char* hint = algo.find("NVFP4") != std::string::npos ? " (NVFP4 is not supported)" : "";
    return fail("ModelOpt quant_algo \"{}\" is not supported{}; mxq reads ModelOpt \"MXFP8\"", algo, hint);
  }
  return DeclaredScheme{SchemeKind::kModelOptMxfp8,
                        {MatchStyle::kGlob, std::move(ignore)},
                        {MatchStyle::kCompressedTensors, {"Linear"}}};
}

// One config group's "weights" entry must be exactly an MX preset; returns the format it names.
Result<SchemeKind> parse_ct_weights(const json& w, std::string_view where) {
  if (!w.is_object()) return fail("{}.weights: expected an object, got {}", where, w.type_name());
  auto want = [&](const char* key, const json& expected) -> Status {
    auto it = w.find(key);
    if (it == w.end() || *it != expected)
      return fail("{}.weights.{}: expected {}, got {}", where, key, expected.dump(),
                  it == w.end() ? std::string("nothing") : it->dump());
    return {};
  };
  if (auto s = want("type", "float"); !s) return tl::unexpected(s.error());
  if (auto s = want("strategy", "group"); !s) return tl::unexpected(s.error());
  auto bits = w.find("num_bits");
  if (bits == w.end() || !(*bits == json(8) || *bits == json(4)))
    return fail("{}.weights.num_bits: expected 8 (MXFP8) or 4 (MXFP4), got {}", where,
                bits == w.end() ? std::string("nothing") : bits->dump());
  const bool fp4 = *bits == json(4);
  const std::string scale_dtype = get_str(w, "scale_dtype");
  if (auto gs = w.find("group_size"); fp4 && gs != w.end() && *gs == json(16))
    return fail("{}: fp4 with group_size 16 is NVFP4, which mxq does not read (MXFP4 has group 32)", where);
  if (fp4 && scale_dtype.find("float8_e4m3") != std::string::npos)
    return fail("{}: fp4 with {} scales is NVFP4, which mxq does not read (MXFP4 scales are torch.uint8)",
                where, scale_dtype);
  if (auto s = want("group_size", 32); !s) return tl::unexpected(s.error());
  if (auto s = want("symmetric", true); !s) return tl::unexpected(s.error());
  if (auto it = w.find("dynamic"); it != w.end() && *it != json(false))
    return fail("{}.weights.dynamic: expected false (static weight scales), got {}", where, it->dump());
  if (!scale_dtype.empty() && scale_dtype != "torch.uint8")
    return fail("{}.weights.scale_dtype: expected \"torch.uint8\" (E8M0), got \"{}\"", where, scale_dtype);
  return fp4 ? SchemeKind::kCtMxfp4 : SchemeKind::kCtMxfp8;
}

// compressed-tensors "float-quantized" is read only as llm-compressor's FP8_BLOCK preset: weights E4M3 in
// 128x128 blocks with a weight_scale multiplier (the quant_method fp8 math). Other strategies are refused by
// name (FP8_DYNAMIC is per-channel, FP8 per-tensor: neither is a format mxq runs).
Status parse_ct_fp8_block_weights(const json& w, std::string_view where) {
  if (!w.is_object()) return fail("{}.weights: expected an object, got {}", where, w.type_name());
  auto shown = [&](const char* key) {
    auto it = w.find(key);
    return it == w.end() ? std::string("nothing") : it->dump().substr(0, 80);
  };
  if (auto it = w.find("strategy"); it == w.end() || *it != "block")
    return fail(
        "{}.weights.strategy: float-quantized is read only with strategy \"block\" and block_structure "
        "[128, 128] (FP8_BLOCK); got strategy {} (per-channel / per-tensor FP8 is not supported)",
        where, shown("strategy"));
  if (auto it = w.find("block_structure"); it == w.end() || *it != json({128, 128}))
    return fail("{}.weights.block_structure: expected [128, 128], got {}", where, shown("block_structure"));
  const std::pair<const char*, json> want[] = {
      {"type", "float"}, {"num_bits", 8}, {"symmetric", true}, {"dynamic", false}};
  for (const auto& [key, expected] : want)
    if (auto it = w.find(key); it == w.end() || *it != expected)
      return fail("{}.weights.{}: expected {} for FP8 block-128, got {}", where, key, expected.dump(), shown(key));
  return {};
}

// One group's input_activations: null (weight-only); for MX weights dynamic MXFP8 per 1x32 (presets MXFP8,
// MXFP6A8: the W8A8 mode, kMXFP8); for FP8 block weights dynamic FP8 per 1x128 token group (FP8_BLOCK,
// kFP8_B128: what quant_method fp8's activation_scheme dynamic means). Refused by name otherwise: static
// scales, 4-bit activations (the MXFP4 preset's W4A4: mxq has no FP4 activation path) and other groupings.
Result<Format> parse_ct_activations(const json& g, SchemeKind kind, std::string_view gw) {
  auto a = g.find("input_activations");
  if (a == g.end() || a->is_null()) return Format::kBF16;
  const std::string shown = a->dump().substr(0, 120);
  if (!a->is_object()) return fail("{}.input_activations: expected null or an object, got {}", gw, shown);
  auto field = [&](const char* key) {
    auto it = a->find(key);
    return it == a->end() ? json() : *it;
  };
  if (field("dynamic") != json(true))
    return fail("{}.input_activations: expected null or dynamic (mxq has no static input scales), got {}", gw,
                shown);
  if (field("num_bits") == json(4))
    return fail(
        "{}.input_activations: num_bits 4 type {} (dynamic 4-bit activations, W4A4) is not supported; mxq runs "
        "activations in bf16 or MXFP8 per 1x32 (W8A8 / W4A8, --activation-quant mxfp8)",
        gw, field("type").dump());
  const bool block = kind == SchemeKind::kCtFp8Block128;
  const int group = block ? 128 : 32;
  if (field("num_bits") != json(8) || field("type") != json("float") || field("strategy") != json("group") ||
      field("group_size") != json(group) || field("symmetric") == json(false))
    return fail(
        "{}.input_activations: expected null or dynamic {} (num_bits 8, type \"float\", strategy \"group\", "
        "group_size {}), got {}",
        gw, block ? "FP8 per 1x128" : "MXFP8", group, shown);
  if (auto sd = field("scale_dtype"); !block && !sd.is_null() && sd != json("torch.uint8"))
    return fail("{}.input_activations.scale_dtype: expected \"torch.uint8\" (E8M0), got {}", gw, sd.dump());
  return block ? Format::kFP8_B128 : Format::kMXFP8;
}

Result<DeclaredScheme> parse_compressed_tensors(const json& qc) {
  const std::string where = "quantization_config";
  for (const char* key : {"sparsity_config", "transform_config"}) {
    auto it = qc.find(key);
    if (it != qc.end() && !it->is_null() && !(it->is_object() && it->empty()))
      return fail("{}.{}: expected empty (mxq applies no sparsity or rotation), got {}", where, key,
                  it->dump().substr(0, 80));
  }
  const std::string top_format = get_str(qc, "format");
  auto groups = qc.find("config_groups");
  if (groups == qc.end() || !groups->is_object() || groups->empty())
    return fail("{}.config_groups: expected at least one group", where);
  if (groups->size() > 64)
    return fail("{}.config_groups: expected at most 64 groups, got {}", where, groups->size());
  DeclaredScheme d{
      SchemeKind::kNone, {MatchStyle::kCompressedTensors, {}}, {MatchStyle::kCompressedTensors, {}}};
  bool first = true;
  for (const auto& [name, g] : groups->items()) {
    const std::string gw = where + ".config_groups." + printable(name);
    if (!g.is_object()) return fail("{}: expected an object, got {}", gw, g.type_name());
    std::string format = get_str(g, "format");
    if (format.empty()) format = top_format;
    if (format == "nvfp4-pack-quantized") return fail("{}: format {} (NVFP4) is not supported", gw, format);
    if (format != "mxfp8-quantized" && format != "mxfp4-pack-quantized" && format != "float-quantized")
      return fail(
          "{}: format \"{}\" is not supported; expected \"mxfp8-quantized\", \"mxfp4-pack-quantized\" or "
          "\"float-quantized\" (FP8 block 128)",
          gw, printable(format));
    auto w = g.find("weights");
    if (w == g.end()) return fail("{}.weights: missing", gw);
    SchemeKind kind = SchemeKind::kCtFp8Block128;
    if (format == "float-quantized") {
      if (auto s = parse_ct_fp8_block_weights(*w, gw); !s) return tl::unexpected(s.error());
    } else {
      auto mx = parse_ct_weights(*w, gw);
      if (!mx) return tl::unexpected(mx.error());
      const SchemeKind named = format == "mxfp8-quantized" ? SchemeKind::kCtMxfp8 : SchemeKind::kCtMxfp4;
      if (*mx != named)
        return fail("{}: format \"{}\" contradicts weights.num_bits {}", gw, format, (*w)["num_bits"].dump());
      kind = *mx;
    }
    if (d.kind != SchemeKind::kNone && d.kind != kind)
      return fail("{}: mixes {} and {} groups; mxq reads one format per checkpoint", where,
                  scheme_name(d.kind), scheme_name(kind));
    d.kind = kind;
    auto act = parse_ct_activations(g, kind, gw);
    if (!act) return tl::unexpected(act.error());
    if (!first && *act != d.activations)
      return fail("{}.input_activations: {} contradicts another group's {}; mxq runs one activation mode", gw,
                  traits(*act).name, traits(d.activations).name);
    d.activations = *act;
    first = false;
    auto targets = get_name_list(g, "targets", gw);
    if (!targets) return tl::unexpected(targets.error());
    if (targets->empty()) return fail("{}.targets: expected at least one target", gw);
    for (const std::string& t : *targets)
      if (t.starts_with("re:"))
        if (auto s = check_regex(t.substr(3), gw + ".targets"); !s) return tl::unexpected(s.error());
    d.targets.patterns.insert(d.targets.patterns.end(), targets->begin(), targets->end());
  }
  auto ignore = get_name_list(qc, "ignore", where);
  if (!ignore) return tl::unexpected(ignore.error());
  for (const std::string& t : *ignore)
    if (t.starts_with("re:"))
      if (auto s = check_regex(t.substr(3), where + ".ignore"); !s) return tl::unexpected(s.error());
  d.ignore.patterns = std::move(*ignore);
  return d;
}

Result<DeclaredScheme> parse_fp8(const json& qc) {
  const std::string where = "quantization_config";
  auto scheme = qc.find("activation_scheme");
  if (scheme == qc.end() || !scheme->is_string())
    return fail("{}.activation_scheme: expected \"dynamic\", got {}", where,
                scheme == qc.end() ? std::string("nothing") : scheme->dump());
  if (*scheme != "dynamic")
    return fail(
        "{}.activation_scheme: expected \"dynamic\" (block-128 FP8 has no static input scales), got {}",
        where, scheme->dump());
  if (auto fmt_it = qc.find("fmt"); fmt_it != qc.end() && !fmt_it->is_null() && *fmt_it != "e4m3")
    return fail("{}.fmt: expected \"e4m3\", got {}", where, fmt_it->dump());
  auto block = qc.find("weight_block_size");
  if (block == qc.end() || block->is_null())
    return fail(
        "{}: quant_method \"fp8\" without weight_block_size is per-tensor FP8, which mxq does not read "
        "(expected weight_block_size [128, 128])",
        where);
  // covers Q-02: the block is a 2-D pair of positive, bounded integers, and mxq's kernels want 128x128.
  if (!block->is_array() || block->size() != 2)
    return fail("{}.weight_block_size: expected 2 dimensions [128, 128], got {}", where,
                block->dump().substr(0, 80));
  for (const json& v : *block)
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (1 << 16))
      return fail("{}.weight_block_size: expected positive integers, got {}", where, block->dump());
  if ((*block)[0] != 128 || (*block)[1] != 128)
    return fail("{}.weight_block_size: expected [128, 128], got {}", where, block->dump());
  DeclaredScheme d{
      SchemeKind::kFp8Block128, {MatchStyle::kExact, {}}, {MatchStyle::kCompressedTensors, {"Linear"}}};
  d.activations = Format::kFP8_B128;  // activation_scheme dynamic: FP8 per 1x128 token group
  for (const char* key : {"ignored_layers", "modules_to_not_convert"}) {
    auto names = get_name_list(qc, key, where);
    if (!names) return tl::unexpected(names.error());
    d.ignore.patterns.insert(d.ignore.patterns.end(), names->begin(), names->end());
  }
  return d;
}

}  // namespace

bool ModulePatterns::matches(std::string_view module) const {
  const std::string name(module);
  for (const std::string& p : patterns) {
    switch (style) {
      case MatchStyle::kExact:
        if (p == name) return true;
        break;
      case MatchStyle::kGlob:
        if (p == name || fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
        break;
      case MatchStyle::kCompressedTensors:
        if (p == name || p == "Linear") return true;
        if (p.starts_with("re:") && regex_match_prefix(p.substr(3), name)) return true;
        break;
    }
  }
  return false;
}

Result<DeclaredScheme> parse_declared_scheme(const json& qc, const json* hf) {
  if (hf != nullptr && !hf->is_object())
    return fail("hf_quant_config.json: expected a JSON object, got {}", hf->type_name());
  if (qc.is_null()) {
    if (hf == nullptr) return DeclaredScheme{};
    return parse_modelopt(qc, hf);
  }
  if (!qc.is_object()) return fail("quantization_config: expected an object, got {}", qc.type_name());
  auto method = qc.find("quant_method");
  if (method == qc.end() || !method->is_string())
    return fail("quantization_config.quant_method: expected a string, got {}",
                method == qc.end() ? std::string("nothing") : method->dump().substr(0, 80));
  const std::string m = method->get<std::string>();
  if (m == "modelopt") return parse_modelopt(qc, hf);
  if (hf != nullptr)
    return fail("hf_quant_config.json (ModelOpt) contradicts quantization_config.quant_method \"{}\"", m);
  if (m == "compressed-tensors") return parse_compressed_tensors(qc);
  if (m == "fp8") return parse_fp8(qc);
  return fail(
      "quantization_config.quant_method \"{}\" is not supported; mxq reads \"modelopt\" (MXFP8), "
      "\"compressed-tensors\" (mxfp8-quantized, mxfp4-pack-quantized, float-quantized block 128) and \"fp8\" "
      "(block 128)",
      m.substr(0, 80));
}

}  // namespace mxq
