// The ops a model forward calls, behind one seam so a CUDA backend can run the same model code
// (model/qwen3.cpp). Activations are f32 buffers the backend allocates (host memory on CPU, device memory on
// CUDA); weights are the live QTensors of the WeightStore, read in their own format on every call, so a refit
// (apply_tensor) is visible to the next forward with nothing to rebuild.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "base/error.h"
#include "model/step.h"
#include "model/weight_store.h"

namespace mxq {

// note: shared_ptr<T[]> so a backend can attach its own deleter (cudaFree) without a buffer class per
// backend.
template <class T>
using BackendBuffer = std::shared_ptr<T[]>;

// The paged KV pool, in the CUDA engine's layout (cpu/paged_kv.h): per layer, K and V
// [num_blocks, block_size, kv_heads, head_dim]; and the capacities of the step metadata.
struct KvShape {
  int64_t layers = 0, kv_heads = 0, head_dim = 0;
  int64_t num_blocks = 0, block_size = 0;
  int64_t max_blocks = 0;                // the block tables' width: blocks per sequence
  int64_t max_tokens = 0, max_seqs = 0;  // tokens and sequences of one step
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  virtual BackendBuffer<float> alloc_f32(int64_t count) = 0;  // zero-filled

  // out[i, :] = table[ids[i], :]; ids live on the host. Refuses an id outside the table.
  virtual Status embedding(const int32_t* ids, int64_t count, const QTensor& table, float* out) = 0;
  // y[m, N] = x[m, K] · W^T (+ bias); `expert` picks one matrix of a stacked [E, N, K] weight (-1: not
  // stacked).
  virtual Status linear(const float* x, int64_t m, const QTensor& w, int64_t expert, const QTensor* bias,
                        float* y) = 0;
  virtual void rms_norm(const float* x, int64_t rows, int64_t dim, const QTensor& w, float eps,
                        float* out) = 0;
  // residual += x; out = rms_norm(residual).
  virtual void add_rms_norm(const float* x, float* residual, int64_t rows, int64_t dim, const QTensor& w,
                            float eps, float* out) = 0;
  // Per-head RMSNorm of x [tokens, heads, head_dim] in place (q_norm / k_norm).
  virtual void head_rms_norm(float* x, int64_t tokens, int64_t heads, int64_t head_dim, const QTensor& w,
                             float eps) = 0;
  // positions live on the host.
  virtual Status rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, const int64_t* positions,
                      float theta) = 0;
  // Causal GQA of the last `tokens` queries over a contiguous cache of seq_len entries.
  virtual Status attention(const float* q, int64_t tokens, int64_t q_heads, const float* k_cache,
                           const float* v_cache, int64_t seq_len, int64_t kv_heads, int64_t head_dim,
                           float* out) = 0;
  // out[t, i] = silu(gate[t, i]) * up[t, i] where gate and up rows sit `stride` floats apart in their
  // buffers (stride = width for separate buffers, 2 * width for a fused [gate | up] row).
  virtual void swiglu(const float* gate, const float* up, int64_t tokens, int64_t width, int64_t stride,
                      float* out) = 0;
  // Router softmax + top-k (+ renormalisation) of logits [tokens, experts]; ids and weights come back on the
  // host, [tokens, top_k] each, because the expert loop is driven from the host.
  virtual Status moe_router(const float* logits, int64_t tokens, int64_t experts, int64_t top_k,
                            bool norm_topk_prob, int32_t* ids, float* weights) = 0;
  // dst[i, :] = src[rows[i], :] (rows on the host).
  virtual void gather_rows(const float* src, int64_t width, const int64_t* rows, int64_t count,
                           float* dst) = 0;
  // dst[rows[i], :] += scale[i] * src[i, :] (rows and scale on the host), rows applied in order.
  virtual void scatter_add_rows(const float* src, int64_t width, const int64_t* rows, const float* scale,
                                int64_t count, float* dst) = 0;
  virtual void copy(const float* src, int64_t count, float* dst) = 0;
  virtual void fill_zero(float* dst, int64_t count) = 0;
  // Copies `count` floats of a backend buffer to host memory (logits).
  virtual void to_host(const float* src, int64_t count, float* host_dst) = 0;

  // ---- The step seam (docs/one-forward.md), beside the per-sequence ops above until the one forward lands:
  // a paged KV pool read through the step's block tables, and ops over the step's *num_tokens rows.
  // Load time: allocates the KV pool (zero) and the step metadata at the capacities of `s`, replacing any
  // earlier pool; kv_generation() counts the pools created, so a runner can tell its pool was replaced.
  virtual Status create_kv(const KvShape& s) = 0;
  virtual uint64_t kv_generation() const = 0;
  // The metadata the runner fills before each step (on the CPU the ops read it where it is).
  virtual StepMeta& host_meta() = 0;
  // Runs `body` as one step of `shape`: the step ops inside it read host_meta() and `shape`. Refuses a shape
  // or a *num_tokens beyond the capacities.
  virtual Status run_step(const ForwardShape& shape, const std::function<Status()>& body) = 0;
  // Copies the first `slots` slots of block src into block dst, K and V of every layer (copy-on-write of a
  // partial block).
  virtual Status copy_kv_block(int32_t src, int32_t dst, int32_t slots) = 0;
  // self_attn.q_norm / k_norm, rotary embedding at the step's positions, q into q_out, k and v into the
  // layer's pool at the step's slot_mapping (cpu/qk_norm_rope_cache). q [tokens, q_heads * head_dim],
  // k and v [tokens, kv_heads * head_dim], as the q / k / v projections wrote them.
  virtual Status qk_norm_rope_cache(int64_t layer, const float* q, const float* k, const float* v,
                                    int64_t q_heads, const QTensor& q_norm, const QTensor& k_norm, float eps,
                                    float theta, float* q_out) = 0;
  // Causal GQA of the step's query chunks (shape.seqs sequences: cu_seqlens, seq_lens, block_tables) over
  // the layer's pool: eager_attention_forward.
  virtual Status attention_prefill(int64_t layer, const float* q, int64_t q_heads, float* out) = 0;
  // The same for decode steps: one query per sequence.
  virtual Status paged_attention_decode(int64_t layer, const float* q, int64_t q_heads, float* out) = 0;
};

}  // namespace mxq
