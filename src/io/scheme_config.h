// The config half of scheme detection: what quantization_config / hf_quant_config.json declare, checked
// key by key against what each producer writes. detect_scheme (scheme.cpp) then checks it against the
// tensors.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "io/scheme.h"

namespace mxq {

// How a producer's module lists (ignore / targets) name modules.
enum class MatchStyle : uint8_t {
  kExact,              // FP8 block-128: ignored_layers / modules_to_not_convert hold exact module names
  kGlob,               // ModelOpt: fnmatch patterns ("*.mlp.gate", "lm_head")
  kCompressedTensors,  // exact names, or "re:<regex>" matched at the start of the name (Python re.match)
};

struct ModulePatterns {
  MatchStyle style = MatchStyle::kExact;
  std::vector<std::string> patterns;
  // "Linear" in a compressed-tensors targets list is the class every linear module has.
  bool matches(std::string_view module) const;
};

struct DeclaredScheme {
  SchemeKind kind = SchemeKind::kNone;
  ModulePatterns ignore;   // modules the producer left unquantized
  ModulePatterns targets;  // modules a compressed-tensors config group quantizes; {"Linear"} otherwise
  Format activations = Format::kBF16;  // Scheme::activations
};

// Refuses every config mxq does not read, naming the key and the value it expected.
Result<DeclaredScheme> parse_declared_scheme(const nlohmann::json& quantization_config,
                                             const nlohmann::json* hf_quant_config);

}  // namespace mxq
