#include "model/cpu_backend.h"

#include <sys/mman.h>

#include <cassert>
#include <cstring>
#include <utility>
#include <vector>

#include "cpu/attention_prefill.h"
#include "cpu/dequantize_row.h"
#include "cpu/embedding.h"
#include "cpu/linear.h"
#include "cpu/moe_grouped_linear.h"
#include "cpu/moe_route.h"
#include "cpu/paged_attention_decode.h"
#include "cpu/paged_kv.h"
#include "cpu/qk_norm_rope_cache.h"
#include "cpu/quantize_act.h"
#include "cpu/rms_norm.h"
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

// The CPU KV pool: per layer, K and V f32 [num_blocks, block_size, kv_heads, head_dim] (the CUDA layout,
// cpu/paged_kv.h), each a zeroed anonymous mapping; the step metadata's host arrays.
class CpuKvPool final : public KvPool {
 public:
  static Result<std::unique_ptr<CpuKvPool>> create(const KvShape& s) {
    if (auto st = check_kv_shape(s); !st) return tl::unexpected(st.error());
    std::unique_ptr<CpuKvPool> p(new CpuKvPool());
    const int64_t per_layer = s.num_blocks * s.block_size * s.kv_heads * s.head_dim;
    for (int64_t l = 0; l < s.layers; ++l) {
      auto mk = MappedFloats::map(per_layer);
      if (!mk) return tl::unexpected(mk.error());
      auto mv = MappedFloats::map(per_layer);
      if (!mv) return tl::unexpected(mv.error());
      p->k_.push_back(std::move(*mk));
      p->v_.push_back(std::move(*mv));
    }
    p->shape_ = s;
    const auto T = static_cast<size_t>(s.max_tokens), S = static_cast<size_t>(s.max_seqs);
    MetaArrays& a = p->arrays_;
    a.seed.assign(S, 0), a.step.assign(S, 0), a.temperature.assign(S, 0), a.top_p.assign(S, 0);
    a.min_p.assign(S, 0), a.top_k.assign(S, 0), a.ids.assign(T, 0), a.positions.assign(T, 0);
    a.slot_mapping.assign(T, -1), a.block_tables.assign(S * static_cast<size_t>(s.max_blocks), 0);
    a.seq_lens.assign(S, 0), a.cu_seqlens.assign(S + 1, 0), a.counts.assign(2, 0);
    p->meta_ = {a.seed.data(),         a.step.data(),         a.temperature.data(), a.top_p.data(),
                a.min_p.data(),        a.top_k.data(),        a.ids.data(),         a.positions.data(),
                a.slot_mapping.data(), a.block_tables.data(), a.seq_lens.data(),    a.cu_seqlens.data(),
                a.counts.data(),       a.counts.data() + 1};
    return p;
  }

  const KvShape& shape() const override { return shape_; }
  StepMeta& host_meta() override { return meta_; }

  Status copy_block(int32_t src, int32_t dst, int32_t slots) override {
    const KvShape& s = shape_;
    if (auto st = check_block_copy(s, src, dst, slots); !st) return st;
    const int64_t block_floats = s.block_size * row();
    const auto bytes = static_cast<size_t>(slots * row()) * sizeof(float);
    for (size_t l = 0; l < k_.size(); ++l) {
      std::memmove(k_[l].get() + dst * block_floats, k_[l].get() + src * block_floats, bytes);
      std::memmove(v_[l].get() + dst * block_floats, v_[l].get() + src * block_floats, bytes);
    }
    return {};
  }

  Status read_slots(int64_t layer, std::span<const int32_t> slots, float* k, float* v) const override {
    if (auto st = check_layer("read_slots", layer); !st) return st;
    const int64_t n = row(), num_slots = shape_.num_blocks * shape_.block_size;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] < 0 || slots[i] >= num_slots)
        return fail("read_slots: slot {} outside the pool of {} slots", slots[i], num_slots);
      std::memcpy(k + static_cast<int64_t>(i) * n, k_[layer].get() + slots[i] * n, n * sizeof(float));
      std::memcpy(v + static_cast<int64_t>(i) * n, v_[layer].get() + slots[i] * n, n * sizeof(float));
    }
    return {};
  }

  Status check_layer(const char* op, int64_t layer) const {
    if (layer < 0 || layer >= static_cast<int64_t>(k_.size()))
      return fail("{}: layer {} outside the KV pool of {} layers", op, layer, k_.size());
    return {};
  }
  float* k(int64_t layer) const { return k_[layer].get(); }
  float* v(int64_t layer) const { return v_[layer].get(); }
  PagedKvView paged(int64_t layer) const {
    return {k_[layer].get(),   v_[layer].get(),   meta_.block_tables, shape_.num_blocks,
            shape_.block_size, shape_.max_blocks, shape_.kv_heads,    shape_.head_dim};
  }

 private:
  CpuKvPool() = default;
  int64_t row() const { return shape_.kv_heads * shape_.head_dim; }

  KvShape shape_;
  std::vector<MappedFloats> k_, v_;  // per layer
  MetaArrays arrays_;
  StepMeta meta_{};
};

