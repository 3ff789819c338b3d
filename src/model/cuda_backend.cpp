// The step ops on the GPU: each op is the launch model/qwen3_cuda.cpp makes at the same point of the forward,
// with the same arguments, so a step of Qwen3Model on this backend enqueues what Qwen3Cuda::forward enqueues
// (tests/cuda/backend_test.cpp holds the logits bitwise equal).
#include "model/cuda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpu/rope.h"
#include "cuda/attention/attention_prefill.h"
#include "cuda/attention/paged_attention_decode.h"
#include "cuda/attention/qk_norm_rope_cache.h"
#include "cuda/common/check.h"
#include "cuda/linear/linear.h"
#include "cuda/linear/moe_grouped_linear.h"
#include "cuda/ops/embedding.h"
#include "cuda/ops/moe_route.h"
#include "cuda/ops/rms_norm.h"
#include "cuda/ops/swiglu.h"
#include "cuda/quantize/quantize_act.h"
#include "format/codec.h"

namespace mxq::cuda {
namespace {

// A launch inside a step. note: a launcher's cudaErrorInvalidValue names no argument; the op and the rows do.
#define MXQ_STEP_LAUNCH(op, ...)                                                                       \
  do {                                                                                                 \
    const cudaError_t mxq_rc_ = (__VA_ARGS__);                                                         \
    if (mxq_rc_ != cudaSuccess) return fail("{}: {} ({} rows)", op, cudaGetErrorName(mxq_rc_), rows_); \
  } while (0)

// Byte offsets of the arrays of one pinned/device block, each 16-byte aligned.
struct BlockPlan {
  size_t bytes = 0;
  size_t take(size_t n) {
    const size_t at = bytes;
    bytes += (n + 15) / 16 * 16;
    return at;
  }
};

const uint16_t* bf16(const QTensor& t) { return reinterpret_cast<const uint16_t*>(t.values.data()); }
uint16_t* bf16(const Act& a) { return static_cast<uint16_t*>(a.mem.get()); }
float* f32(const Act& a) { return static_cast<float*>(a.mem.get()); }

Result<DeviceBuffer> zeroed(size_t bytes, cudaStream_t stream) {
  auto d = DeviceBuffer::alloc(std::max<size_t>(bytes, 16));
  if (!d) return tl::unexpected(d.error());
  MXQ_CUDA_CHECK(cudaMemsetAsync(d->as(), 0, d->bytes(), stream));
  return d;
}

// The paged bf16 pool (per layer K then V, [num_blocks, block_size, kv_heads, head_dim], the layout of
// Qwen3Cuda's pool) and the step metadata: one device block, its pinned host twin (the block tables last, so
// a step uploads its own sequences' rows only), and the sticky bad-token word.
class CudaKvPool final : public KvPool {
 public:
  static Result<std::unique_ptr<CudaKvPool>> create(const KvShape& s, cudaStream_t stream) {
    if (auto st = check_kv_shape(s); !st) return tl::unexpected(st.error());
    std::unique_ptr<CudaKvPool> p(new CudaKvPool());
    p->shape_ = s;
    p->stream_ = stream;
    p->layer_elems_ = s.num_blocks * s.block_size * s.kv_heads * s.head_dim;
    auto kv = zeroed(static_cast<size_t>(2 * s.layers * p->layer_elems_) * 2, stream);
    if (!kv) return fail("KV pool of {} blocks: {}", s.num_blocks, kv.error().message);
    p->kv_ = std::move(*kv);
    const auto S = static_cast<size_t>(s.max_seqs), T = static_cast<size_t>(s.max_tokens);
    BlockPlan mp;
    const size_t o_seed = mp.take(S * 8), o_step = mp.take(S * 8), o_temp = mp.take(S * 4),
                 o_top_p = mp.take(S * 4), o_min_p = mp.take(S * 4), o_top_k = mp.take(S * 4),
                 o_ids = mp.take(T * 4), o_pos = mp.take(T * 4), o_slot = mp.take(T * 4),
                 o_sl = mp.take(S * 4), o_cu = mp.take((S + 1) * 4), o_nt = mp.take(4), o_ns = mp.take(4);
    const size_t o_bt = mp.take(S * static_cast<size_t>(s.max_blocks) * 4);
    p->meta_bytes_ = mp.bytes;
    p->head_bytes_ = o_bt;
    auto meta = zeroed(mp.bytes, stream);
    if (!meta) return tl::unexpected(meta.error());
    p->meta_ = std::move(*meta);
    MXQ_CUDA_CHECK(cudaMallocHost(&p->host_, mp.bytes));
    std::memset(p->host_, 0, mp.bytes);
    auto views = [&](uint8_t* base, StepMeta& v) {
      v.seed = reinterpret_cast<uint64_t*>(base + o_seed);
      v.step = reinterpret_cast<uint64_t*>(base + o_step);
      v.temperature = reinterpret_cast<float*>(base + o_temp);
      v.top_p = reinterpret_cast<float*>(base + o_top_p);
      v.min_p = reinterpret_cast<float*>(base + o_min_p);
      v.top_k = reinterpret_cast<int32_t*>(base + o_top_k);
      v.ids = reinterpret_cast<int32_t*>(base + o_ids);
      v.positions = reinterpret_cast<int32_t*>(base + o_pos);
      v.slot_mapping = reinterpret_cast<int32_t*>(base + o_slot);
      v.block_tables = reinterpret_cast<int32_t*>(base + o_bt);
      v.seq_lens = reinterpret_cast<int32_t*>(base + o_sl);
      v.cu_seqlens = reinterpret_cast<int32_t*>(base + o_cu);
      v.num_tokens = reinterpret_cast<int32_t*>(base + o_nt);
      v.num_seqs = reinterpret_cast<int32_t*>(base + o_ns);
    };
    views(static_cast<uint8_t*>(p->host_), p->host_meta_);
    views(p->meta_.as<uint8_t>(), p->dev_meta_);
    auto bad = DeviceBuffer::alloc(16);
    if (!bad) return tl::unexpected(bad.error());
    p->bad_ = std::move(*bad);
    const int32_t none = INT32_MAX;
    MXQ_CUDA_CHECK(cudaMemcpyAsync(p->bad_.as(), &none, 4, cudaMemcpyHostToDevice, stream));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
    return p;
  }
  ~CudaKvPool() override {
    if (host_) cudaFreeHost(host_);
  }

