// The tensor half of scheme detection: every linear module's tensors are checked against the declared scheme
// (scheme_config.cpp), so a config that does not describe the weights is refused by name, not guessed around.
#include "io/scheme.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "format/codec.h"
#include "io/scheme_config.h"

namespace mxq {
namespace {

// Tensors of one module "<m>", by suffix; nullptr when absent.
struct ModuleTensors {
  const std::pair<const std::string, TensorMeta>* weight = nullptr;
  const std::pair<const std::string, TensorMeta>* weight_packed = nullptr;
  const std::pair<const std::string, TensorMeta>* weight_scale = nullptr;
  const std::pair<const std::string, TensorMeta>* weight_scale_inv = nullptr;
  const std::pair<const std::string, TensorMeta>* input_scale = nullptr;
  const std::pair<const std::string, TensorMeta>* global_scale = nullptr;  // NVFP4's weight_global_scale
};

// The suffixes that make a tensor part of a linear module. Anything else (bias, norms' weights are ".weight"
// too) is not a scheme question.
struct Suffix {
  std::string_view text;
  const std::pair<const std::string, TensorMeta>* ModuleTensors::*slot;
};
constexpr Suffix kSuffixes[] = {
    {".weight", &ModuleTensors::weight},
    {".weight_packed", &ModuleTensors::weight_packed},
    {".weight_scale", &ModuleTensors::weight_scale},
    {".weight_scale_inv", &ModuleTensors::weight_scale_inv},
    {".input_scale", &ModuleTensors::input_scale},
    {".weight_global_scale", &ModuleTensors::global_scale},
};

bool is_float_dtype(std::string_view d) { return d == "BF16" || d == "F16" || d == "F32"; }

// Bytes per element of the safetensors dtypes a Qwen3 checkpoint can hold; 0 = unknown (no byte check).
int64_t dtype_bytes(std::string_view d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "BF16" || d == "F16" || d == "I16" || d == "U16") return 2;
  if (d == "F8_E4M3" || d == "F8_E5M2" || d == "F8_E8M0" || d == "U8" || d == "I8" || d == "BOOL") return 1;
  return 0;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// note: 2^59 bounds any element count so bytes (x8 at most) and packed K (x2) stay below 2^63.
constexpr int64_t kMaxElements = int64_t{1} << 59;
Result<int64_t> checked_numel(const std::string& name, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || d > kMaxElements || (d != 0 && n > kMaxElements / d))
      return fail("{}: shape {} is negative or overflows", name, shape_str(shape));
    n *= d;
  }
  return n;
}

// A linear module is a module with a weight of rank >= 2 that is not an embedding table.
bool is_linear(const std::string& module, const ModuleTensors& t) {
  const auto* w = t.weight ? t.weight : t.weight_packed;
  if (w == nullptr || w->second.shape.size() < 2) return false;
  return !module.ends_with("embed_tokens") && !module.ends_with("wte");
}

// Checks the scale of an MX linear: U8 (or F8_E8M0, the same bytes) [..., N, K/32].
Status check_mx_scale(const std::string& module, const ModuleTensors& t, const std::vector<int64_t>& logical,
                      bool fp4) {
  if (t.weight_scale == nullptr)
    return fail("{}: missing {}.weight_scale (expected U8 {})", module, module,
                shape_str({logical.begin(), logical.end() - 1}) + "+[K/32]");
  const TensorMeta& s = t.weight_scale->second;
  if (fp4 && s.dtype == "F8_E4M3")
    return fail("{}: F8_E4M3 scales with fp4 values are NVFP4, which mxq does not read (MXFP4 has U8 scales)",
                t.weight_scale->first);
  if (s.dtype != "U8" && s.dtype != "F8_E8M0")
    return fail("{}: expected dtype U8 (E8M0 scales), got {}", t.weight_scale->first, s.dtype);
  std::vector<int64_t> want = logical;
  want.back() /= 32;
  if (s.shape != want)
    return fail("{}: expected shape {}, got {}", t.weight_scale->first, shape_str(want), shape_str(s.shape));
  return {};
}

