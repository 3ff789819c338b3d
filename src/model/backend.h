// The ops a model forward calls, behind one seam so the CPU and CUDA backends run the same model code
// (model/qwen3.cpp, docs/one-forward.md). A step runs over a paged KV pool (KvPool) that its runner owns and
// over activation buffers (Act) the backend allocates: f32 on the CPU (the HF oracle), bf16 between ops on
// CUDA, with the residual stream, logits and router logits f32 on both. Weights are the live QTensors of the
// WeightStore, read in their own format on every call, so a refit (apply_tensor) is visible to the next step
// with nothing to rebuild.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "base/error.h"
#include "model/step.h"
#include "model/weight_store.h"

namespace mxq {

// The paged KV pool, in the CUDA engine's layout (cpu/paged_kv.h): per layer, K and V
// [num_blocks, block_size, kv_heads, head_dim]; and the capacities of the step metadata.
struct KvShape {
  int64_t layers = 0, kv_heads = 0, head_dim = 0;
  int64_t num_blocks = 0, block_size = 0;
  int64_t max_blocks = 0;                // the block tables' width: blocks per sequence
  int64_t max_tokens = 0, max_seqs = 0;  // tokens and sequences of one step
};

// The refusals every backend's pool shares, by name: a shape field that is not positive, slot ids past
// int32; a block copy outside the pool.
Status check_kv_shape(const KvShape& s);
Status check_block_copy(const KvShape& s, int32_t src, int32_t dst, int32_t slots);

// A paged KV pool and the step metadata at its capacities (Backend::create_kv).
class KvPool {
 public:
  virtual ~KvPool() = default;
  virtual const KvShape& shape() const = 0;
  // The metadata the runner fills before each step (on the CPU the ops read it where it is).
  virtual StepMeta& host_meta() = 0;
  // Copies the first `slots` slots of block src into block dst, K and V of every layer (copy-on-write of a
  // partial block).
  virtual Status copy_block(int32_t src, int32_t dst, int32_t slots) = 0;
  // K and V of the given slots (block * block_size + offset) of one layer, as f32 rows of kv_heads * head_dim
  // into host memory, one row per slot (tests, diagnostics).
  virtual Status read_slots(int64_t layer, std::span<const int32_t> slots, float* k, float* v) const = 0;
};

// kAct: the activations between ops (f32 on the CPU, bf16 on CUDA); kF32: f32 on every backend (the
// residual stream, logits, router logits).
enum class ActType : uint8_t { kAct, kF32 };

// An activation buffer of `rows` x `width` elements at capacity, owned by the backend's allocation (shared
// by copies of the handle). The forward never reads it: only ops do.
struct Act {
  std::shared_ptr<void> mem;
  ActType type = ActType::kAct;
  int64_t rows = 0, width = 0;
};

// One projection of linear_parts: y = x · w^T (+ bias).
struct LinearPart {
  const QTensor* w = nullptr;
  const QTensor* bias = nullptr;
  const Act* y = nullptr;
};

// The experts of one Qwen3MoeSparseMoeBlock: stacked (mlp.experts.gate_up_proj [E, 2I, H], down_proj
// [E, H, I]) or one module per expert (gate, up, down: E each).
struct MoeExperts {
  const QTensor *gate_up = nullptr, *down = nullptr;
  std::span<const QTensor* const> gate, up, down_each;
  bool stacked() const { return gate_up != nullptr; }
};
enum class MoeProj : uint8_t { kGateUp, kDown };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // ---- load time
  // A zeroed buffer of rows x width elements of type t.
  virtual Result<Act> alloc(ActType t, int64_t rows, int64_t width) = 0;
  // A KV pool (zero) and the step metadata at the capacities of `s`. Each runner owns its pool, so several
  // engines (or one-sequence Sequences) may share one model and backend (their steps one at a time).
  virtual Result<std::unique_ptr<KvPool>> create_kv(const KvShape& s) = 0;

