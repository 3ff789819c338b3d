// Reads top to bottom like model/qwen3.cpp (and transformers' modeling_qwen3.py / modeling_qwen3_moe.py);
// each step names the HF module it computes. Batched over the step's tokens, paged KV (docs/cuda-ops.md):
// bf16 between ops, the residual stream, logits and router logits f32.
#include "model/qwen3_cuda.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <climits>
#include <map>
#include <vector>

#include "cpu/rope.h"
#include "cuda/attention/attention_prefill.h"
#include "cuda/attention/paged_attention_decode.h"
#include "cuda/attention/qk_norm_rope_cache.h"
#include "cuda/common/check.h"
#include "cuda/linear/linear.h"
#include "cuda/linear/moe_grouped_linear.h"
#include "cuda/ops/embedding.h"
#include "cuda/ops/rms_norm.h"
#include "cuda/ops/sample.h"
#include "cuda/ops/swiglu.h"
#include "layout/probe.h"
#include "model/qwen3_cuda_parts.h"
#include "model/qwen3_weights.h"
#include "model/step_profile_cuda.h"
#include "model/weight_memory_cuda.h"

namespace mxq::cuda {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) { return s.ends_with(suffix); }

// Byte offsets of the arrays of one pinned/device block, each 16-byte aligned.
struct BlockPlan {
  size_t bytes = 0;
  size_t take(size_t n) {
    const size_t at = bytes;
    bytes += (n + 15) / 16 * 16;
    return at;
  }
};

}  // namespace

LoadTarget cuda_load_target() {
  LoadTarget t;
  t.memory = [] { return cuda_weight_memory(); };
  // note: the table's arch of the current device, looked up at the first quantized tensor (the memory is made
  // first, so the device exists by then)
  auto arch = std::make_shared<std::optional<Arch>>();
  // note: probing runs the prepare on full-size index planes, ~1 s for a 50 MB projection; a layout depends
  // only on (format, shape), so each is probed once per load (Qwen3-8B: 5 shapes, not 252 tensors, which
  // took minutes).
  auto probed = std::make_shared<std::map<std::pair<Format, std::vector<int64_t>>, Layout>>();
  t.layout = [arch, probed](const std::string& name, Format f,
                            const std::vector<int64_t>& shape) -> Result<std::optional<Layout>> {
    if (ends_with(name, ".bias"))
      return fail("{}: attention_bias is not supported by the CUDA engine (no bias add)", name);
    if ((ends_with(name, "q_norm.weight") || ends_with(name, "k_norm.weight")) && shape[0] != 64 &&
        shape[0] != 128)
      return fail("{}: head_dim {} is not supported by the CUDA engine (64 or 128)", name, shape[0]);
    switch (f) {
      case Format::kBF16:
        return std::optional<Layout>{};
      case Format::kMXFP8:
      case Format::kMXFP4:
      case Format::kFP8_B128: {
        // The native layout of cuda/linear/linear.h's kernels (one per format, read by the GEMV and the GEMM
        // alike), probed from linear_prepare so refit writes through it.
        if (!*arch) {
          int device = 0;
          MXQ_CUDA_CHECK(cudaGetDevice(&device));
          auto a = device_arch(device);
          if (!a) return fail_in(name, a.error());
          *arch = *a;
        }
        if (auto hit = probed->find({f, shape}); hit != probed->end())
          return std::optional<Layout>(hit->second);
        auto g = tensor_geometry(name, f, shape);
        if (!g) return tl::unexpected(g.error());
        auto l = probe_layout(name, linear_layout_name(f), f, shape,
                              [&](const HostPlanes& in) { return linear_prepare(f, **arch, *g, in); });
        if (!l) return tl::unexpected(l.error());
        probed->emplace(std::pair{f, shape}, *l);
        return std::optional<Layout>(std::move(*l));
      }
      default:
        return fail(
            "{}: {} tensors are not supported by the CUDA engine (its ops read bf16); load a bf16 or "
            "quantized checkpoint",
            name, traits(f).name);
    }
  };
  return t;
}

