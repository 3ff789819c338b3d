// The private parts of Qwen3Cuda (model/qwen3_cuda.h) that its two source files share: qwen3_cuda.cpp (load,
// the step, attention and the dense MLP) and qwen3_cuda_moe.cpp (Qwen3MoeSparseMoeBlock). Not for other users.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "cuda/common/check.h"
#include "cuda/linear/linear.h"
#include "cuda/linear/moe_grouped_linear.h"
#include "model/qwen3_cuda.h"

namespace mxq::cuda {

// A launch inside a step (needs `rows` in scope). note: a launcher's cudaErrorInvalidValue names no argument;
// the op name and the step shape do.
#define MXQ_LAUNCH(op, ...)                                                                           \
  do {                                                                                                \
    const cudaError_t mxq_rc_ = (__VA_ARGS__);                                                        \
    if (mxq_rc_ != cudaSuccess) return fail("{}: {} ({} rows)", op, cudaGetErrorName(mxq_rc_), rows); \
  } while (0)

// One linear layer (or one expert of a stacked tensor) as cuda/linear/linear.h runs it.
struct Qwen3Cuda::Lin {
  LinearWeights w;
  const std::string* name = nullptr;  // the store's tensor name, for errors
  double bytes = 0;                   // native weight bytes read per call (the step profile)
};

struct Qwen3Cuda::Weights {
  struct Layer {
    const uint16_t *input_layernorm, *post_attention_layernorm, *q_norm, *k_norm;
    Lin q_proj, k_proj, v_proj, o_proj;
    bool sparse = false;
    Lin gate_proj, up_proj, down_proj;  // Qwen3MLP
    Lin router;                         // mlp.gate
    // mlp.experts: stacked (gate_up[e] is [2I, H]) or one module per expert
    std::vector<Lin> gate_up, down, gate, up;
    // the same experts for the grouped decode linears: [gate_up] or [gate, up] per expert, and down
    std::optional<MoeGroupedWeights> grouped_gate_up, grouped_down;
    double expert_gate_up_bytes = 0, expert_down_bytes = 0;  // per expert (the step profile)
  };
  const uint16_t *embed_tokens = nullptr, *norm = nullptr;
  Lin lm_head;
  std::vector<Layer> layers;
};

struct Qwen3Cuda::Buffers {
  int64_t tokens = 0;  // row capacity of the activations
  // qkv: the q, k and v projections' outputs one after the other, [T, Hq·D] then [T, Hkv·D] twice
  DeviceBuffer residual, normed, qkv, q, attn, hidden, gate, up, act, sel, logits;
  // note: counts, offsets and the active-expert list per layer ([L, E], [L, E + 1], [L, E]), so a profiled
  // step can read every layer's grouping after the step (StepProfiler::late_bytes); the rest is shared
  DeviceBuffer router_logits, moe_ids, moe_weights, moe_counts, moe_offsets, moe_active, moe_sorted,
      moe_row_of, xe, gu, acte, ye;
  DeviceBuffer kv, inv_freq, decode_ws, meta, out;
  void *host_meta = nullptr, *host_out = nullptr;
  size_t meta_bytes = 0, meta_head_bytes = 0, out_bytes = 0;  // head: everything before the block tables
  int32_t *host_offsets = nullptr, *host_sorted = nullptr;    // pinned: MoE grouping read back on the host
  std::vector<uint16_t*> k_cache, v_cache;
};

}  // namespace mxq::cuda