// The routing state of the MoE layer being run (moe_route to moe_combine), entries numbered as cpu/moe_route.
struct MoeState {
  int64_t layer = -1, tokens = 0, top_k = 0, experts = 0, entries = 0;
  int64_t gate_up_parts = 1;  // 2: one module per expert, gate rows of every entry then up rows
  std::vector<int32_t> ids, counts, offsets, sorted_rows, row_of;
  std::vector<float> weights;
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

  // note: value-initialised (zeroed), so no op ever reads stale floats of another buffer.
  Result<Act> alloc(ActType t, int64_t rows, int64_t width) override {
    if (rows < 0 || width < 0) return fail("alloc: {} x {} elements", rows, width);
    std::shared_ptr<float[]> mem(new float[static_cast<size_t>(std::max<int64_t>(rows * width, 1))]());
    return Act{std::static_pointer_cast<void>(std::shared_ptr<float>(mem, mem.get())), t, rows, width};
  }

  Result<std::unique_ptr<KvPool>> create_kv(const KvShape& s) override {
    auto p = CpuKvPool::create(s);
    if (!p) return tl::unexpected(p.error());
    return std::unique_ptr<KvPool>(std::move(*p));
  }

  Status run_step(KvPool& pool, const ForwardShape& shape, const std::function<Status()>& body) override {
    auto* p = dynamic_cast<CpuKvPool*>(&pool);
    if (!p) return fail("run_step: the KV pool is not one of the cpu backend's");
    const KvShape& kv = p->shape();
    const StepMeta& m = p->host_meta();
    if (shape.seqs < 0 || shape.seqs > kv.max_seqs || *m.num_tokens < 0 || *m.num_tokens > kv.max_tokens)
      return fail("run_step: {} tokens of {} sequences, the step holds at most {} tokens of {} sequences",
                  *m.num_tokens, shape.seqs, kv.max_tokens, kv.max_seqs);
    kv_ = p;
    shape_ = shape;
    rows_ = *m.num_tokens;
    // note: cpu/rope takes int64 positions: widened once per step, not once per layer
    positions_.assign(m.positions, m.positions + rows_);
    auto st = body();
    kv_ = nullptr;
    shape_ = {};
    rows_ = 0;
    positions_.clear();
    moe_.layer = -1;
    return st;
  }

  Status embedding(const QTensor& table, const Act& residual) override {
    if (auto st = check("embedding", {{&residual, weight_view(table).cols}}); !st) return st;
    return mxq::embedding(kv_->host_meta().ids, rows_, weight_view(table), f32(residual));
  }

  Status rms_norm(const Act& x, const QTensor& w, float eps, const Act& out) override {
    const int64_t h = w.shape[0];
    if (auto st = check("rms_norm", {{&x, h}, {&out, h}}); !st) return st;
    mxq::rms_norm(f32(x), rows_, h, vector_f32(w, norm_), eps, f32(out), *pool_);
    return {};
  }
  Status add_rms_norm(const Act& x, const Act& residual, const QTensor& w, float eps,
                      const Act& out) override {
    const int64_t h = w.shape[0];
    if (auto st = check("add_rms_norm", {{&x, h}, {&residual, h}, {&out, h}}); !st) return st;
    mxq::add_rms_norm(f32(x), f32(residual), rows_, h, vector_f32(w, norm_), eps, f32(out), *pool_);
    return {};
  }