// Checks one module that the scheme quantizes and returns its QuantizedLinear. Layout per scheme:
//   MXFP8 (ModelOpt, CT):  weight F8_E4M3 [..., N, K],    weight_scale U8 [..., N, K/32]
//   MXFP4 (CT):            weight_packed U8 [..., N, K/2], weight_scale U8 [..., N, K/32]
//   FP8-B128:              weight F8_E4M3 [..., N, K],    weight_scale_inv F32|BF16 [..., cdiv(N,128),
//   cdiv(K,128)]; compressed-tensors FP8_BLOCK: the same with weight_scale (BF16 or F32, also a multiplier)
// Leading dims are stacked experts; a scale's leading dims must equal the weight's.
Result<QuantizedLinear> check_quantized(SchemeKind kind, const std::string& module, const ModuleTensors& t) {
  if (t.global_scale != nullptr)
    return fail("{}: weight_global_scale is NVFP4's, which mxq does not read", t.global_scale->first);
  if (t.input_scale != nullptr)
    return fail("{}: static input_scale, but {} quantizes activations dynamically (or not at all)",
                t.input_scale->first, scheme_name(kind));
  if (kind == SchemeKind::kCtMxfp4) {
    if (t.weight_packed == nullptr)
      return fail("{}: expected {}.weight_packed U8 [N, K/2] for mxfp4-pack-quantized, got {}", module,
                  module,
                  t.weight ? t.weight->first + " " + t.weight->second.dtype : std::string("no weight"));
    const TensorMeta& v = t.weight_packed->second;
    if (v.dtype != "U8")
      return fail("{}: expected dtype U8 (packed E2M1), got {}", t.weight_packed->first, v.dtype);
    std::vector<int64_t> logical = v.shape;
    if (logical.back() > kMaxElements / 2) return fail("{}: shape overflows", t.weight_packed->first);
    logical.back() *= 2;
    if (logical.back() % 32 != 0)
      return fail("{}: K = {} is not a multiple of 32 (MXFP4 block)", t.weight_packed->first, logical.back());
    if (auto s = check_mx_scale(module, t, logical, true); !s) return tl::unexpected(s.error());
    return QuantizedLinear{Format::kMXFP4, t.weight_packed->first, t.weight_scale->first, logical};
  }
  if (t.weight == nullptr || t.weight_packed != nullptr)
    return fail("{}: expected {}.weight F8_E4M3 for {}, got {}", module, module, scheme_name(kind),
                t.weight_packed ? t.weight_packed->first : std::string("no weight"));
  const TensorMeta& v = t.weight->second;
  if (v.dtype != "F8_E4M3")
    return fail("{}: expected dtype F8_E4M3 for {}, got {}", t.weight->first, scheme_name(kind), v.dtype);
  if (kind == SchemeKind::kFp8Block128 || kind == SchemeKind::kCtFp8Block128) {
    // note: both name a multiplier (x = e4m3 * scale); only the tensor name differs.
    const bool ct = kind == SchemeKind::kCtFp8Block128;
    const auto* scale = ct ? t.weight_scale : t.weight_scale_inv;
    const auto* other = ct ? t.weight_scale_inv : t.weight_scale;
    const char* want_name = ct ? "weight_scale" : "weight_scale_inv";
    if (scale == nullptr)
      return fail("{}: F8_E4M3 weight with {} but no {}.{}", t.weight->first,
                  ct ? "block_structure [128, 128]" : "weight_block_size", module, want_name);
    if (other != nullptr)
      return fail("{}: expected {} only for {}, got {} too", other->first, want_name, scheme_name(kind),
                  ct ? "weight_scale_inv" : "weight_scale");
    const TensorMeta& s = scale->second;
    if (s.dtype != "F32" && s.dtype != "BF16")
      return fail("{}: expected dtype F32 (or BF16, widened), got {}", scale->first, s.dtype);
    const auto rows_cols = scales_shape(Format::kFP8_B128, v.shape[v.shape.size() - 2], v.shape.back());
    std::vector<int64_t> want(v.shape.begin(), v.shape.end() - 2);
    want.insert(want.end(), rows_cols.begin(), rows_cols.end());
    if (s.shape != want)
      return fail("{}: expected shape {} (cdiv by 128 of {}), got {}", scale->first, shape_str(want),
                  shape_str(v.shape), shape_str(s.shape));
    return QuantizedLinear{Format::kFP8_B128, t.weight->first, scale->first, v.shape};
  }
  if (t.weight_scale_inv != nullptr)
    return fail("{}: weight_scale_inv is block-FP8's; {} expects {}.weight_scale", t.weight_scale_inv->first,
                scheme_name(kind), module);
  if (v.shape.back() % 32 != 0)
    return fail("{}: K = {} is not a multiple of 32 (MXFP8 block)", t.weight->first, v.shape.back());
  if (auto s = check_mx_scale(module, t, v.shape, false); !s) return tl::unexpected(s.error());
  return QuantizedLinear{Format::kMXFP8, t.weight->first, t.weight_scale->first, v.shape};
}

