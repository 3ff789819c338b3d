// Loading a Qwen3 / Qwen3-MoE checkpoint directory into a WeightStore: every scheme formats.md lists, and
// online quantization of a plain checkpoint (bytes identical to what `mxq quantize` writes).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/progress.h"
#include "format/formats.h"
#include "io/config.h"
#include "io/scheme.h"
#include "model/qwen3_weights.h"
#include "model/weight_store.h"

namespace mxq {

struct LoadOptions {
  // Quantize the projections of a bf16/f16/f32 checkpoint at load (MXFP8, MXFP4 or FP8-B128); refused for a
  // checkpoint that is already quantized.
  std::optional<Format> quantization;
  int threads = 0;      // quantizer threads (0 = hardware threads)
  ProgressFn progress;  // one report per weight; returning false cancels the load
};

struct LoadedModel {
  std::string dir;
  ModelConfig config;
  SchemeKind scheme = SchemeKind::kNone;  // as stored in the checkpoint
  Format linear_format = Format::kBF16;   // format the projections run in (after online quantization)
  std::vector<WeightSpec> specs;
  WeightStore store;  // keyed by the specs' names: "<m>.weight" (or stacked "mlp.experts.gate_up_proj")
};

// Refuses by name: a directory without config.json, an architecture other than Qwen3ForCausalLM /
// Qwen3MoeForCausalLM, anything the scheme detection or the tensor plan refuses, bytes the scheme's policy
// refuses, and --quantization on a quantized checkpoint.
Result<LoadedModel> load_model(const std::string& dir, const LoadOptions& options = {});

}  // namespace mxq
