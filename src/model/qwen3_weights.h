// The tensors a Qwen3 / Qwen3-MoE checkpoint must hold (HF names, logical shapes), and the check that a
// checkpoint holds exactly those under its quantization scheme. The loader and `mxq inspect` share it, so
// whatever loading refuses, inspect refuses the same way (L-21: missing or unexpected tensors are refused).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "io/config.h"
#include "io/scheme.h"
#include "io/tensor_meta.h"

namespace mxq {

struct WeightSpec {
  std::string name;            // "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // logical shape: [N, K] for projections, [E, N, K] for stacked experts
  bool linear = false;         // a projection that quantized schemes may store quantized
};

// Expected tensors for the config. `stacked_experts` selects transformers' fused expert tensors
// (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]) over per-expert projections.
Result<std::vector<WeightSpec>> qwen3_weight_specs(const ModelConfig& cfg, bool stacked_experts);

// Checks that `tensors` holds exactly the expected weights under `scheme`: plain tensors in a float dtype with
// the spec's shape, quantized projections as the scheme's (values, scales) pair with the logical [N, K].
// Returns the specs the checkpoint matched.
Result<std::vector<WeightSpec>> check_qwen3_tensors(const ModelConfig& cfg, const Scheme& scheme,
                                                   const TensorMetaMap& tensors);

}  // namespace mxq