// A module the scheme leaves unquantized: a float weight and no scale of any kind (N-16, FP8 refusal 3).
Status check_unquantized(SchemeKind kind, const std::string& module, const ModuleTensors& t, bool listed) {
  const auto* w = t.weight ? t.weight : t.weight_packed;
  if (kind == SchemeKind::kNone && t.weight_scale_inv != nullptr)
    return fail("{}: weight_scale_inv but config.json has no quantization_config with weight_block_size",
                t.weight_scale_inv->first);
  if (!is_float_dtype(w->second.dtype)) {
    if (kind == SchemeKind::kNone)
      return fail(
          "{}: dtype {} but config.json declares no quantization_config (N-16: expected BF16/F16/F32)",
          w->first, w->second.dtype);
    return fail("{}: dtype {} in a module {} leaves unquantized ({})", w->first, w->second.dtype,
                scheme_name(kind),
                listed ? "listed in its ignore list" : "matched by no config group's targets");
  }
  for (const auto* s : {t.weight_scale, t.weight_scale_inv, t.input_scale, t.global_scale}) {
    if (s == nullptr) continue;
    if (kind == SchemeKind::kNone)
      return fail("{}: a scale tensor but config.json declares no quantization_config", s->first);
    return fail("{}: module {} is not converted ({}) but ships a scale", s->first, module,
                listed ? "listed in the ignore list" : "float weight");
  }
  return {};
}

// Which byte rule a tensor gets: its dtype decides, except that U8 / BF16 / F32 scales get the scale rules
// (E8M0 NaN, positive multiplier) rather than the plain-value ones.
Result<ByteCheck> byte_check_for(const std::string& name, const TensorMeta& meta, bool is_scale) {
  auto numel = checked_numel(name, meta.shape);
  if (!numel) return tl::unexpected(numel.error());
  const int64_t size = dtype_bytes(meta.dtype);
  ByteRule rule = ByteRule::kLengthOnly;
  if (meta.dtype == "F8_E4M3") rule = ByteRule::kE4M3;
  if (meta.dtype == "F8_E8M0" || (is_scale && meta.dtype == "U8")) rule = ByteRule::kE8M0;
  if (meta.dtype == "BF16") rule = is_scale ? ByteRule::kScaleBF16 : ByteRule::kFloatBF16;
  if (meta.dtype == "F32") rule = is_scale ? ByteRule::kScaleF32 : ByteRule::kFloatF32;
  if (meta.dtype == "F16") rule = ByteRule::kFloatF16;
  return ByteCheck{rule, *numel * size};
}

}  // namespace

std::string_view scheme_name(SchemeKind kind) {
  switch (kind) {
    case SchemeKind::kNone:
      return "none";
    case SchemeKind::kModelOptMxfp8:
      return "modelopt-mxfp8";
    case SchemeKind::kCtMxfp8:
      return "compressed-tensors-mxfp8";
    case SchemeKind::kCtMxfp4:
      return "compressed-tensors-mxfp4";
    case SchemeKind::kFp8Block128:
      return "fp8-block128";
    case SchemeKind::kCtFp8Block128:
      return "compressed-tensors-fp8-block128";
  }
  return "unknown";
}

