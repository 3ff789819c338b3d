// Loading a Qwen3 / Qwen3-MoE checkpoint directory into a WeightStore: every scheme formats.md lists, and
// online quantization of a plain checkpoint (bytes identical to what `mxq quantize` writes).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/progress.h"
#include "format/formats.h"
#include "io/config.h"
#include "io/scheme.h"
#include "layout/layout.h"
#include "model/qwen3_weights.h"
#include "model/weight_memory.h"
#include "model/weight_store.h"

namespace mxq {

// Where the weights go and in which native layout (the load target). Empty: host memory, row-major (the CPU
// backend). The CUDA engine gives its device memory and each kernel's layout (engine/cuda_runner.h).
struct LoadTarget {
  // Makes the store's memory (called once per load).
  std::function<Result<std::unique_ptr<WeightMemory>>()> memory;
  // The native layout of one tensor in its final format, or nullopt for the identity layout. It may refuse a
  // tensor (by name) that the target's kernels cannot run: the load then fails before reading any bytes.
  std::function<Result<std::optional<Layout>>(const std::string& name, Format format,
                                              const std::vector<int64_t>& shape)>
      layout;
};

struct LoadOptions {
  // Quantize the projections of a bf16/f16/f32 checkpoint at load (MXFP8, MXFP4 or FP8-B128); refused for a
  // checkpoint that is already quantized.
  std::optional<Format> quantization;
  int threads = 0;      // quantizer threads (0 = hardware threads)
  ProgressFn progress;  // one report per weight; returning false cancels the load
  // Host memory, row-major by default. note: "= {}" keeps aggregate inits that stop at `progress` free of
  // -Wmissing-field-initializers.
  LoadTarget target = {};
};

struct LoadedModel {
  std::string dir;
  ModelConfig config;
  SchemeKind scheme = SchemeKind::kNone;  // as stored in the checkpoint
  Format linear_format = Format::kBF16;   // format the projections run in (after online quantization)
  Format activations = Format::kBF16;     // the activation quantization the checkpoint declares (Scheme)
  std::vector<WeightSpec> specs;
  WeightStore store;  // keyed by the specs' names: "<m>.weight" (or stacked "mlp.experts.gate_up_proj")
};

// Refuses by name: a directory without config.json, an architecture other than Qwen3ForCausalLM /
// Qwen3MoeForCausalLM, anything the scheme detection or the tensor plan refuses, bytes the scheme's policy
// refuses, and --quantization on a quantized checkpoint.
Result<LoadedModel> load_model(const std::string& dir, const LoadOptions& options = {});

}  // namespace mxq