  Status linear(const Act& x, const QTensor& w, const QTensor* bias, const Act& y) override {
    const WeightView v = weight_view(w);
    if (auto st = check(w.name.c_str(), {{&x, v.cols}, {&y, v.rows}}); !st) return st;
    return run_linear(f32(x), rows_, w, v, bias, f32(y));
  }
  Status linear_parts(const Act& x, std::span<const LinearPart> parts) override {
    for (const LinearPart& p : parts)
      if (auto st = linear(x, *p.w, p.bias, *p.y); !st) return st;
    return {};
  }
  Status linear_f32(const Act& x, const QTensor& w, const Act& y) override {
    return linear(x, w, nullptr, y);
  }

  Status qk_norm_rope_cache(int64_t layer, const Act& q, const Act& k, const Act& v, const QTensor& q_norm,
                            const QTensor& k_norm, float eps, float theta, const Act& q_out) override {
    if (auto st = check_layer("qk_norm_rope_cache", layer); !st) return st;
    const KvShape& kv = kv_->shape();
    const int64_t kvw = kv.kv_heads * kv.head_dim;
    if (auto st = check("qk_norm_rope_cache", {{&k, kvw}, {&v, kvw}, {&q_out, q.width}}); !st) return st;
    if (q.width % kv.head_dim != 0)
      return fail("qk_norm_rope_cache: q width {} is not whole heads of {}", q.width, kv.head_dim);
    const StepMeta& m = kv_->host_meta();
    const float* kn = vector_f32(k_norm, head_norm_);
    return mxq::qk_norm_rope_cache({.qkv = f32(q),
                                    .k_in = f32(k),
                                    .v_in = f32(v),
                                    .tokens = rows_,
                                    .q_heads = q.width / kv.head_dim,
                                    .kv_heads = kv.kv_heads,
                                    .head_dim = kv.head_dim,
                                    .q_norm = vector_f32(q_norm, norm_),
                                    .k_norm = kn,
                                    .eps = eps,
                                    .positions = positions_.data(),
                                    .theta = theta,
                                    .slot_mapping = m.slot_mapping,
                                    .num_slots = kv.num_blocks * kv.block_size,
                                    .q_out = f32(q_out),
                                    .k_cache = kv_->k(layer),
                                    .v_cache = kv_->v(layer)},
                                   *pool_);
  }
  Status attention_prefill(int64_t layer, const Act& q, const Act& out) override {
    if (auto st = check_layer("attention_prefill", layer); !st) return st;
    if (auto st = check("attention_prefill", {{&out, q.width}}); !st) return st;
    const StepMeta& m = kv_->host_meta();
    return mxq::attention_prefill(f32(q), m.cu_seqlens, m.seq_lens, shape_.seqs,
                                  q.width / kv_->shape().head_dim, kv_->paged(layer), f32(out), *pool_);
  }
  Status paged_attention_decode(int64_t layer, const Act& q, const Act& out) override {
    if (auto st = check_layer("paged_attention_decode", layer); !st) return st;
    if (auto st = check("paged_attention_decode", {{&out, q.width}}); !st) return st;
    return mxq::paged_attention_decode(f32(q), kv_->host_meta().seq_lens, shape_.seqs,
                                       q.width / kv_->shape().head_dim, kv_->paged(layer), f32(out), *pool_);
  }
  Status swiglu(const Act& gate, const Act& up, const Act& out) override {
    if (auto st = check("swiglu", {{&gate, out.width}, {&up, out.width}}); !st) return st;
    for (int64_t t = 0; t < rows_; ++t)
      mxq::swiglu(f32(gate) + t * out.width, f32(up) + t * out.width, out.width, f32(out) + t * out.width);
    return {};
  }