  const KvShape& shape() const override { return shape_; }
  StepMeta& host_meta() override { return host_meta_; }

  Status copy_block(int32_t src, int32_t dst, int32_t slots) override {
    const KvShape& s = shape_;
    if (auto st = check_block_copy(s, src, dst, slots); !st) return st;
    if (src == dst || slots == 0) return {};
    const int64_t row = s.kv_heads * s.head_dim, block = s.block_size * row;
    for (int64_t l = 0; l < 2 * s.layers; ++l) {
      uint16_t* base = kv_.as<uint16_t>() + l * layer_elems_;
      MXQ_CUDA_CHECK(cudaMemcpyAsync(base + dst * block, base + src * block,
                                     static_cast<size_t>(slots * row) * 2, cudaMemcpyDeviceToDevice,
                                     stream_));
    }
    return {};
  }

  Status read_slots(int64_t layer, std::span<const int32_t> slots, float* k, float* v) const override {
    if (layer < 0 || layer >= shape_.layers)
      return fail("read_slots: layer {} outside the KV pool of {} layers", layer, shape_.layers);
    const int64_t row = shape_.kv_heads * shape_.head_dim, num_slots = shape_.num_blocks * shape_.block_size;
    std::vector<uint16_t> h(static_cast<size_t>(row));
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] < 0 || slots[i] >= num_slots)
        return fail("read_slots: slot {} outside the pool of {} slots", slots[i], num_slots);
      for (int kv = 0; kv < 2; ++kv) {
        MXQ_CUDA_CHECK(cudaMemcpyAsync(h.data(), cache(layer, kv) + slots[i] * row, h.size() * 2,
                                       cudaMemcpyDeviceToHost, stream_));
        MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
        float* out = (kv == 0 ? k : v) + static_cast<int64_t>(i) * row;
        for (int64_t j = 0; j < row; ++j) out[j] = bf16_to_f32(h[static_cast<size_t>(j)]);
      }
    }
    return {};
  }

  // One host → device copy of the metadata, block-table rows of the first `seqs` sequences included.
  Status upload(int32_t seqs) {
    const size_t bytes = std::min(meta_bytes_, head_bytes_ + static_cast<size_t>(std::max(seqs, 0)) *
                                                                 static_cast<size_t>(shape_.max_blocks) * 4);
    MXQ_CUDA_CHECK(cudaMemcpyAsync(meta_.as(), host_, bytes, cudaMemcpyHostToDevice, stream_));
    return {};
  }
  // The sticky bad-token word (INT32_MAX: none), read back synchronously.
  Result<int32_t> bad_token() {
    int32_t h = 0;
    MXQ_CUDA_CHECK(cudaMemcpyAsync(&h, bad_.as(), 4, cudaMemcpyDeviceToHost, stream_));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return h;
  }

  const StepMeta& dev() const { return dev_meta_; }
  int32_t* bad() const { return bad_.as<int32_t>(); }
  uint16_t* cache(int64_t layer, int kv) const {
    return kv_.as<uint16_t>() + (2 * layer + kv) * layer_elems_;
  }

 private:
  CudaKvPool() = default;
  KvShape shape_;
  cudaStream_t stream_ = nullptr;
  int64_t layer_elems_ = 0;
  DeviceBuffer kv_, meta_, bad_;
  void* host_ = nullptr;
  size_t meta_bytes_ = 0, head_bytes_ = 0;
  StepMeta host_meta_{}, dev_meta_{};
};

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CudaBackend>> create(const CudaBackendOptions& o) {
    if (o.act_quant != Format::kBF16 && o.act_quant != Format::kMXFP8)
      return fail("cuda backend: activation quantization {} (expected bf16 or mxfp8)",
                  traits(o.act_quant).name);
    int device = 0;
    MXQ_CUDA_CHECK(cudaGetDevice(&device));
    auto arch = device_arch(device);
    if (!arch) return fail_in("cuda backend", arch.error());
    std::unique_ptr<CudaBackend> b(new CudaBackend());
    b->options_ = o;
    MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking));
    auto ctx = LinearContext::create(*arch);
    if (!ctx) return fail_in("cuda backend linear context", ctx.error());
    b->lin_ = std::move(*ctx);
    return b;
  }
  ~CudaBackend() override {
    lin_.reset();
    if (stream_) cudaStreamDestroy(stream_);
  }
  std::string_view name() const override { return "cuda"; }

  Result<Act> alloc(ActType t, int64_t rows, int64_t width) override {
    if (rows < 0 || width < 0) return fail("alloc: {} x {} elements", rows, width);
    auto d = zeroed(static_cast<size_t>(rows * width) * (t == ActType::kF32 ? 4 : 2), stream_);
    if (!d) return tl::unexpected(d.error());
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    auto holder = std::make_shared<DeviceBuffer>(std::move(*d));
    return Act{std::shared_ptr<void>(holder, holder->as()), t, rows, width};
  }

  Result<std::unique_ptr<KvPool>> create_kv(const KvShape& s) override {
    auto p = CudaKvPool::create(s, stream_);
    if (!p) return tl::unexpected(p.error());
    return std::unique_ptr<KvPool>(std::move(*p));
  }

  Status run_step(KvPool& pool, const ForwardShape& shape, const std::function<Status()>& body) override {
    auto* p = dynamic_cast<CudaKvPool*>(&pool);
    if (!p) return fail("run_step: the KV pool is not one of the cuda backend's");
    const KvShape& kv = p->shape();
    if (shape.rows < 1 || shape.rows > kv.max_tokens || shape.seqs < 1 || shape.seqs > kv.max_seqs ||
        shape.sample_rows > kv.max_seqs)
      return fail("run_step: {} rows (capacity {}), {} sequences, {} sampled (capacity {})", shape.rows,
                  kv.max_tokens, shape.seqs, shape.sample_rows, kv.max_seqs);
    if (auto st = p->upload(shape.seqs); !st) return st;
    kv_ = p;
    shape_ = shape;
    rows_ = shape.rows;
    auto st = body();
    kv_ = nullptr;
    shape_ = {};
    rows_ = 0;
    moe_layer_ = -1;
    return st;
  }

  Status embedding(const QTensor& table, const Act& residual) override {
    if (auto st = check("embedding", {{&residual, table.shape[1]}}); !st) return st;
    MXQ_STEP_LAUNCH("embedding",
                    launch_embedding_f32(bf16(table), table.shape[0], table.shape[1], kv_->dev().ids,
                                         kv_->dev().num_tokens, rows_, f32(residual), kv_->bad(), stream_));
    return {};
  }
  Status rms_norm(const Act& x, const QTensor& w, float eps, const Act& out) override {
    const int64_t h = w.shape[0];
    if (auto st = check("rms_norm", {{&x, h}, {&out, h}}); !st) return st;
    MXQ_STEP_LAUNCH("rms_norm", launch_rms_norm_f32(f32(x), bf16(w), eps, h, kv_->dev().num_tokens, rows_,
                                                    bf16(out), stream_));
    return {};
  }
  Status add_rms_norm(const Act& x, const Act& residual, const QTensor& w, float eps,
                      const Act& out) override {
    const int64_t h = w.shape[0];
    if (auto st = check("add_rms_norm", {{&x, h}, {&residual, h}, {&out, h}}); !st) return st;
    MXQ_STEP_LAUNCH("add_rms_norm", launch_add_rms_norm(bf16(x), f32(residual), bf16(w), eps, h,
                                                        kv_->dev().num_tokens, rows_, bf16(out), stream_));
    return {};
  }

  Status linear(const Act& x, const QTensor& w, const QTensor* bias, const Act& y) override {
    const LinearPart part{&w, bias, &y};
    return linear_parts(x, std::span(&part, 1));
  }
  Status linear_parts(const Act& x, std::span<const LinearPart> parts) override {
    if (parts.empty() || parts.size() > static_cast<size_t>(kLinearMaxParts))
      return fail("linear_parts: {} parts (1..{})", parts.size(), kLinearMaxParts);
    LinearWeights w[kLinearMaxParts];
    uint16_t* y[kLinearMaxParts];
    std::string names;
    for (size_t i = 0; i < parts.size(); ++i) {
      const LinearPart& p = parts[i];
      if (p.bias) return fail("{}: a bias is not supported by the cuda backend (no bias add)", p.bias->name);
      auto lw = weights(*p.w);
      if (!lw) return tl::unexpected(lw.error());
      if (auto st = check(p.w->name.c_str(), {{&x, lw->k}, {p.y, lw->n}}); !st) return st;
      if (auto st = reserve(*lw); !st) return st;
      w[i] = *lw;
      y[i] = bf16(*p.y);
      names += (names.empty() ? "" : " + ") + p.w->name;
    }
    const std::span<const LinearWeights> ws(w, parts.size());
    const std::span<uint16_t* const> ys(y, parts.size());
    Status st = parts.size() == 1 ? mxq::cuda::linear(*lin_, w[0], bf16(x), rows_, y[0], stream_)
                                  : mxq::cuda::linear_parts(*lin_, ws, bf16(x), rows_, ys, stream_);
    if (!st) return fail_in(names, st.error());
    return {};
  }
  Status linear_f32(const Act& x, const QTensor& w, const Act& y) override {
    auto lw = weights(w);
    if (!lw) return tl::unexpected(lw.error());
    if (auto st = check(w.name.c_str(), {{&x, lw->k}, {&y, lw->n}}); !st) return st;
    if (Status st = mxq::cuda::linear_f32(*lin_, *lw, bf16(x), rows_, f32(y), stream_); !st)
      return fail_in(w.name, st.error());
    return {};
  }

  Status qk_norm_rope_cache(int64_t layer, const Act& q, const Act& k, const Act& v, const QTensor& q_norm,
                            const QTensor& k_norm, float eps, float theta, const Act& q_out) override {
    if (auto st = check_layer("qk_norm_rope_cache", layer); !st) return st;
    const KvShape& s = kv_->shape();
    const int64_t kvw = s.kv_heads * s.head_dim;
    if (auto st = check("qk_norm_rope_cache", {{&k, kvw}, {&v, kvw}, {&q_out, q.width}}); !st) return st;
    auto inv = inv_freq(theta, s.head_dim);
    if (!inv) return tl::unexpected(inv.error());
    QkNormRopeArgs a{};
    a.qkv = bf16(q);
    a.k_in = bf16(k);
    a.v_in = bf16(v);
    a.q_norm = bf16(q_norm);
    a.k_norm = bf16(k_norm);
    a.inv_freq = *inv;
    a.positions = kv_->dev().positions;
    a.slot_mapping = kv_->dev().slot_mapping;
    a.num_tokens = kv_->dev().num_tokens;
    a.q_out = bf16(q_out);
    a.k_cache = kv_->cache(layer, 0);
    a.v_cache = kv_->cache(layer, 1);
    a.bad_token = kv_->bad();
    a.max_tokens = rows_;
    a.num_slots = s.num_blocks * s.block_size;
    a.q_heads = static_cast<int>(q.width / s.head_dim);
    a.kv_heads = static_cast<int>(s.kv_heads);
    a.head_dim = static_cast<int>(s.head_dim);
    a.eps = eps;
    MXQ_STEP_LAUNCH("qk_norm_rope_cache", launch_qk_norm_rope_cache(a, stream_));
    return {};
  }
  Status attention_prefill(int64_t layer, const Act& q, const Act& out) override {
    if (auto st = check_layer("attention_prefill", layer); !st) return st;
    if (auto st = check("attention_prefill", {{&out, q.width}}); !st) return st;
    const KvShape& s = kv_->shape();
    const StepMeta& m = kv_->dev();
    PrefillArgs a{bf16(q),
                  kv_->cache(layer, 0),
                  kv_->cache(layer, 1),
                  m.block_tables,
                  m.cu_seqlens,
                  m.seq_lens,
                  bf16(out),
                  static_cast<int>(rows_),
                  shape_.seqs,
                  static_cast<int>(s.max_blocks),
                  static_cast<int>(s.block_size),
                  static_cast<int>(q.width / s.head_dim),
                  static_cast<int>(s.kv_heads),
                  static_cast<int>(s.head_dim)};
    MXQ_STEP_LAUNCH("attention_prefill", launch_attention_prefill(a, stream_));
    return {};
  }
  Status paged_attention_decode(int64_t layer, const Act& q, const Act& out) override {
    if (auto st = check_layer("paged_attention_decode", layer); !st) return st;
    if (auto st = check("paged_attention_decode", {{&out, q.width}}); !st) return st;
    const KvShape& s = kv_->shape();
    const int q_heads = static_cast<int>(q.width / s.head_dim);
    const size_t ws = paged_attention_decode_workspace_bytes(
        static_cast<int>(s.max_seqs), q_heads, static_cast<int>(s.head_dim), static_cast<int>(s.max_blocks),
        static_cast<int>(s.block_size));
    if (decode_ws_.bytes() < ws) {
      auto d = DeviceBuffer::alloc(ws);
      if (!d) return tl::unexpected(d.error());
      decode_ws_ = std::move(*d);
    }
    PagedDecodeArgs a{bf16(q),
                      kv_->cache(layer, 0),
                      kv_->cache(layer, 1),
                      kv_->dev().block_tables,
                      kv_->dev().seq_lens,
                      decode_ws_.as<float>(),
                      bf16(out),
                      shape_.seqs,
                      static_cast<int>(s.max_blocks),
                      static_cast<int>(s.block_size),
                      q_heads,
                      static_cast<int>(s.kv_heads),
                      static_cast<int>(s.head_dim)};
    MXQ_STEP_LAUNCH("paged_attention_decode", launch_paged_attention_decode(a, stream_));
    return {};
  }
  Status swiglu(const Act& gate, const Act& up, const Act& out) override {
    if (auto st = check("swiglu", {{&gate, out.width}, {&up, out.width}}); !st) return st;
    MXQ_STEP_LAUNCH("swiglu", launch_swiglu(bf16(gate), bf16(up), out.width, kv_->dev().num_tokens, rows_,
                                            bf16(out), stream_));
    return {};
  }

  // Qwen3MoeSparseMoeBlock (model/qwen3_cuda_moe.cpp's launches). Decode steps run every expert group in one
  // grouped launch per projection, driven by the grouping on the device (nothing waits for the host); other
  // steps read the grouping back and run each expert through the dispatch table (its GEMM entries at large
  // M).
  Status moe_route(int64_t layer, const Act& logits, int64_t top_k, bool norm_topk_prob) override {
    if (auto st = check_layer("moe_route", layer); !st) return st;
    if (auto st = check("moe_route", {{&logits, logits.width}}); !st) return st;
    const int64_t E = logits.width, L = kv_->shape().layers, cap = kv_->shape().max_tokens * top_k;
    if (auto st = ensure_moe(L, E, cap); !st) return st;
    MoeRouteArgs ra{};
    ra.logits_f32 = f32(logits);
    ra.num_tokens = kv_->dev().num_tokens;
    ra.ids = moe_ids_.as<int32_t>();
    ra.weights = moe_weights_.as<float>();
    ra.counts = moe_counts_.as<int32_t>() + layer * E;
    ra.offsets = offsets(layer);
    ra.sorted_rows = moe_sorted_.as<int32_t>();
    ra.row_of = moe_row_of_.as<int32_t>();
    ra.active = moe_active_.as<int32_t>() + layer * E;
    ra.max_tokens = static_cast<int>(rows_);
    ra.experts = static_cast<int>(E);
    ra.top_k = static_cast<int>(top_k);
    ra.norm_topk_prob = norm_topk_prob;
    MXQ_STEP_LAUNCH("moe_route", launch_moe_route(ra, stream_));
    moe_layer_ = layer, moe_top_k_ = top_k, moe_entries_ = -1;
    return {};
  }

  Status moe_grouped_linear(int64_t layer, const MoeExperts& ex, MoeProj proj, const Act& x,
                            const Act& y) override {
    const char* op = proj == MoeProj::kGateUp ? "moe_grouped_linear (gate_up)" : "moe_grouped_linear (down)";
    if (auto st = check_routed(op, layer); !st) return st;
    const int64_t K = moe_top_k_, cap = rows_ * K, E = experts_;
    auto lw = expert_weights(layer, ex);
    if (!lw) return tl::unexpected(lw.error());
    const ExpertWeights& w = **lw;
    uint16_t* out = bf16(y);
    if (y.rows < cap || x.rows < rows_)
      return fail("{}: x {} rows, y {} rows, the step needs {} and {}", op, x.rows, y.rows, rows_, cap);
    if (proj == MoeProj::kGateUp) moe_parts_ = w.gate_up.empty() ? 2 : 1;
    if (shape_.decode) {
      const MoeGroupedWeights& g = proj == MoeProj::kGateUp ? *w.grouped_gate_up : *w.grouped_down;
      const MoeGroups groups{offsets(layer), moe_active_.as<int32_t>() + layer * E, moe_sorted_.as<int32_t>(),
                             K, cap};
      const bool gather = proj == MoeProj::kGateUp;
      auto xin = moe_input(g, bf16(x), gather ? rows_ : cap);
      if (!xin) return tl::unexpected(xin.error());
      return mxq::cuda::moe_grouped_linear(g, groups, gather, *xin, out, stream_);
    }
    if (proj == MoeProj::kGateUp) {
      // note: the host-driven loop (prefill and mixed steps, never captured): the grouping read back, then
      // the expert inputs in sorted_rows order (runs of consecutive tokens copied at once)
      if (auto st = read_grouping(layer); !st) return st;
      const int64_t H = x.width;
      if (moe_xe_.bytes() < static_cast<size_t>(moe_cap_ * H) * 2) {
        auto d = zeroed(static_cast<size_t>(moe_cap_ * H) * 2, stream_);
        if (!d) return tl::unexpected(d.error());
        moe_xe_ = std::move(*d);
      }
      uint16_t* xe = moe_xe_.as<uint16_t>();
      for (int32_t p = 0; p < moe_entries_;) {
        const int32_t t0 = host_sorted_[p] / static_cast<int32_t>(K);
        int32_t run = 1;
        while (p + run < moe_entries_ && host_sorted_[p + run] / K == t0 + run) ++run;
        MXQ_CUDA_CHECK(
            cudaMemcpyAsync(xe + p * H, bf16(x) + t0 * H, run * H * 2, cudaMemcpyDeviceToDevice, stream_));
        p += run;
      }
    }
    const uint16_t* in = proj == MoeProj::kGateUp ? moe_xe_.as<uint16_t>() : bf16(x);
    const int64_t k = x.width;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t off = host_offsets_[e], cnt = host_offsets_[e + 1] - off;
      if (cnt == 0) continue;
      if (proj == MoeProj::kDown) {
        if (auto st = run_expert(w.down[e], in + off * k, cnt, out + off * w.down[e].n); !st) return st;
      } else if (!w.gate_up.empty()) {
        if (auto st = run_expert(w.gate_up[e], in + off * k, cnt, out + off * w.gate_up[e].n); !st) return st;
      } else {
        // gate rows of every entry first, then up rows (cap rows apart)
        const int64_t I = w.gate[e].n;
        if (auto st = run_expert(w.gate[e], in + off * k, cnt, out + off * I); !st) return st;
        if (auto st = run_expert(w.up[e], in + off * k, cnt, out + cap * I + off * I); !st) return st;
      }
    }
    return {};
  }

  Status moe_swiglu(int64_t layer, const Act& gate_up, const Act& out) override {
    if (auto st = check_routed("moe_swiglu", layer); !st) return st;
    const int64_t I = out.width, cap = rows_ * moe_top_k_;
    if (gate_up.width != 2 * I || gate_up.rows < cap || out.rows < cap)
      return fail("moe_swiglu: gate_up {} x {}, out {} x {}, {} entries at most", gate_up.rows, gate_up.width,
                  out.rows, out.width, cap);
    // decode: the entry count offsets[E] read on the device; otherwise the host's
    const int32_t* count = shape_.decode ? offsets(layer) + experts_ : nullptr;
    const int64_t rows = shape_.decode ? cap : moe_entries_;
    if (moe_parts_ == 1)
      MXQ_STEP_LAUNCH("swiglu", launch_swiglu_fused(bf16(gate_up), I, count, rows, bf16(out), stream_));
    else
      MXQ_STEP_LAUNCH("swiglu", launch_swiglu(bf16(gate_up), bf16(gate_up) + cap * I, I, count, rows,
                                              bf16(out), stream_));
    return {};
  }

  Status moe_combine(int64_t layer, const Act& y, const Act& out) override {
    if (auto st = check_routed("moe_combine", layer); !st) return st;
    if (auto st = check("moe_combine", {{&out, y.width}}); !st) return st;
    MXQ_STEP_LAUNCH("moe_combine", launch_moe_combine(bf16(y), y.width, moe_ids_.as<int32_t>(),
                                                      moe_weights_.as<float>(), moe_row_of_.as<int32_t>(),
                                                      kv_->dev().num_tokens, static_cast<int>(rows_),
                                                      static_cast<int>(moe_top_k_), bf16(out), stream_));
    return {};
  }

  Status lm_head(const Act& normed, const QTensor& w, const Act& logits) override {
    auto lw = weights(w);
    if (!lw) return tl::unexpected(lw.error());
    const int64_t R = shape_.sample_rows, H = lw->k;
    if (auto st = check("lm_head", {{&normed, H}}); !st) return st;
    if (logits.width != lw->n || logits.rows < R)
      return fail("lm_head: logits {} x {}, expected >= {} x {}", logits.rows, logits.width, R, lw->n);
    // a decode step samples every row; a mixed step the rows shape.sample_token_rows names, gathered
    const uint16_t* x = bf16(normed);
    if (!shape_.decode) {
      if (sel_.bytes() < static_cast<size_t>(kv_->shape().max_seqs * H) * 2) {
        auto d = DeviceBuffer::alloc(static_cast<size_t>(kv_->shape().max_seqs * H) * 2);
        if (!d) return tl::unexpected(d.error());
        sel_ = std::move(*d);
      }
      for (int32_t j = 0; j < R; ++j) {
        const int64_t row = shape_.sample_token_rows[j];
        if (row < 0 || row >= rows_)
          return fail("lm_head: sampling row {} names token row {} of {}", j, row, rows_);
        MXQ_CUDA_CHECK(cudaMemcpyAsync(sel_.as<uint16_t>() + j * H, x + row * H, H * 2,
                                       cudaMemcpyDeviceToDevice, stream_));
      }
      x = sel_.as<uint16_t>();
    }
    if (Status st = mxq::cuda::linear_f32(*lin_, *lw, x, R, f32(logits), stream_); !st)
      return fail_in(w.name, st.error());
    return {};
  }

  Status to_host(const Act& x, int64_t rows, float* host_dst) override {
    if (x.type != ActType::kF32 || rows > x.rows)
      return fail("to_host: {} rows of a {} buffer of {} rows (f32 buffers only)", rows,
                  x.type == ActType::kF32 ? "f32" : "bf16", x.rows);
    MXQ_CUDA_CHECK(cudaMemcpyAsync(host_dst, x.mem.get(), static_cast<size_t>(rows * x.width) * 4,
                                   cudaMemcpyDeviceToHost, stream_));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (kv_) {
      auto bad = kv_->bad_token();
      if (!bad) return tl::unexpected(bad.error());
      if (*bad != INT32_MAX)
        return fail("step token {}: a token id outside the vocabulary or a KV slot outside the pool", *bad);
    }
    return {};
  }

 private:
  CudaBackend() = default;

  Status check(const char* op, std::initializer_list<std::pair<const Act*, int64_t>> acts) const {
    if (!kv_) return fail("{}: a step op, called outside run_step", op);
    for (const auto& [a, width] : acts)
      if (a->width != width || a->rows < rows_)
        return fail("{}: buffer of {} x {}, the step needs {} x {}", op, a->rows, a->width, rows_, width);
    return {};
  }
  Status check_layer(const char* op, int64_t layer) const {
    if (!kv_) return fail("{}: a step op, called outside run_step", op);
    if (layer < 0 || layer >= kv_->shape().layers)
      return fail("{}: layer {} outside the KV pool of {} layers", op, layer, kv_->shape().layers);
    return {};
  }
  Status check_routed(const char* op, int64_t layer) const {
    if (!kv_) return fail("{}: a step op, called outside run_step", op);
    if (moe_layer_ != layer) return fail("{}: layer {} was not routed (moe_route first)", op, layer);
    return {};
  }

  // One MoE layer's experts as the dispatch table and the grouped decode linears read them, made once per
  // layer (stacked: gate_up [2I, H] per expert; one module per expert: gate, up).
  struct ExpertWeights {
    std::vector<LinearWeights> gate_up, gate, up, down;
    std::optional<MoeGroupedWeights> grouped_gate_up, grouped_down;
  };
  Result<const ExpertWeights*> expert_weights(int64_t layer, const MoeExperts& ex) {
    if (auto hit = experts_w_.find(layer); hit != experts_w_.end()) return &hit->second;
    ExpertWeights w;
    const int64_t E = experts_;
    auto view = [&](const QTensor& t, int64_t expert) -> Result<LinearWeights> {
      auto l = linear_weights(t.name, t.format, t.shape, t.values, t.scales, expert);
      if (!l) return tl::unexpected(l.error());
      if (is_mx(t.format)) l->act = options_.act_quant;
      return *l;
    };
    std::vector<LinearWeights> gu, dn;
    for (int64_t e = 0; e < E; ++e) {
      auto d = ex.stacked() ? view(*ex.down, e) : view(*ex.down_each[e], -1);
      if (!d) return tl::unexpected(d.error());
      w.down.push_back(*d);
      dn.push_back(*d);
      if (ex.stacked()) {
        auto g = view(*ex.gate_up, e);
        if (!g) return tl::unexpected(g.error());
        w.gate_up.push_back(*g);
        gu.push_back(*g);
      } else {
        auto g = view(*ex.gate[e], -1), u = view(*ex.up[e], -1);
        if (!g) return tl::unexpected(g.error());
        if (!u) return tl::unexpected(u.error());
        w.gate.push_back(*g), w.up.push_back(*u);
        gu.push_back(*g), gu.push_back(*u);
      }
    }
    for (const LinearWeights& l : gu)
      if (auto st = reserve(l); !st) return tl::unexpected(st.error());
    for (const LinearWeights& l : dn)
      if (auto st = reserve(l); !st) return tl::unexpected(st.error());
    const std::string p = fmt::format("model.layers.{}.mlp.experts", layer);
    auto g = MoeGroupedWeights::create(p + (ex.stacked() ? ".gate_up_proj" : ".*.gate_proj/up_proj"), gu,
                                       ex.stacked() ? 1 : 2);
    if (!g) return tl::unexpected(g.error());
    auto d = MoeGroupedWeights::create(p + (ex.stacked() ? ".down_proj" : ".*.down_proj"), dn, 1);
    if (!d) return tl::unexpected(d.error());
    w.grouped_gate_up.emplace(std::move(*g));
    w.grouped_down.emplace(std::move(*d));
    return &experts_w_.emplace(layer, std::move(w)).first->second;
  }

  // The routing state at capacity: per layer counts, offsets and active experts; the entries' ids, weights,
  // order; the gathered expert inputs and the pinned host copies of the grouping.
  Status ensure_moe(int64_t layers, int64_t experts, int64_t entries) {
    if (layers * experts <= moe_lx_ && entries <= moe_cap_ && experts == experts_) return {};
    auto need = [&](DeviceBuffer& b, size_t bytes) -> Status {
      auto d = zeroed(bytes, stream_);
      if (!d) return tl::unexpected(d.error());
      b = std::move(*d);
      return {};
    };
    for (auto [buf, bytes] : {std::pair{&moe_counts_, layers * experts * 4},
                              {&moe_offsets_, layers * (experts + 1) * 4},
                              {&moe_active_, layers * experts * 4},
                              {&moe_ids_, entries * 4},
                              {&moe_weights_, entries * 4},
                              {&moe_sorted_, entries * 4},
                              {&moe_row_of_, entries * 4}})
      if (auto st = need(*buf, static_cast<size_t>(bytes)); !st) return st;
    host_offsets_.assign(static_cast<size_t>(experts + 1), 0);
    host_sorted_.assign(static_cast<size_t>(entries), 0);
    if (experts != experts_) experts_w_.clear();
    experts_ = experts, moe_lx_ = layers * experts, moe_cap_ = entries;
    return {};
  }
  int32_t* offsets(int64_t layer) const { return moe_offsets_.as<int32_t>() + layer * (experts_ + 1); }
  // The grouping of this step read back to the host (one sync), and the expert input buffer sized for it.
  Status read_grouping(int64_t layer) {
    MXQ_CUDA_CHECK(cudaMemcpyAsync(host_offsets_.data(), offsets(layer), (experts_ + 1) * 4,
                                   cudaMemcpyDeviceToHost, stream_));
    MXQ_CUDA_CHECK(cudaMemcpyAsync(host_sorted_.data(), moe_sorted_.as(), rows_ * moe_top_k_ * 4,
                                   cudaMemcpyDeviceToHost, stream_));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    moe_entries_ = host_offsets_[experts_];
    return {};
  }
  Status run_expert(const LinearWeights& w, const uint16_t* x, int64_t m, uint16_t* y) {
    if (Status st = mxq::cuda::linear(*lin_, w, x, m, y, stream_); !st)
      return fail_in(fmt::format("model.layers.{}.mlp.experts", moe_layer_), st.error());
    return {};
  }
  // The grouped linears' input (they take no LinearContext): x [rows, k] quantize-dequantized into the
  // context's W8A8 scratch when the experts run W8A8, else x.
  Result<const uint16_t*> moe_input(const MoeGroupedWeights& w, const uint16_t* x, int64_t rows) {
    if (w.act() == Format::kBF16) return x;
    auto xq = lin_->act_scratch(rows, w.k(), stream_);
    if (!xq) return fail_in(w.name(), xq.error());
    if (Status st = fake_quant_mxfp8(x, rows, w.k(), *xq, stream_); !st) return fail_in(w.name(), st.error());
    return *xq;
  }

  // The dispatch table's view of a live weight, made once per tensor (the store's buffers never move, so the
  // view stays valid across refits), with the W8A8 mode for MX formats.
  Result<LinearWeights> weights(const QTensor& t) {
    if (auto hit = weights_.find(&t); hit != weights_.end()) return hit->second;
    auto l = linear_weights(t.name, t.format, t.shape, t.values, t.scales);
    if (!l) return tl::unexpected(l.error());
    if (is_mx(t.format)) l->act = options_.act_quant;
    weights_.emplace(&t, *l);
    return *l;
  }
  // The FP8-B128 GEMM's and the W8A8 mode's scratch, grown to the largest projection seen at the pool's row
  // capacity. note: eager steps only (a graph capture would need it sized before the first step)
  Status reserve(const LinearWeights& w) {
    const bool act = w.act == Format::kMXFP8;
    if (w.format != Format::kFP8_B128 && !act) return {};
    const int64_t m = kv_->shape().max_tokens;
    if (m <= reserved_m_ && w.n <= reserved_n_ && w.k <= reserved_k_ && (!act || reserved_act_)) return {};
    reserved_m_ = std::max(reserved_m_, m), reserved_n_ = std::max(reserved_n_, w.n);
    reserved_k_ = std::max(reserved_k_, w.k), reserved_act_ = reserved_act_ || act;
    if (Status st = lin_->reserve(reserved_m_, reserved_n_, reserved_k_, reserved_act_); !st)
      return fail_in("cuda backend linear scratch", st.error());
    return {};
  }
  Result<const float*> inv_freq(float theta, int64_t head_dim) {
    const auto key = std::pair{theta, head_dim};
    if (auto hit = inv_freq_.find(key); hit != inv_freq_.end()) return hit->second.as<const float>();
    auto inv = rope_inv_freq(theta, head_dim);
    if (!inv) return tl::unexpected(inv.error());
    auto d = DeviceBuffer::alloc(inv->size() * 4);
    if (!d) return tl::unexpected(d.error());
    MXQ_CUDA_CHECK(cudaMemcpy(d->as(), inv->data(), inv->size() * 4, cudaMemcpyHostToDevice));
    const float* p = d->as<const float>();
    inv_freq_.emplace(key, std::move(*d));
    return p;
  }

  CudaBackendOptions options_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<LinearContext> lin_;
  std::map<const QTensor*, LinearWeights> weights_;
  std::map<std::pair<float, int64_t>, DeviceBuffer> inv_freq_;
  int64_t reserved_m_ = 0, reserved_n_ = 0, reserved_k_ = 0;
  bool reserved_act_ = false;
  DeviceBuffer decode_ws_, sel_;
  // MoE routing state (moe_route to moe_combine) and the experts' views per layer
  DeviceBuffer moe_counts_, moe_offsets_, moe_active_, moe_ids_, moe_weights_, moe_sorted_, moe_row_of_,
      moe_xe_;
  std::vector<int32_t> host_offsets_, host_sorted_;
  int64_t experts_ = 0, moe_lx_ = 0, moe_cap_ = 0, moe_layer_ = -1, moe_top_k_ = 0, moe_entries_ = -1;
  int64_t moe_parts_ = 1;  // 2: one module per expert, gate rows of the entries then up rows
  std::map<int64_t, ExpertWeights> experts_w_;
  CudaKvPool* kv_ = nullptr;  // the pool of the step running (run_step)
  ForwardShape shape_;
  int64_t rows_ = 0;  // the step's rows (padding of a decode bucket included)
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options) {
  auto b = CudaBackend::create(options);
  if (!b) return tl::unexpected(b.error());
  return std::unique_ptr<Backend>(std::move(*b));
}

}  // namespace mxq::cuda
