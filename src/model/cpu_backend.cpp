#include "model/cpu_backend.h"

#include <cassert>
#include <cstring>
#include <vector>

#include "cpu/attention.h"
#include "cpu/dequantize_row.h"
#include "cpu/embedding.h"
#include "cpu/linear.h"
#include "cpu/moe_route.h"
#include "cpu/moe_router.h"
#include "cpu/quantize_act.h"
#include "cpu/rms_norm.h"
#include "cpu/rope.h"
#include "cpu/swiglu.h"
#include "format/codec.h"

namespace mxq {

WeightView weight_view(const QTensor& w, int64_t expert) {
  const int64_t rank = static_cast<int64_t>(w.shape.size());
  if (rank == 1)
    return {w.format, 1, w.shape[0], w.values.data(), w.scales.empty() ? nullptr : w.scales.data()};
  const int64_t rows = w.shape[rank - 2], cols = w.shape[rank - 1];
  const int64_t e = expert < 0 ? 0 : expert;
  assert((expert < 0) == (rank == 2) && "stacked weights need an expert index");
  const uint8_t* scales =
      w.scales.empty() ? nullptr : w.scales.data() + e * scales_bytes(w.format, rows, cols);
  return {w.format, rows, cols, w.values.data() + e * values_bytes(w.format, rows, cols), scales};
}

namespace {

class CpuBackend final : public Backend {
 public:
  // note: a private pool only when a thread count is asked for, so tests and benches can pin parallelism
  // while everything else shares default_pool().
  CpuBackend(int threads, Format act_quant) : act_quant_(act_quant) {
    if (threads > 0) own_pool_ = std::make_unique<ThreadPool>(threads);
    pool_ = own_pool_ ? own_pool_.get() : &default_pool();
  }
  std::string_view name() const override { return "cpu"; }

  // note: value-initialised (zeroed), so a KV cache never exposes stale floats to a buggy reader.
  BackendBuffer<float> alloc_f32(int64_t count) override {
    assert(count >= 0);
    return BackendBuffer<float>(new float[static_cast<size_t>(count)]());
  }

  Status embedding(const int32_t* ids, int64_t count, const QTensor& table, float* out) override {
    return mxq::embedding(ids, count, weight_view(table), out);
  }

  Status linear(const float* x, int64_t m, const QTensor& w, int64_t expert, const QTensor* bias,
                float* y) override {
    const float* b = nullptr;
    if (bias) b = vector_f32(*bias, bias_);
    // The W8A8 mode (cuda/linear/linear.h): MX projections see x quantize-dequantized through MXFP8. note: x
    // is rounded to bf16 first, as every W8A8 deployment's activations are (and the CUDA engine's):
    // quantizing the f32 activations instead moves elements near an E4M3 rounding boundary by a whole E4M3
    // step against the CUDA engine (0.18 of the logit scale on the dense engine test, H200).
    if (act_quant_ == Format::kMXFP8 && is_mx(w.format)) {
      const int64_t k = weight_view(w, expert).cols;
      act_bf16_.resize(static_cast<size_t>(m * k));
      act_.resize(act_bf16_.size());
      for (size_t i = 0; i < act_bf16_.size(); ++i) act_bf16_[i] = f32_to_bf16(x[i]);
      if (auto st = fake_quant_mxfp8(act_bf16_.data(), m, k, act_bf16_.data()); !st)
        return fail_in(w.name, st.error());
      for (size_t i = 0; i < act_.size(); ++i) act_[i] = bf16_to_f32(act_bf16_[i]);
      x = act_.data();
    }
    if (auto st = mxq::linear(x, m, weight_view(w, expert), b, y, *pool_); !st)
      return fail_in(w.name, st.error());
    return {};
  }

  void rms_norm(const float* x, int64_t rows, int64_t dim, const QTensor& w, float eps, float* out) override {
    mxq::rms_norm(x, rows, dim, vector_f32(w, norm_), eps, out, *pool_);
  }
  void add_rms_norm(const float* x, float* residual, int64_t rows, int64_t dim, const QTensor& w, float eps,
                    float* out) override {
    mxq::add_rms_norm(x, residual, rows, dim, vector_f32(w, norm_), eps, out, *pool_);
  }
  void head_rms_norm(float* x, int64_t tokens, int64_t heads, int64_t head_dim, const QTensor& w,
                     float eps) override {
    mxq::head_rms_norm(x, tokens, heads, head_dim, vector_f32(w, norm_), eps, *pool_);
  }
  Status rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, const int64_t* positions,
              float theta) override {
    return mxq::rope(x, tokens, heads, head_dim, positions, theta);
  }
  Status attention(const float* q, int64_t tokens, int64_t q_heads, const float* k_cache,
                   const float* v_cache, int64_t seq_len, int64_t kv_heads, int64_t head_dim,
                   float* out) override {
    return mxq::attention(q, tokens, q_heads, k_cache, v_cache, seq_len, kv_heads, head_dim, out, *pool_);
  }
  void swiglu(const float* gate, const float* up, int64_t tokens, int64_t width, int64_t stride,
              float* out) override {
    for (int64_t t = 0; t < tokens; ++t)
      mxq::swiglu(gate + t * stride, up + t * stride, width, out + t * width);
  }
  Status moe_router(const float* logits, int64_t tokens, int64_t experts, int64_t top_k, bool norm_topk_prob,
                    int32_t* ids, float* weights) override {
    return mxq::moe_router(logits, tokens, experts, top_k, norm_topk_prob, ids, weights);
  }
  void gather_rows(const float* src, int64_t width, const int64_t* rows, int64_t count, float* dst) override {
    for (int64_t i = 0; i < count; ++i)
      std::memcpy(dst + i * width, src + rows[i] * width, static_cast<size_t>(width) * sizeof(float));
  }
  void scatter_add_rows(const float* src, int64_t width, const int64_t* rows, const float* scale,
                        int64_t count, float* dst) override {
    // note: HF multiplies expert output by the routing weight first, then index_add_s; same rounding here.
    for (int64_t i = 0; i < count; ++i)
      add_scaled_row(dst + rows[i] * width, src + i * width, scale[i], width);
  }
  void copy(const float* src, int64_t count, float* dst) override {
    std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
  }
  void fill_zero(float* dst, int64_t count) override {
    std::memset(dst, 0, static_cast<size_t>(count) * sizeof(float));
  }
  void to_host(const float* src, int64_t count, float* host_dst) override { copy(src, count, host_dst); }

 private:
  // Decodes a 1-D weight (norm scale, bias) to f32 into `buf` on every call: the bytes may have been refit.
  // note: hidden-sized vectors, a few per layer; the decode is noise next to one projection.
  static const float* vector_f32(const QTensor& w, std::vector<float>& buf) {
    const WeightView v = weight_view(w);
    buf.resize(static_cast<size_t>(v.cols));
    dequantize_row(v, 0, 0, v.cols, buf.data());
    return buf.data();
  }

  std::unique_ptr<ThreadPool> own_pool_;
  ThreadPool* pool_;
  Format act_quant_;
  std::vector<float> norm_, bias_, act_;
  std::vector<uint16_t> act_bf16_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads, Format act_quant) {
  assert((act_quant == Format::kBF16 || act_quant == Format::kMXFP8) && "callers parse the mode first");
  return std::make_unique<CpuBackend>(threads, act_quant);
}

}  // namespace mxq
