#include "model/cpu_backend.h"

#include <sys/mman.h>

#include <cassert>
#include <cstring>
#include <utility>
#include <vector>

#include "cpu/attention.h"
#include "cpu/attention_prefill.h"
#include "cpu/dequantize_row.h"
#include "cpu/embedding.h"
#include "cpu/linear.h"
#include "cpu/moe_route.h"
#include "cpu/moe_router.h"
#include "cpu/paged_attention_decode.h"
#include "cpu/paged_kv.h"
#include "cpu/qk_norm_rope_cache.h"
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

// One zeroed anonymous mapping: pages are committed on first write, so a pool sized for `mxq serve`'s whole
// CPU budget costs what its sequences wrote, as lazily allocated blocks would.
class MappedFloats {
 public:
  MappedFloats() = default;
  MappedFloats(MappedFloats&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  MappedFloats& operator=(MappedFloats&&) = delete;
  ~MappedFloats() {
    if (p_) munmap(p_, bytes_);
  }
  static Result<MappedFloats> map(int64_t count) {
    MappedFloats m;
    m.bytes_ = static_cast<size_t>(count) * sizeof(float);
    void* p =
        mmap(nullptr, m.bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return fail("create_kv: cannot map {} bytes for the KV pool", m.bytes_);
    m.p_ = static_cast<float*>(p);
    return m;
  }
  float* get() const { return p_; }

 private:
  float* p_ = nullptr;
  size_t bytes_ = 0;
};

// The step metadata's host arrays at capacity; StepMeta points into them.
struct MetaArrays {
  std::vector<uint64_t> seed, step;
  std::vector<float> temperature, top_p, min_p;
  std::vector<int32_t> top_k, ids, positions, slot_mapping, block_tables, seq_lens, cu_seqlens, counts;
};

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

  Status create_kv(const KvShape& s) override {
    if (s.layers <= 0 || s.kv_heads <= 0 || s.head_dim <= 0 || s.num_blocks <= 0 || s.block_size <= 0 ||
        s.max_blocks <= 0 || s.max_tokens <= 0 || s.max_seqs <= 0)
      return fail(
          "create_kv: every KV shape field must be positive (layers {}, kv_heads {}, head_dim {}, "
          "num_blocks {}, block_size {}, max_blocks {}, max_tokens {}, max_seqs {})",
          s.layers, s.kv_heads, s.head_dim, s.num_blocks, s.block_size, s.max_blocks, s.max_tokens,
          s.max_seqs);
    std::vector<MappedFloats> k, v;
    const int64_t per_layer = s.num_blocks * s.block_size * s.kv_heads * s.head_dim;
    for (int64_t l = 0; l < s.layers; ++l) {
      auto mk = MappedFloats::map(per_layer);
      if (!mk) return tl::unexpected(mk.error());
      auto mv = MappedFloats::map(per_layer);
      if (!mv) return tl::unexpected(mv.error());
      k.push_back(std::move(*mk));
      v.push_back(std::move(*mv));
    }
    kv_ = s;
    ++kv_generation_;
    k_ = std::move(k);
    v_ = std::move(v);
    const auto T = static_cast<size_t>(s.max_tokens), S = static_cast<size_t>(s.max_seqs);
    MetaArrays& a = meta_arrays_;
    a.seed.assign(S, 0), a.step.assign(S, 0), a.temperature.assign(S, 0), a.top_p.assign(S, 0);
    a.min_p.assign(S, 0), a.top_k.assign(S, 0), a.ids.assign(T, 0), a.positions.assign(T, 0);
    a.slot_mapping.assign(T, -1), a.block_tables.assign(S * static_cast<size_t>(s.max_blocks), 0);
    a.seq_lens.assign(S, 0), a.cu_seqlens.assign(S + 1, 0), a.counts.assign(2, 0);
    meta_ = {a.seed.data(),         a.step.data(),         a.temperature.data(), a.top_p.data(),
             a.min_p.data(),        a.top_k.data(),        a.ids.data(),         a.positions.data(),
             a.slot_mapping.data(), a.block_tables.data(), a.seq_lens.data(),    a.cu_seqlens.data(),
             a.counts.data(),       a.counts.data() + 1};
    return {};
  }
  uint64_t kv_generation() const override { return kv_generation_; }
  StepMeta& host_meta() override { return meta_; }

  Status run_step(const ForwardShape& shape, const std::function<Status()>& body) override {
    if (k_.empty()) return fail("run_step: no KV pool (create_kv first)");
    if (shape.seqs < 0 || shape.seqs > kv_.max_seqs || *meta_.num_tokens < 0 ||
        *meta_.num_tokens > kv_.max_tokens)
      return fail("run_step: {} tokens of {} sequences, the step holds at most {} tokens of {} sequences",
                  *meta_.num_tokens, shape.seqs, kv_.max_tokens, kv_.max_seqs);
    shape_ = shape;
    // note: cpu/rope takes int64 positions: widened once per step, not once per layer
    positions_.assign(meta_.positions, meta_.positions + *meta_.num_tokens);
    auto st = body();
    shape_ = {};
    positions_.clear();
    return st;
  }

  Status copy_kv_block(int32_t src, int32_t dst, int32_t slots) override {
    if (k_.empty()) return fail("copy_kv_block: no KV pool (create_kv first)");
    if (src < 0 || src >= kv_.num_blocks || dst < 0 || dst >= kv_.num_blocks || slots < 0 ||
        slots > kv_.block_size)
      return fail("copy_kv_block: {} slots of block {} into block {}, the pool has {} blocks of {} slots",
                  slots, src, dst, kv_.num_blocks, kv_.block_size);
    const int64_t slot_floats = kv_.kv_heads * kv_.head_dim, block_floats = kv_.block_size * slot_floats;
    const auto bytes = static_cast<size_t>(slots * slot_floats) * sizeof(float);
    for (size_t l = 0; l < k_.size(); ++l) {
      std::memmove(k_[l].get() + dst * block_floats, k_[l].get() + src * block_floats, bytes);
      std::memmove(v_[l].get() + dst * block_floats, v_[l].get() + src * block_floats, bytes);
    }
    return {};
  }

  Status qk_norm_rope_cache(int64_t layer, const float* q, const float* k, const float* v, int64_t q_heads,
                            const QTensor& q_norm, const QTensor& k_norm, float eps, float theta,
                            float* q_out) override {
    if (auto st = check_layer("qk_norm_rope_cache", layer); !st) return st;
    const int64_t tokens = *meta_.num_tokens;
    if (static_cast<int64_t>(positions_.size()) != tokens)
      return fail("qk_norm_rope_cache: a step op, called outside run_step");
    const float* kn = vector_f32(k_norm, head_norm_);
    return mxq::qk_norm_rope_cache({.qkv = q,
                                    .k_in = k,
                                    .v_in = v,
                                    .tokens = tokens,
                                    .q_heads = q_heads,
                                    .kv_heads = kv_.kv_heads,
                                    .head_dim = kv_.head_dim,
                                    .q_norm = vector_f32(q_norm, norm_),
                                    .k_norm = kn,
                                    .eps = eps,
                                    .positions = positions_.data(),
                                    .theta = theta,
                                    .slot_mapping = meta_.slot_mapping,
                                    .num_slots = kv_.num_blocks * kv_.block_size,
                                    .q_out = q_out,
                                    .k_cache = k_[layer].get(),
                                    .v_cache = v_[layer].get()},
                                   *pool_);
  }
  Status attention_prefill(int64_t layer, const float* q, int64_t q_heads, float* out) override {
    if (auto st = check_layer("attention_prefill", layer); !st) return st;
    return mxq::attention_prefill(q, meta_.cu_seqlens, meta_.seq_lens, shape_.seqs, q_heads, paged(layer),
                                  out, *pool_);
  }
  Status paged_attention_decode(int64_t layer, const float* q, int64_t q_heads, float* out) override {
    if (auto st = check_layer("paged_attention_decode", layer); !st) return st;
    return mxq::paged_attention_decode(q, meta_.seq_lens, shape_.seqs, q_heads, paged(layer), out, *pool_);
  }

 private:
  Status check_layer(const char* op, int64_t layer) const {
    if (layer < 0 || layer >= static_cast<int64_t>(k_.size()))
      return fail("{}: layer {} outside the KV pool of {} layers", op, layer, k_.size());
    return {};
  }
  PagedKvView paged(int64_t layer) const {
    return {k_[layer].get(), v_[layer].get(), meta_.block_tables, kv_.num_blocks,
            kv_.block_size,  kv_.max_blocks,  kv_.kv_heads,       kv_.head_dim};
  }

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
  std::vector<float> norm_, bias_, act_, head_norm_;
  std::vector<uint16_t> act_bf16_;
  KvShape kv_;
  uint64_t kv_generation_ = 0;
  std::vector<MappedFloats> k_, v_;  // per layer
  MetaArrays meta_arrays_;
  StepMeta meta_{};
  ForwardShape shape_;
  std::vector<int64_t> positions_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads, Format act_quant) {
  assert((act_quant == Format::kBF16 || act_quant == Format::kMXFP8) && "callers parse the mode first");
  return std::make_unique<CpuBackend>(threads, act_quant);
}

}  // namespace mxq