Result<Scheme> detect_scheme(const nlohmann::json& quantization_config, const nlohmann::json* hf_quant_config,
                             const TensorMetaMap& tensors) {
  auto declared = parse_declared_scheme(quantization_config, hf_quant_config);
  if (!declared) return tl::unexpected(declared.error());
  Scheme scheme;
  scheme.kind = declared->kind;
  scheme.activations = declared->activations;

  // Group tensors by module; scale-like suffixes on a tensor that has no module weight still count (a stray
  // scale is refused below). note: the longest suffix wins, ".weight_scale" before ".weight".
  // Shapes first: every later product and cdiv works on dims that are known non-negative and bounded.
  for (const auto& [name, meta] : tensors)
    if (auto n = checked_numel(name, meta.shape); !n) return tl::unexpected(n.error());

  std::map<std::string, ModuleTensors> modules;
  for (const auto& entry : tensors) {
    const std::string& name = entry.first;
    const Suffix* best = nullptr;
    for (const Suffix& s : kSuffixes)
      if (name.ends_with(s.text) && name.size() > s.text.size() &&
          (!best || s.text.size() > best->text.size()))
        best = &s;
    if (best == nullptr) continue;
    modules[name.substr(0, name.size() - best->text.size())].*(best->slot) = &entry;
  }

  // Each linear module is in exactly one of three states: quantized as the scheme says (-> linears),
  // deliberately left in float (-> ignored), or refused. Non-linear tensors must simply be float.
  bool any_float_linear = false;
  std::optional<Error> float_but_targeted;
  for (const auto& [module, t] : modules) {
    if (t.weight == nullptr && t.weight_packed == nullptr) {
      for (const auto* s : {t.weight_scale, t.weight_scale_inv, t.input_scale, t.global_scale})
        if (s != nullptr) return fail("{}: a scale tensor without {}.weight", s->first, module);
      continue;
    }
    const std::string& wname = (t.weight ? t.weight : t.weight_packed)->first;
    if (t.weight && t.weight_packed)
      return fail("{}: both .weight and .weight_packed; expected one values tensor", module);
    if (!is_linear(module, t)) {
      const auto& meta = (t.weight ? t.weight : t.weight_packed)->second;
      if (!is_float_dtype(meta.dtype) || t.weight_scale || t.weight_scale_inv || t.input_scale)
        return fail(
            "{}: dtype {} (with or without a scale) for a tensor mxq does not quantize; expected a float "
            "weight without scales",
            wname, meta.dtype);
      continue;
    }
    const auto& wmeta = (t.weight ? t.weight : t.weight_packed)->second;
    // note: under FP8 block-128 vLLM never quantizes lm_head or a MoE router (mlp.gate), and transformers'
    // FineGrainedFP8 save leaves them in 16 bits without listing them in modules_to_not_convert: a float one
    // counts as listed. A decoder projection left in float still must be listed.
    const bool fp8_unconverted = declared->kind == SchemeKind::kFp8Block128 && is_float_dtype(wmeta.dtype) &&
                                 (module == "lm_head" || module.ends_with(".mlp.gate"));
    const bool listed = declared->ignore.matches(module) || fp8_unconverted;
    const bool targeted = declared->kind != SchemeKind::kNone && !listed && declared->targets.matches(module);
    if (targeted && !is_float_dtype(wmeta.dtype)) {
      auto q = check_quantized(declared->kind, module, t);
      if (!q) return tl::unexpected(q.error());
      scheme.linears.emplace(module, std::move(*q));
      continue;
    }
    if (targeted && (t.weight_scale || t.weight_scale_inv))
      return fail("{}: dtype {} next to a scale (N-16: expected {} values)", wname, wmeta.dtype,
                  scheme.kind == SchemeKind::kCtMxfp4 ? "U8 packed" : "F8_E4M3");
    if (auto s = check_unquantized(declared->kind, module, t, listed); !s) return tl::unexpected(s.error());
    // note: reported after the walk, so that a checkpoint with no quantized weight at all gets Q-01's
    // message.
    if (targeted && !float_but_targeted)
      float_but_targeted =
          Error{fmt::format("{}: dtype {} but {} quantizes this module (not in its ignore list); "
                            "expected {}",
                            wname, wmeta.dtype, scheme_name(declared->kind),
                            declared->kind == SchemeKind::kCtMxfp4 ? "U8 weight_packed" : "F8_E4M3")};
    if (!any_float_linear)
      scheme.format = wmeta.dtype == "F16"   ? Format::kF16
                      : wmeta.dtype == "F32" ? Format::kF32
                                             : Format::kBF16;
    any_float_linear = true;
    if (declared->kind != SchemeKind::kNone) scheme.ignored.push_back(module);
  }
  if (declared->kind != SchemeKind::kNone) {
    // covers Q-01: a quantization_config over weights that are all 16-bit.
    if (scheme.linears.empty())
      return fail(
          "quantization_config declares {} but no linear weight is quantized (all are float): "
          "config/weights mismatch",
          scheme_name(declared->kind));
    if (float_but_targeted) return tl::unexpected(*float_but_targeted);
    scheme.format = scheme.linears.begin()->second.format;
  }

  // Byte rules for every tensor, so the loader can call check_tensor_bytes on whatever it reads.
  for (const auto& [name, meta] : tensors) {
    if (dtype_bytes(meta.dtype) == 0) continue;
    const bool is_scale = name.ends_with(".weight_scale") || name.ends_with(".weight_scale_inv") ||
                          name.ends_with(".input_scale");
    auto check = byte_check_for(name, meta, is_scale);
    if (!check) return tl::unexpected(check.error());
    scheme.byte_checks.emplace(name, *check);
  }
  return scheme;
}