  // ---- the step
  // Runs `body` as one step of `shape` over `pool` (one of this backend's): the step ops inside it read the
  // pool's metadata and `shape`, and run over the step's token rows. Refuses a shape or a *num_tokens beyond
  // the pool's capacities; a step op called outside run_step refuses.
  virtual Status run_step(KvPool& pool, const ForwardShape& shape, const std::function<Status()>& body) = 0;

  // model.embed_tokens: residual [rows, H] (f32) = table[ids]. Refuses an id outside the table.
  virtual Status embedding(const QTensor& table, const Act& residual) = 0;
  // out = rms_norm(x) · w (x f32: the residual stream).
  virtual Status rms_norm(const Act& x, const QTensor& w, float eps, const Act& out) = 0;
  // residual += x; out = rms_norm(residual) · w.
  virtual Status add_rms_norm(const Act& x, const Act& residual, const QTensor& w, float eps,
                              const Act& out) = 0;
  // y = x · w^T (+ bias), through the weight's own format (and the W8A8 mode, a construction option).
  virtual Status linear(const Act& x, const QTensor& w, const QTensor* bias, const Act& y) = 0;
  // Up to three projections of the same x (q/k/v_proj, gate/up_proj), in one launch where a backend can.
  virtual Status linear_parts(const Act& x, std::span<const LinearPart> parts) = 0;
  // y (f32) = x · w^T for a bf16 weight (mlp.gate, the router logits).
  virtual Status linear_f32(const Act& x, const QTensor& w, const Act& y) = 0;
  // self_attn.q_norm / k_norm, rotary embedding at the step's positions, q into q_out, k and v into the
  // layer's pool at the step's slot_mapping. q [rows, q_heads · head_dim], k and v [rows, kv_heads ·
  // head_dim], as the q / k / v projections wrote them.
  virtual Status qk_norm_rope_cache(int64_t layer, const Act& q, const Act& k, const Act& v,
                                    const QTensor& q_norm, const QTensor& k_norm, float eps, float theta,
                                    const Act& q_out) = 0;
  // eager_attention_forward (causal GQA, head_dim^-0.5) of the step's query chunks (cu_seqlens, seq_lens,
  // block_tables) over the layer's pool.
  virtual Status attention_prefill(int64_t layer, const Act& q, const Act& out) = 0;
  // The same for decode steps: one query per sequence.
  virtual Status paged_attention_decode(int64_t layer, const Act& q, const Act& out) = 0;
  // out = silu(gate) · up, elementwise.
  virtual Status swiglu(const Act& gate, const Act& up, const Act& out) = 0;

  // Qwen3MoeSparseMoeBlock, as one chain per layer; the routing state lives in the backend between the ops.
  // Softmax, top-k and norm_topk_prob of the router logits [rows, E] (f32), and the grouping of the
  // step's (token, choice) entries by expert.
  virtual Status moe_route(int64_t layer, const Act& logits, int64_t top_k, bool norm_topk_prob) = 0;
  // Each expert's projection on its entries, in expert order: kGateUp reads the tokens' x (gathering each
  // entry's token row) and writes [gate | up] per entry; kDown reads x in entry order.
  virtual Status moe_grouped_linear(int64_t layer, const MoeExperts& experts, MoeProj proj, const Act& x,
                                    const Act& y) = 0;
  // silu(gate) · up over every entry of the kGateUp output.
  virtual Status moe_swiglu(int64_t layer, const Act& gate_up, const Act& out) = 0;
  // out[t] = Σ over token t's choices in increasing expert id of weight · y[entry] (HF's index_add_ over the
  // experts hit).
  virtual Status moe_combine(int64_t layer, const Act& y, const Act& out) = 0;

  // lm_head on the step's sampling rows (every row of a decode step, else shape.sample_token_rows):
  // logits [sample_rows, vocab] (f32).
  virtual Status lm_head(const Act& normed, const QTensor& w, const Act& logits) = 0;
  // Copies the first `rows` rows of an f32 buffer to host memory (synchronous).
  virtual Status to_host(const Act& x, int64_t rows, float* host_dst) = 0;
};

}  // namespace mxq