Qwen3Cuda::~Qwen3Cuda() {
  if (b_) {
    if (b_->host_meta) cudaFreeHost(b_->host_meta);
    if (b_->host_out) cudaFreeHost(b_->host_out);
    if (b_->host_offsets) cudaFreeHost(b_->host_offsets);
    if (b_->host_sorted) cudaFreeHost(b_->host_sorted);
  }
  lin_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

bool Qwen3Cuda::has_moe() const {
  return std::any_of(w_->layers.begin(), w_->layers.end(), [](const Weights::Layer& l) { return l.sparse; });
}

int64_t Qwen3Cuda::kv_bytes() const { return static_cast<int64_t>(b_->kv.bytes()); }

Result<std::unique_ptr<Qwen3Cuda>> Qwen3Cuda::create(const ModelConfig& c, const WeightStore& store,
                                                     const Qwen3CudaOptions& opt) {
  // --- what the engine runs, refused by name (the forward's own refusals first) ---
  if (auto st = check_qwen3_config(c); !st) return tl::unexpected(st.error());
  if (c.head_dim != 64 && c.head_dim != 128)
    return fail("{}: head_dim {} is not supported by the CUDA engine (64 or 128)", c.architecture,
                c.head_dim);
  if (c.attention_bias) return fail("{}: attention_bias is not supported by the CUDA engine", c.architecture);
  if (c.hidden_size % 32 != 0 || c.intermediate_size % 32 != 0 || c.moe_intermediate_size % 32 != 0)
    return fail(
        "{}: hidden_size {} / intermediate_size {} / moe_intermediate_size {}: expected multiples of 32",
        c.architecture, c.hidden_size, c.intermediate_size, c.moe_intermediate_size);
  // note: check_qwen3_config already refused num_experts_per_tok outside [1, num_experts].
  if (c.is_moe() && (c.num_experts > 1024 || c.num_experts_per_tok > 32))
    return fail(
        "{}: num_experts {} / num_experts_per_tok {}: the CUDA router takes up to 1024 experts, top 32",
        c.architecture, c.num_experts, c.num_experts_per_tok);
  if (!store.on_device())
    return fail("{}: the weight store is in {} memory, expected cuda", c.architecture, store.memory().name());
  Qwen3CudaOptions o = opt;
  if (o.max_model_len == 0) o.max_model_len = c.max_position_embeddings;
  if (o.max_model_len < 1 || o.max_model_len > c.max_position_embeddings)
    return fail("max_model_len: {}, expected 1..{} (max_position_embeddings)", o.max_model_len,
                c.max_position_embeddings);
  if (o.max_num_seqs < 1 || o.max_num_batched_tokens < 1 || o.block_size < 1)
    return fail("max_num_seqs {}, max_num_batched_tokens {}, block_size {}: expected >= 1", o.max_num_seqs,
                o.max_num_batched_tokens, o.block_size);
  if (!(o.gpu_memory_utilization > 0 && o.gpu_memory_utilization <= 1))
    return fail("gpu_memory_utilization: {}, expected in (0, 1]", o.gpu_memory_utilization);

  std::unique_ptr<Qwen3Cuda> m(new Qwen3Cuda());
  m->config_ = c;
  m->options_ = o;
  m->max_blocks_ = static_cast<int32_t>((o.max_model_len + o.block_size - 1) / o.block_size);
  m->w_ = std::make_unique<Weights>();
  m->b_ = std::make_unique<Buffers>();
  Weights& w = *m->w_;
  Buffers& b = *m->b_;

  // --- weights, by HF module name (model/qwen3_weights.h), as the kernels read them ---
  auto bound = bind_qwen3_weights(c, store);
  if (!bound) return tl::unexpected(bound.error());
  Error bad;
  auto bf16 = [&](const QTensor* t) -> const uint16_t* {
    if (t->format != Format::kBF16 && bad.message.empty())
      bad = Error{fmt::format("{}: {} (expected bf16)", t->name, traits(t->format).name)};
    return reinterpret_cast<const uint16_t*>(t->values.data());
  };
  auto lin = [&](const QTensor* t, int64_t expert = -1) -> Lin {
    auto l = linear_weights(t->name, t->format, t->shape, t->values, t->scales, expert);
    if (!l) {
      if (bad.message.empty()) bad = l.error();
      return {};
    }
    if (is_mx(t->format)) l->act = o.act_quant;
    const double experts = expert < 0 ? 1.0 : static_cast<double>(t->shape[0]);
    return Lin{*l, &t->name, static_cast<double>(t->values.size() + t->scales.size()) / experts};
  };
  w.embed_tokens = bf16(bound->embed_tokens);
  w.norm = bf16(bound->norm);
  w.lm_head = lin(bound->lm_head);
  for (const Qwen3LayerWeights& bl : bound->layers) {
    Weights::Layer l{};
    l.input_layernorm = bf16(bl.input_layernorm);
    l.post_attention_layernorm = bf16(bl.post_attention_layernorm);
    l.q_proj = lin(bl.q_proj);
    l.k_proj = lin(bl.k_proj);
    l.v_proj = lin(bl.v_proj);
    l.o_proj = lin(bl.o_proj);
    l.q_norm = bf16(bl.q_norm);
    l.k_norm = bf16(bl.k_norm);
    l.sparse = bl.sparse;
    if (!l.sparse) {
      l.gate_proj = lin(bl.gate_proj);
      l.up_proj = lin(bl.up_proj);
      l.down_proj = lin(bl.down_proj);
    } else {
      l.router = lin(bl.router);
      for (int64_t e = 0; e < c.num_experts; ++e) {
        if (bound->stacked_experts) {
          l.gate_up.push_back(lin(bl.gate_up_proj, e));
          l.down.push_back(lin(bl.experts_down_proj, e));
        } else {
          l.gate.push_back(lin(bl.expert_gate[e]));
          l.up.push_back(lin(bl.expert_up[e]));
          l.down.push_back(lin(bl.expert_down[e]));
        }
      }
    }
    w.layers.push_back(std::move(l));
  }
  if (!bad.message.empty()) return fail_in(c.architecture, bad);
  // the grouped decode linears' pointer tables (cuda/linear/moe_grouped_linear.h), over the same expert views
  for (size_t i = 0; i < w.layers.size(); ++i) {
    Weights::Layer& l = w.layers[i];
    if (!l.sparse) continue;
    std::vector<LinearWeights> gu, dn;
    const std::string p = fmt::format("model.layers.{}.mlp.experts", i);
    for (size_t e = 0; e < l.down.size(); ++e) {
      if (!l.gate_up.empty()) {
        gu.push_back(l.gate_up[e].w);
        l.expert_gate_up_bytes = l.gate_up[e].bytes;
      } else {
        gu.push_back(l.gate[e].w);
        gu.push_back(l.up[e].w);
        l.expert_gate_up_bytes = l.gate[e].bytes + l.up[e].bytes;
      }
      dn.push_back(l.down[e].w);
      l.expert_down_bytes = l.down[e].bytes;
    }
    auto g = MoeGroupedWeights::create(p + (l.gate_up.empty() ? ".*.gate_proj/up_proj" : ".gate_up_proj"), gu,
                                       l.gate_up.empty() ? 2 : 1);
    if (!g) return fail_in(c.architecture, g.error());
    auto d = MoeGroupedWeights::create(p + (l.gate_up.empty() ? ".*.down_proj" : ".down_proj"), dn, 1);
    if (!d) return fail_in(c.architecture, d.error());
    l.grouped_gate_up.emplace(std::move(*g));
    l.grouped_down.emplace(std::move(*d));
  }
  if (w.lm_head.w.format != Format::kBF16)
    return fail("{}: lm_head in {}, expected bf16 (logits are computed in f32 by cuBLAS)", c.architecture,
                traits(w.lm_head.w.format).name);
  for (const auto& l : w.layers)
    if (l.sparse && l.router.w.format != Format::kBF16)
      return fail("{}: mlp.gate in {}, expected bf16", c.architecture, traits(l.router.w.format).name);

  // --- stream, the linear dispatch table (cuda/linear/linear.h) ---
  const int64_t T = std::max<int64_t>(o.max_num_batched_tokens, o.max_num_seqs);
  int device = 0;
  MXQ_CUDA_CHECK(cudaGetDevice(&device));
  auto arch = device_arch(device);
  if (!arch) return fail_in(c.architecture, arch.error());
  // Every projection must have a kernel for every M a step can give it (1..T: an expert gets at most one
  // row per token), refused naming tensor, format, arch and M range.
  int64_t fp8_n = 0, fp8_k = 0;
  auto supported = [&](const Lin& l) -> Status {
    if (Status st = check_linear_supported(l.w.format, *arch, *l.name, l.w.n, l.w.k, T); !st) return st;
    if (l.w.format == Format::kFP8_B128) fp8_n = std::max(fp8_n, l.w.n), fp8_k = std::max(fp8_k, l.w.k);
    return {};
  };
  for (const auto& l : w.layers) {
    for (const Lin* p : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj})
      if (Status st = supported(*p); !st) return tl::unexpected(st.error());
    if (!l.sparse) {
      for (const Lin* p : {&l.gate_proj, &l.up_proj, &l.down_proj})
        if (Status st = supported(*p); !st) return tl::unexpected(st.error());
    }
    for (const auto* v : {&l.gate_up, &l.down, &l.gate, &l.up})
      for (const Lin& e : *v)
        if (Status st = supported(e); !st) return tl::unexpected(st.error());
  }
  MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&m->stream_, cudaStreamNonBlocking));
  auto ctx = LinearContext::create(*arch);
  if (!ctx) return fail_in("CUDA engine linear context", ctx.error());
  m->lin_ = std::move(*ctx);
  // note: the FP8-B128 GEMM's and the W8A8 mode's activation scratch sized for the largest step now, so
  // nothing is allocated (and no buffer moves) inside a graph capture; the other kernels take no scratch.
  // The W8A8 rows: a step's tokens, or its expert entries (tokens · top_k) for the grouped down_proj.
  if (o.act_quant != Format::kBF16 && o.act_quant != Format::kMXFP8)
    return fail("{}: activation quantization {} (expected bf16 or mxfp8)", c.architecture,
                traits(o.act_quant).name);
  const bool act = o.act_quant == Format::kMXFP8;
  if (fp8_n > 0 || act) {
    const int64_t act_m = c.is_moe() ? T * c.num_experts_per_tok : T;
    const int64_t act_k = std::max({c.hidden_size, c.intermediate_size, c.moe_intermediate_size});
    if (Status st = m->lin_->reserve(act ? act_m : T, fp8_n, act ? std::max(act_k, fp8_k) : fp8_k, act); !st)
      return fail_in("CUDA engine linear scratch", st.error());
  }
  auto alloc = [&](DeviceBuffer& buf, size_t bytes) -> Status {
    auto d = DeviceBuffer::alloc(std::max<size_t>(bytes, 16));
    if (!d) return tl::unexpected(d.error());
    buf = std::move(*d);
    // note: zeroed, so padding rows a bucket computes on before any step wrote them are finite.
    MXQ_CUDA_CHECK(cudaMemsetAsync(buf.as(), 0, buf.bytes(), m->stream_));
    return {};
  };
  // --- activations at capacity ---
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  // note: the dense MLP's buffers only (the MoE layers have their own below).
  const int64_t I = c.dense_intermediate_size(), V = c.vocab_size, S = o.max_num_seqs;
  const int64_t qkv_w = (Hq + 2 * Hkv) * D;
  b.tokens = T;
  Status st;
  auto need = [&](DeviceBuffer& buf, size_t bytes) {
    if (st) st = alloc(buf, bytes);
  };
  need(b.residual, T * H * 4);
  need(b.normed, T * H * 2);
  need(b.qkv, T * qkv_w * 2);
  need(b.q, T * Hq * D * 2);
  need(b.attn, T * Hq * D * 2);
  need(b.hidden, T * H * 2);
  need(b.gate, T * I * 2);
  need(b.up, T * I * 2);
  need(b.act, T * I * 2);
  need(b.sel, S * H * 2);
  need(b.logits, S * V * 4);
  need(b.inv_freq, D / 2 * 4);
  need(b.decode_ws,
       paged_attention_decode_workspace_bytes(static_cast<int>(S), static_cast<int>(Hq), static_cast<int>(D),
                                              m->max_blocks_, o.block_size));
  if (c.is_moe()) {
    const int64_t E = c.num_experts, K = c.num_experts_per_tok, Im = c.moe_intermediate_size;
    need(b.router_logits, T * E * 4);
    need(b.moe_ids, T * K * 4);
    need(b.moe_weights, T * K * 4);
    const int64_t L = c.num_hidden_layers;
    need(b.moe_counts, L * E * 4);
    need(b.moe_offsets, L * (E + 1) * 4);
    need(b.moe_active, L * E * 4);
    need(b.moe_sorted, T * K * 4);
    need(b.moe_row_of, T * K * 4);
    need(b.xe, T * K * H * 2);
    need(b.gu, T * K * 2 * Im * 2);
    need(b.acte, T * K * Im * 2);
    need(b.ye, T * K * H * 2);
    MXQ_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&b.host_offsets), (E + 1) * 4));
    MXQ_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&b.host_sorted), T * K * 4));
  }
  if (!st) return fail_in("CUDA engine buffers", st.error());
  auto inv = rope_inv_freq(static_cast<float>(c.rope.theta), D);
  if (!inv) return tl::unexpected(inv.error());
  MXQ_CUDA_CHECK(
      cudaMemcpyAsync(b.inv_freq.as(), inv->data(), inv->size() * 4, cudaMemcpyHostToDevice, m->stream_));

  // --- step metadata and outputs: one block each, pinned host twin ---
  BlockPlan mp;
  const size_t o_seed = mp.take(S * 8), o_step = mp.take(S * 8), o_temp = mp.take(S * 4),
               o_top_p = mp.take(S * 4), o_min_p = mp.take(S * 4), o_top_k = mp.take(S * 4),
               o_ids = mp.take(T * 4), o_pos = mp.take(T * 4), o_slot = mp.take(T * 4), o_sl = mp.take(S * 4),
               o_cu = mp.take((S + 1) * 4), o_nt = mp.take(4), o_ns = mp.take(4);
  // note: block tables last, so a step uploads the rows of its own sequences only (a [256, 2560] table of a
  // 40k context is 2.6 MB; a step's rows are what it reads).
  const size_t o_bt = mp.take(S * m->max_blocks_ * 4);
  b.meta_bytes = mp.bytes;
  b.meta_head_bytes = o_bt;
  need(b.meta, b.meta_bytes);
  MXQ_CUDA_CHECK(cudaMallocHost(&b.host_meta, b.meta_bytes));
  std::fill_n(static_cast<uint8_t*>(b.host_meta), b.meta_bytes, 0);
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
  views(static_cast<uint8_t*>(b.host_meta), m->host_meta_);
  views(b.meta.as<uint8_t>(), m->dev_meta_);
  BlockPlan op;
  const size_t o_tok = op.take(S * 4), o_status = op.take(S * 4), o_lp = op.take(S * 4), o_bad = op.take(4);
  b.out_bytes = op.bytes;
  need(b.out, b.out_bytes);
  MXQ_CUDA_CHECK(cudaMallocHost(&b.host_out, b.out_bytes));
  auto out_views = [&](uint8_t* base, StepOutputs& v) {
    v.token = reinterpret_cast<int32_t*>(base + o_tok);
    v.status = reinterpret_cast<int32_t*>(base + o_status);
    v.logprob = reinterpret_cast<float*>(base + o_lp);
    v.bad_token = reinterpret_cast<int32_t*>(base + o_bad);
  };
  out_views(static_cast<uint8_t*>(b.host_out), m->host_out_);
  out_views(b.out.as<uint8_t>(), m->dev_out_);
  if (!st) return fail_in("CUDA engine buffers", st.error());
  const int32_t no_bad = INT32_MAX;
  MXQ_CUDA_CHECK(cudaMemcpyAsync(m->dev_out_.bad_token, &no_bad, 4, cudaMemcpyHostToDevice, m->stream_));
  MXQ_CUDA_CHECK(cudaStreamSynchronize(m->stream_));

  // --- the paged KV pool: what the utilization leaves after weights and buffers (vLLM semantics) ---
  const int64_t block_bytes = 2 * c.num_hidden_layers * o.block_size * Hkv * D * 2;
  const int64_t blocks_per_seq = m->max_blocks_;
  int64_t blocks = o.num_blocks;
  if (blocks <= 0) {
    size_t free_b = 0, total_b = 0;
    MXQ_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const double budget =
        o.gpu_memory_utilization * static_cast<double>(total_b) - static_cast<double>(total_b - free_b);
    blocks = budget > 0 ? static_cast<int64_t>(budget / static_cast<double>(block_bytes)) : 0;
    // note: never more than max_num_seqs full-length sequences can use (vLLM does not cap; a small model
    // would otherwise take most of the GPU for blocks it can never fill).
    blocks = std::min(blocks, S * blocks_per_seq);
    if (blocks < blocks_per_seq)
      return fail(
          "gpu_memory_utilization {}: {} KV blocks of {} bytes fit ({} MiB used of {} MiB), one "
          "sequence of max_model_len {} needs {}",
          o.gpu_memory_utilization, blocks, block_bytes, (total_b - free_b) >> 20, total_b >> 20,
          o.max_model_len, blocks_per_seq);
  }
  if (blocks > INT32_MAX / o.block_size)
    return fail("num_blocks: {} slots exceed int32", blocks * o.block_size);
  m->num_blocks_ = blocks;
  if (auto s = alloc(b.kv, static_cast<size_t>(blocks * block_bytes)); !s)
    return fail("KV pool of {} blocks ({} MiB): {}", blocks, (blocks * block_bytes) >> 20, s.error().message);
  const int64_t layer_elems = blocks * o.block_size * Hkv * D;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    b.k_cache.push_back(b.kv.as<uint16_t>() + (2 * i) * layer_elems);
    b.v_cache.push_back(b.kv.as<uint16_t>() + (2 * i + 1) * layer_elems);
  }
  MXQ_CUDA_CHECK(cudaStreamSynchronize(m->stream_));
  return m;
}

