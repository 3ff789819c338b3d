// The ops a model forward calls, behind one seam so a CUDA backend can run the same model code
// (model/qwen3.cpp). Activations are f32 buffers the backend allocates (host memory on CPU, device memory on
// CUDA); weights are the live QTensors of the WeightStore, read in their own format on every call, so a refit
// (apply_tensor) is visible to the next forward with nothing to rebuild.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "base/error.h"
#include "model/weight_store.h"

namespace mxq {

// note: shared_ptr<T[]> so a backend can attach its own deleter (cudaFree) without a buffer class per
// backend.
template <class T>
using BackendBuffer = std::shared_ptr<T[]>;

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
};

}  // namespace mxq