Status check_tensor_bytes(const Scheme& scheme, const std::string& tensor, std::span<const uint8_t> bytes) {
  auto it = scheme.byte_checks.find(tensor);
  if (it == scheme.byte_checks.end()) return {};
  const ByteCheck& c = it->second;
  if (static_cast<int64_t>(bytes.size()) != c.bytes)
    return fail("{}: expected {} bytes, got {}", tensor, c.bytes, bytes.size());
  const size_t n = bytes.size();
  // note: values are read with memcpy, never through typed pointers: the mmapped bytes may be unaligned
  // (L-18).
  auto u16 = [&](size_t i) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return h;
  };
  auto f32 = [&](size_t i) {
    float f;
    std::memcpy(&f, bytes.data() + 4 * i, 4);
    return f;
  };
  switch (c.rule) {
    case ByteRule::kLengthOnly:
      return {};
    case ByteRule::kE4M3:
      // covers Q-08: NaN codes are refused (policy), there is no Inf in E4M3.
      for (size_t i = 0; i < n; ++i)
        if ((bytes[i] & 0x7F) == 0x7F)
          return fail("{}: element {} is an E4M3 NaN code 0x{:02X}", tensor, i, bytes[i]);
      return {};
    case ByteRule::kE8M0:
      // covers Q-07: 0xFF is NaN and refused; 0x00 is the legal scale 2^-127.
      for (size_t i = 0; i < n; ++i)
        if (bytes[i] == 0xFF) return fail("{}: scale {} is 0xFF (E8M0 NaN); expected 0x00..0xFE", tensor, i);
      return {};
    case ByteRule::kScaleF32:
      for (size_t i = 0; i < n / 4; ++i)
        if (float f = f32(i); !std::isfinite(f) || f <= 0)
          return fail("{}: scale {} is {}; expected a positive finite multiplier", tensor, i, f);
      return {};
    case ByteRule::kScaleBF16:
      for (size_t i = 0; i < n / 2; ++i)
        if (float f = bf16_to_f32(u16(i)); !std::isfinite(f) || f <= 0)
          return fail("{}: scale {} is {}; expected a positive finite multiplier", tensor, i, f);
      return {};
    case ByteRule::kFloatBF16:
      for (size_t i = 0; i < n / 2; ++i)
        if (!std::isfinite(bf16_to_f32(u16(i)))) return fail("{}: element {} is NaN or Inf", tensor, i);
      return {};
    case ByteRule::kFloatF16:
      for (size_t i = 0; i < n / 2; ++i)
        if ((u16(i) & 0x7C00) == 0x7C00) return fail("{}: element {} is NaN or Inf", tensor, i);
      return {};
    case ByteRule::kFloatF32:
      for (size_t i = 0; i < n / 4; ++i)
        if (!std::isfinite(f32(i))) return fail("{}: element {} is NaN or Inf", tensor, i);
      return {};
  }
  return {};
}

// vLLM's create_weights checks the same per-partition divisibility (fp8.py, mxfp8.py); with tp = 1 only the
// whole-tensor rules of detect_scheme apply (a short final FP8-B128 block is legal).
Status check_partitions(const Scheme& scheme, int64_t tp_size) {
  if (tp_size < 1) return fail("tensor-parallel size {} must be >= 1", tp_size);
  for (const auto& [module, q] : scheme.linears) {
    const FormatTraits& tr = traits(q.format);
    // note: o_proj and down_proj are row-parallel (split along K); every other linear splits along N.
    const bool row_parallel = module.ends_with("o_proj") || module.ends_with("down_proj");
    const int64_t dim = row_parallel ? q.shape.back() : q.shape[q.shape.size() - 2];
    const int64_t block = row_parallel ? tr.block_cols : tr.block_rows;
    if (dim % tp_size != 0)
      return fail("{}: {} = {} does not split over {} ranks", q.values, row_parallel ? "K" : "N", dim,
                  tp_size);
    if (tp_size > 1 && (dim / tp_size) % block != 0)
      return fail("{}: per-rank {} = {} is not a multiple of the {} block {}", q.values,
                  row_parallel ? "K" : "N", dim / tp_size, tr.name, block);
  }
  return {};
}

}  // namespace mxq