Status Qwen3Cuda::upload_meta(int32_t seqs) {
  const size_t bytes = std::min(
      b_->meta_bytes, b_->meta_head_bytes + static_cast<size_t>(std::max(seqs, 0)) * max_blocks_ * 4);
  MXQ_CUDA_CHECK(cudaMemcpyAsync(b_->meta.as(), b_->host_meta, bytes, cudaMemcpyHostToDevice, stream_));
  return {};
}

Status Qwen3Cuda::download_outputs() {
  MXQ_CUDA_CHECK(cudaMemcpyAsync(b_->host_out, b_->out.as(), b_->out_bytes, cudaMemcpyDeviceToHost, stream_));
  MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return {};
}

Status Qwen3Cuda::download_logits(int32_t row, std::span<float> out) {
  const int64_t V = config_.vocab_size;
  if (row < 0 || row >= options_.max_num_seqs || static_cast<int64_t>(out.size()) != V)
    return fail("download_logits: row {} of {}, {} floats for vocab {}", row, options_.max_num_seqs,
                out.size(), V);
  MXQ_CUDA_CHECK(
      cudaMemcpyAsync(out.data(), b_->logits.as<float>() + row * V, V * 4, cudaMemcpyDeviceToHost, stream_));
  MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return {};
}

Status Qwen3Cuda::copy_kv_block(int32_t src, int32_t dst, int32_t slots) {
  const int32_t bs = options_.block_size;
  if (src < 0 || src >= num_blocks_ || dst < 0 || dst >= num_blocks_ || slots < 0 || slots > bs)
    return fail("KV block copy {} -> {} of {} slots: the pool has {} blocks of {}", src, dst, slots,
                num_blocks_, bs);
  if (src == dst || slots == 0) return {};
  // note: each layer's K (and V) pool is [num_blocks, block_size, kv_heads, head_dim] bf16 (the
  // qk_norm_rope_cache write, slot = block · block_size + offset), so a block's leading slots are contiguous.
  const int64_t row = config_.num_key_value_heads * config_.head_dim;
  const int64_t from = static_cast<int64_t>(src) * bs * row, to = static_cast<int64_t>(dst) * bs * row;
  const size_t bytes = static_cast<size_t>(slots * row) * 2;
  for (size_t i = 0; i < b_->k_cache.size(); ++i)
    for (uint16_t* cache : {b_->k_cache[i], b_->v_cache[i]})
      MXQ_CUDA_CHECK(cudaMemcpyAsync(cache + to, cache + from, bytes, cudaMemcpyDeviceToDevice, stream_));
  return {};
}