  Status moe_route(int64_t layer, const Act& logits, int64_t top_k, bool norm_topk_prob) override {
    if (auto st = check("moe_route", {{&logits, logits.width}}); !st) return st;
    MoeState& s = moe_;
    const int64_t E = logits.width, n = rows_ * top_k;
    s.ids.resize(static_cast<size_t>(n)), s.weights.resize(static_cast<size_t>(n));
    s.counts.resize(static_cast<size_t>(E)), s.offsets.resize(static_cast<size_t>(E + 1));
    s.sorted_rows.resize(static_cast<size_t>(n)), s.row_of.resize(static_cast<size_t>(n));
    s.layer = -1;
    if (auto st = mxq::moe_route(f32(logits), rows_, E, top_k, norm_topk_prob, s.ids.data(), s.weights.data(),
                                 s.counts.data(), s.offsets.data(), s.sorted_rows.data(), s.row_of.data());
        !st)
      return st;
    s.layer = layer, s.tokens = rows_, s.top_k = top_k, s.experts = E, s.entries = s.offsets[E];
    return {};
  }
  Status moe_grouped_linear(int64_t layer, const MoeExperts& ex, MoeProj proj, const Act& x,
                            const Act& y) override {
    const char* op = proj == MoeProj::kGateUp ? "moe_grouped_linear (gate_up)" : "moe_grouped_linear (down)";
    if (auto st = check_routed(op, layer); !st) return st;
    const MoeState& s = moe_;
    std::vector<WeightView> views;
    int64_t parts = 1;
    const QTensor* first = nullptr;
    for (int64_t e = 0; e < s.experts; ++e) {
      if (proj == MoeProj::kDown) {
        first = ex.stacked() ? ex.down : ex.down_each[0];
        views.push_back(ex.stacked() ? weight_view(*ex.down, e) : weight_view(*ex.down_each[e]));
      } else if (ex.stacked()) {
        first = ex.gate_up;
        views.push_back(weight_view(*ex.gate_up, e));
      } else {
        first = ex.gate[0], parts = 2;
        views.push_back(weight_view(*ex.gate[e]));
        views.push_back(weight_view(*ex.up[e]));
      }
    }
    const int64_t k = views[0].cols, nout = views[0].rows * parts;
    // kGateUp reads the tokens' rows (gathered per entry), kDown the entries' rows
    const int64_t in_rows = proj == MoeProj::kGateUp ? s.tokens : s.entries;
    if (x.width != k || y.width != nout || x.rows < in_rows || y.rows < s.entries)
      return fail("{}: x {} x {}, y {} x {}, expected >= {} x {} and >= {} x {}", op, x.rows, x.width, y.rows,
                  y.width, in_rows, k, s.entries, nout);
    if (proj == MoeProj::kGateUp) moe_.gate_up_parts = parts;
    const float* xin = quantize_if_w8a8(f32(x), in_rows, k, first->format);
    if (!xin) return fail_in(first->name, act_error_);
    // note: the per-module form writes gate rows of every entry first, then up rows (part_stride apart)
    return mxq::moe_grouped_linear(first->name, views, parts, s.offsets.data(),
                                   proj == MoeProj::kGateUp ? s.sorted_rows.data() : nullptr, s.top_k, xin,
                                   f32(y), s.entries * views[0].rows, *pool_);
  }
  Status moe_swiglu(int64_t layer, const Act& gate_up, const Act& out) override {
    if (auto st = check_routed("moe_swiglu", layer); !st) return st;
    const int64_t I = out.width, P = moe_.entries;
    if (gate_up.width != 2 * I || gate_up.rows < P || out.rows < P)
      return fail("moe_swiglu: gate_up {} x {}, out {} x {}, {} entries", gate_up.rows, gate_up.width,
                  out.rows, out.width, P);
    // one module per expert: gate rows of every entry, then up rows (moe_grouped_linear); stacked experts:
    // one [gate | up] row per entry
    const bool parts = moe_.gate_up_parts == 2;
    const float* gu = f32(gate_up);
    for (int64_t p = 0; p < P; ++p) {
      const float* g = parts ? gu + p * I : gu + p * 2 * I;
      const float* u = parts ? gu + (P + p) * I : g + I;
      mxq::swiglu(g, u, I, f32(out) + p * I);
    }
    return {};
  }
  Status moe_combine(int64_t layer, const Act& y, const Act& out) override {
    if (auto st = check_routed("moe_combine", layer); !st) return st;
    if (auto st = check("moe_combine", {{&out, y.width}}); !st) return st;
    const MoeState& s = moe_;
    mxq::moe_combine(f32(y), y.width, s.ids.data(), s.weights.data(), s.row_of.data(), s.tokens, s.top_k,
                     f32(out));
    return {};
  }

