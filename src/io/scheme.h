// Quantization scheme of a checkpoint, decided from config.json's quantization_config (+
// hf_quant_config.json) AND the tensors' dtypes and shapes, never from one alone (spec/formats.md,
// "Checkpoint schemes mxq reads"). Everything outside the five schemes below is refused by name. The writer
// half produces the configs mxq writes for `mxq quantize`; detect_scheme accepts exactly what it writes.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "format/formats.h"
#include "io/tensor_meta.h"

namespace mxq {

// kCtFp8Block128: compressed-tensors float-quantized, strategy block [128, 128] (llm-compressor FP8_BLOCK): the
// math of kFp8Block128 with <m>.weight_scale (a multiplier, usually BF16) in place of weight_scale_inv.
enum class SchemeKind : uint8_t { kNone, kModelOptMxfp8, kCtMxfp8, kCtMxfp4, kFp8Block128, kCtFp8Block128 };

// The tensors of one quantized linear module "<m>".
struct QuantizedLinear {
  Format format;
  std::string values;          // "<m>.weight" or "<m>.weight_packed"
  std::string scales;          // "<m>.weight_scale" or "<m>.weight_scale_inv"
  std::vector<int64_t> shape;  // logical [..., N, K] in elements (K unpacked); leading dims = stacked experts
};

// What check_tensor_bytes verifies for one tensor besides its byte count.
enum class ByteRule : uint8_t {
  kLengthOnly,  // packed E2M1 and integer tensors: every byte pattern is a value
  kE4M3,        // refuse NaN codes 0x7F / 0xFF
  kE8M0,        // refuse 0xFF (NaN); 0x00 is accepted as 2^-127
  kScaleF32,    // FP8-B128 weight_scale_inv: finite and > 0
  kScaleBF16,
  kFloatBF16,  // unquantized tensors: refuse NaN / Inf
  kFloatF16,
  kFloatF32,
};

struct ByteCheck {
  ByteRule rule;
  int64_t bytes;  // exact size the tensor must have
};

struct Scheme {
  SchemeKind kind = SchemeKind::kNone;
  Format format = Format::kBF16;     // quantized format; for kNone the dtype of the linear weights
  // Dynamic input-activation quantization the checkpoint declares: kMXFP8 when a compressed-tensors group
  // has input_activations MXFP8 per 1x32 (presets MXFP8, MXFP6A8: W8A8; run by default, --activation-quant
  // overrides), kFP8_B128 for FP8_BLOCK's per-1x128 FP8 (as quant_method fp8's), else kBF16 (weight-only).
  Format activations = Format::kBF16;
  std::vector<std::string> ignored;  // linear modules left unquantized, resolved to names, sorted
  std::map<std::string, QuantizedLinear> linears;  // module "<m>" -> its tensors
  std::map<std::string, ByteCheck> byte_checks;    // every tensor of the checkpoint with a known dtype
};

std::string_view scheme_name(SchemeKind kind);

// `quantization_config` is null when config.json has none; `hf_quant_config` is null when the file is absent.
Result<Scheme> detect_scheme(const nlohmann::json& quantization_config, const nlohmann::json* hf_quant_config,
                             const TensorMetaMap& tensors);

// on the bytes of `tensor` once read: scale byte 0xFF refused (0x00 accepted as 2^-127),
// E4M3 NaN codes refused, NaN / Inf refused in float tensors, non-positive FP8-B128 scales refused.
Status check_tensor_bytes(const Scheme& scheme, const std::string& tensor, std::span<const uint8_t> bytes);

// with the weights split over `tp_size` ranks (column-parallel: N; row-parallel o_proj / down_proj:
// K), each partition must hold whole scale blocks.
Status check_partitions(const Scheme& scheme, int64_t tp_size);

// ---- writer side (scheme_writer.cpp), used by `mxq quantize` ----
// config.json's quantization_config for `kind` (null for kNone).
nlohmann::json make_quantization_config(SchemeKind kind, const std::vector<std::string>& ignored);
// hf_quant_config.json, written only for ModelOpt.
std::optional<nlohmann::json> make_hf_quant_config(SchemeKind kind, const std::vector<std::string>& ignored);
// Names of the values / scales tensors of module <m> ("<m>.weight_packed", "<m>.weight_scale_inv", ...);
// scales_tensor_name is "" for kNone.
std::string values_tensor_name(SchemeKind kind, std::string_view module);
std::string scales_tensor_name(SchemeKind kind, std::string_view module);

}  // namespace mxq