Status Qwen3Cuda::run_linear(const Lin& l, const uint16_t* x, int64_t m, uint16_t* y) {
  if (Status st = linear(*lin_, l.w, x, m, y, stream_); !st) return fail_in(*l.name, st.error());
  return {};
}

// Projections of the same x (q/k/v, gate/up) through linear_parts: one launch where the table runs a GEMV.
Status Qwen3Cuda::run_linear_parts(std::initializer_list<const Lin*> ls, const uint16_t* x, int64_t m,
                                   std::initializer_list<uint16_t*> ys) {
  assert(ls.size() <= static_cast<size_t>(kLinearMaxParts) && ls.size() == ys.size());
  LinearWeights w[kLinearMaxParts];
  size_t n = 0;
  std::string names;
  for (const Lin* l : ls) {
    w[n++] = l->w;
    names += (names.empty() ? "" : " + ") + *l->name;
  }
  if (Status st = linear_parts(*lin_, std::span(w, n), x, m, std::span(ys.begin(), ys.size()), stream_); !st)
    return fail_in(names, st.error());
  return {};
}

Status Qwen3Cuda::mark(StepOp op, double bytes) {
  return profiler_ ? profiler_->mark(op, bytes, stream_) : Status{};
}

Status Qwen3Cuda::forward(const ForwardShape& s) {
  const ModelConfig& c = config_;
  Buffers& b = *b_;
  const Weights& w = *w_;
  const StepMeta& meta = dev_meta_;
  const int64_t rows = s.rows;
  if (rows < 1 || rows > b.tokens || s.seqs < 1 || s.seqs > options_.max_num_seqs ||
      s.sample_rows > options_.max_num_seqs)
    return fail("forward: {} rows (capacity {}), {} sequences, {} sampled (capacity {})", rows, b.tokens,
                s.seqs, s.sample_rows, options_.max_num_seqs);
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const float eps = static_cast<float>(c.rms_norm_eps);
  uint16_t* normed = b.normed.as<uint16_t>();
  // the q, k and v projections' outputs, each [rows, width] contiguous (qk_norm_rope_cache's k_in / v_in)
  uint16_t* q_lin = b.qkv.as<uint16_t>();
  uint16_t* k_lin = q_lin + b.tokens * Hq * D;
  uint16_t* v_lin = k_lin + b.tokens * Hkv * D;
  uint16_t* hidden = b.hidden.as<uint16_t>();
  float* residual = b.residual.as<float>();
  // Step profile (eager steps with a profiler only): bytes each op class reads. Rows read by a norm: the f32
  // residual and the bf16 addend.
  const double rd = static_cast<double>(rows);
  const double norm_bytes = rd * static_cast<double>(H) * 6 + static_cast<double>(H) * 2;
  double kv_read = 0;  // K and V bytes one layer's attention reads
  if (profiler_) {
    if (Status st = profiler_->begin(stream_); !st) return st;
    for (int32_t i = 0; i < s.seqs; ++i) kv_read += static_cast<double>(host_meta_.seq_lens[i]);
    kv_read *= static_cast<double>(Hkv * D * 2 * 2);
  }

  // model.embed_tokens (into the f32 residual stream)
  MXQ_LAUNCH("embedding", launch_embedding_f32(w.embed_tokens, c.vocab_size, H, meta.ids, meta.num_tokens,
                                               rows, residual, dev_out_.bad_token, stream_));
  if (Status st = mark(StepOp::kEmbedding, rd * static_cast<double>(H) * 2); !st) return st;
  // layers[0].input_layernorm (each later input_layernorm is fused with the residual add below)
  MXQ_LAUNCH("rms_norm", launch_rms_norm_f32(residual, w.layers[0].input_layernorm, eps, H, meta.num_tokens,
                                             rows, normed, stream_));
  if (Status st = mark(StepOp::kNorm, norm_bytes); !st) return st;

  for (size_t i = 0; i < w.layers.size(); ++i) {
    const Weights::Layer& l = w.layers[i];
    // self_attn.q_proj / k_proj / v_proj
    if (auto st = run_linear_parts({&l.q_proj, &l.k_proj, &l.v_proj}, normed, rows, {q_lin, k_lin, v_lin});
        !st)
      return st;
    if (Status st = mark(StepOp::kQkvLinear, l.q_proj.bytes + l.k_proj.bytes + l.v_proj.bytes +
                                                 3 * rd * static_cast<double>(H) * 2);
        !st)
      return st;
    // self_attn.q_norm / k_norm, rotary_emb + apply_rotary_pos_emb, past_key_values.update (paged write)
    QkNormRopeArgs qa{};
    qa.qkv = q_lin;
    qa.k_in = k_lin;
    qa.v_in = v_lin;
    qa.q_norm = l.q_norm;
    qa.k_norm = l.k_norm;
    qa.inv_freq = b.inv_freq.as<float>();
    qa.positions = meta.positions;
    qa.slot_mapping = meta.slot_mapping;
    qa.num_tokens = meta.num_tokens;
    qa.q_out = b.q.as<uint16_t>();
    qa.k_cache = b.k_cache[i];
    qa.v_cache = b.v_cache[i];
    qa.bad_token = dev_out_.bad_token;
    qa.max_tokens = rows;
    qa.num_slots = num_blocks_ * options_.block_size;
    qa.q_heads = static_cast<int>(Hq);
    qa.kv_heads = static_cast<int>(Hkv);
    qa.head_dim = static_cast<int>(D);
    qa.eps = eps;
    MXQ_LAUNCH("qk_norm_rope_cache", launch_qk_norm_rope_cache(qa, stream_));
    if (Status st = mark(StepOp::kQkNormRopeCache, rd * static_cast<double>((Hq + 2 * Hkv) * D) * 2); !st)
      return st;
    // eager_attention_forward (causal, GQA, scaling head_dim^-0.5) over the paged cache
    if (s.decode) {
      PagedDecodeArgs a{b.q.as<uint16_t>(),    b.k_cache[i],
                        b.v_cache[i],          meta.block_tables,
                        meta.seq_lens,         b.decode_ws.as<float>(),
                        b.attn.as<uint16_t>(), s.seqs,
                        max_blocks_,           options_.block_size,
                        static_cast<int>(Hq),  static_cast<int>(Hkv),
                        static_cast<int>(D)};
      MXQ_LAUNCH("paged_attention_decode", launch_paged_attention_decode(a, stream_));
    } else {
      PrefillArgs a{b.q.as<uint16_t>(),    b.k_cache[i],           b.v_cache[i],
                    meta.block_tables,     meta.cu_seqlens,        meta.seq_lens,
                    b.attn.as<uint16_t>(), static_cast<int>(rows), s.seqs,
                    max_blocks_,           options_.block_size,    static_cast<int>(Hq),
                    static_cast<int>(Hkv), static_cast<int>(D)};
      MXQ_LAUNCH("attention_prefill", launch_attention_prefill(a, stream_));
    }
    if (Status st = mark(StepOp::kAttention, kv_read + rd * static_cast<double>(Hq * D) * 2); !st) return st;
    // self_attn.o_proj
    if (auto st = run_linear(l.o_proj, b.attn.as<uint16_t>(), rows, hidden); !st) return st;
    if (Status st = mark(StepOp::kOLinear, l.o_proj.bytes + rd * static_cast<double>(Hq * D) * 2); !st)
      return st;
    // residual add, post_attention_layernorm
    MXQ_LAUNCH("add_rms_norm", launch_add_rms_norm(hidden, residual, l.post_attention_layernorm, eps, H,
                                                   meta.num_tokens, rows, normed, stream_));
    if (Status st = mark(StepOp::kNorm, norm_bytes); !st) return st;
    // mlp: Qwen3MoeSparseMoeBlock on sparse layers, Qwen3MLP otherwise
    auto st = l.sparse ? sparse_moe_block(i, rows, s.decode) : mlp(i, rows);
    if (!st) return st;
    // residual add, then the next layer's input_layernorm or the final model.norm
    const uint16_t* next_norm = i + 1 < w.layers.size() ? w.layers[i + 1].input_layernorm : w.norm;
    MXQ_LAUNCH("add_rms_norm", launch_add_rms_norm(hidden, residual, next_norm, eps, H, meta.num_tokens, rows,
                                                   normed, stream_));
    if (Status st2 = mark(StepOp::kNorm, norm_bytes); !st2) return st2;
  }

  // lm_head, on the sampling rows only: a decode step samples every row, a mixed step the last token of each
  // chunk that completes its sequence (gathered here).
  if (s.sample_rows == 0) return {};
  const uint16_t* x = normed;
  if (!s.decode) {
    for (int32_t j = 0; j < s.sample_rows; ++j)
      MXQ_CUDA_CHECK(cudaMemcpyAsync(b.sel.as<uint16_t>() + j * H, normed + s.sample_token_rows[j] * H, H * 2,
                                     cudaMemcpyDeviceToDevice, stream_));
    x = b.sel.as<uint16_t>();
  }
  if (Status st = linear_f32(*lin_, w.lm_head.w, x, s.sample_rows, b.logits.as<float>(), stream_); !st)
    return fail_in(*w.lm_head.name, st.error());
  return mark(StepOp::kLmHead, w.lm_head.bytes + static_cast<double>(s.sample_rows * H) * 2);
}