  Status lm_head(const Act& normed, const QTensor& w, const Act& logits) override {
    const WeightView v = weight_view(w);
    const int64_t R = shape_.sample_rows;
    if (auto st = check("lm_head", {{&normed, v.cols}}); !st) return st;
    if (logits.width != v.rows || logits.rows < R)
      return fail("lm_head: logits {} x {}, expected >= {} x {}", logits.rows, logits.width, R, v.rows);
    // the sampling rows gathered, then one linear (cpu/linear sums a row alike at any M)
    rows_buf_.resize(static_cast<size_t>(R * v.cols));
    for (int32_t r = 0; r < R; ++r) {
      const int64_t row = shape_.decode ? r : shape_.sample_token_rows[r];
      if (row < 0 || row >= rows_)
        return fail("lm_head: sampling row {} names token row {} of {}", r, row, rows_);
      std::memcpy(rows_buf_.data() + r * v.cols, f32(normed) + row * v.cols, v.cols * sizeof(float));
    }
    return run_linear(rows_buf_.data(), R, w, v, nullptr, f32(logits));
  }
  Status to_host(const Act& x, int64_t rows, float* host_dst) override {
    if (rows > x.rows) return fail("to_host: {} rows of a buffer of {}", rows, x.rows);
    std::memcpy(host_dst, f32(x), static_cast<size_t>(rows * x.width) * sizeof(float));
    return {};
  }

 private:
  static float* f32(const Act& a) { return static_cast<float*>(a.mem.get()); }

  // Inside a step, each buffer at least the step's rows with the width the op expects.
  Status check(const char* op, std::initializer_list<std::pair<const Act*, int64_t>> acts) const {
    if (!kv_) return fail("{}: a step op, called outside run_step", op);
    for (const auto& [a, width] : acts)
      if (a->width != width || a->rows < rows_)
        return fail("{}: buffer of {} x {}, the step needs {} x {}", op, a->rows, a->width, rows_, width);
    return {};
  }
  Status check_layer(const char* op, int64_t layer) const {
    if (!kv_) return fail("{}: a step op, called outside run_step", op);
    return kv_->check_layer(op, layer);
  }
  Status check_routed(const char* op, int64_t layer) const {
    if (!kv_) return fail("{}: a step op, called outside run_step", op);
    if (moe_.layer != layer) return fail("{}: layer {} was not routed (moe_route first)", op, layer);
    return {};
  }

  // The W8A8 mode (cuda/linear/linear.h): MX projections see x quantize-dequantized through MXFP8, row by
  // row. note: x is rounded to bf16 first, as every W8A8 deployment's activations are (and the CUDA
  // engine's): quantizing the f32 activations instead moves elements near an E4M3 rounding boundary by a
  // whole E4M3 step against the CUDA engine (0.18 of the logit scale on the dense engine test, H200). Returns
  // x itself otherwise, null on an error (act_error_).
  const float* quantize_if_w8a8(const float* x, int64_t m, int64_t k, Format weights) {
    if (act_quant_ != Format::kMXFP8 || !is_mx(weights)) return x;
    act_bf16_.resize(static_cast<size_t>(m * k));
    act_.resize(act_bf16_.size());
    for (size_t i = 0; i < act_bf16_.size(); ++i) act_bf16_[i] = f32_to_bf16(x[i]);
    if (auto st = fake_quant_mxfp8(act_bf16_.data(), m, k, act_bf16_.data()); !st) {
      act_error_ = st.error();
      return nullptr;
    }
    for (size_t i = 0; i < act_.size(); ++i) act_[i] = bf16_to_f32(act_bf16_[i]);
    return act_.data();
  }

  Status run_linear(const float* x, int64_t m, const QTensor& w, const WeightView& v, const QTensor* bias,
                    float* y) {
    const float* b = bias ? vector_f32(*bias, bias_) : nullptr;
    const float* xin = quantize_if_w8a8(x, m, v.cols, w.format);
    if (!xin) return fail_in(w.name, act_error_);
    if (auto st = mxq::linear(xin, m, v, b, y, *pool_); !st) return fail_in(w.name, st.error());
    return {};
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
  std::vector<float> norm_, bias_, act_, head_norm_, rows_buf_;
  std::vector<uint16_t> act_bf16_;
  Error act_error_;
  CpuKvPool* kv_ = nullptr;  // the pool of the step running (run_step)
  ForwardShape shape_;
  int64_t rows_ = 0;  // the step's token rows
  std::vector<int64_t> positions_;
  MoeState moe_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads, Format act_quant) {
  assert((act_quant == Format::kBF16 || act_quant == Format::kMXFP8) && "callers parse the mode first");
  return std::make_unique<CpuBackend>(threads, act_quant);
}

}  // namespace mxq