Status Qwen3Cuda::sample(int32_t rows) {
  SampleArgs a{};
  a.logits = b_->logits.as<float>();
  a.temperature = dev_meta_.temperature;
  a.top_k = dev_meta_.top_k;
  a.top_p = dev_meta_.top_p;
  a.min_p = dev_meta_.min_p;
  a.seed = dev_meta_.seed;
  a.step = dev_meta_.step;
  a.num_seqs = dev_meta_.num_seqs;
  a.token = dev_out_.token;
  a.logprob = dev_out_.logprob;
  a.status = dev_out_.status;
  a.vocab = config_.vocab_size;
  a.max_seqs = rows;
  MXQ_LAUNCH("sample", launch_sample(a, stream_));
  return mark(StepOp::kSampling, static_cast<double>(rows) * static_cast<double>(config_.vocab_size) * 4);
}

// Qwen3MLP: down_proj(act_fn(gate_proj(x)) * up_proj(x))
Status Qwen3Cuda::mlp(size_t i, int64_t rows) {
  const Weights::Layer& l = w_->layers[i];
  Buffers& b = *b_;
  const int64_t I = config_.intermediate_size, H = config_.hidden_size;
  const double rd = static_cast<double>(rows);
  uint16_t *gate = b.gate.as<uint16_t>(), *up = b.up.as<uint16_t>(), *act = b.act.as<uint16_t>();
  if (auto st = run_linear_parts({&l.gate_proj, &l.up_proj}, b.normed.as<uint16_t>(), rows, {gate, up}); !st)
    return st;
  if (Status st = mark(StepOp::kGateUpLinear,
                       l.gate_proj.bytes + l.up_proj.bytes + 2 * rd * static_cast<double>(H) * 2);
      !st)
    return st;
  MXQ_LAUNCH("swiglu", launch_swiglu(gate, up, I, dev_meta_.num_tokens, rows, act, stream_));
  if (Status st = mark(StepOp::kSwiglu, rd * static_cast<double>(I) * 4); !st) return st;
  if (auto st = run_linear(l.down_proj, act, rows, b.hidden.as<uint16_t>()); !st) return st;
  return mark(StepOp::kDownLinear, l.down_proj.bytes + rd * static_cast<double>(I) * 2);
}

}  // namespace mxq::cuda
