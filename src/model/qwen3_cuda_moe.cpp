// Qwen3MoeSparseMoeBlock on the GPU: one of Qwen3Cuda's steps (model/qwen3_cuda.cpp has the rest); reads
// like transformers' modeling_qwen3_moe.py.
#include <fmt/format.h>

#include <vector>

#include "cuda/ops/moe_route.h"
#include "cuda/ops/swiglu.h"
#include "cuda/quantize/quantize_act.h"
#include "model/qwen3_cuda_parts.h"
#include "model/step_profile_cuda.h"

namespace mxq::cuda {

Result<const uint16_t*> Qwen3Cuda::moe_input(const MoeGroupedWeights& w, const uint16_t* x, int64_t rows) {
  if (w.act() == Format::kBF16) return x;
  auto xq = lin_->act_scratch(rows, w.k(), stream_);
  if (!xq) return fail_in(w.name(), xq.error());
  if (Status st = fake_quant_mxfp8(x, rows, w.k(), *xq, stream_); !st) return fail_in(w.name(), st.error());
  return *xq;
}

// Qwen3MoeSparseMoeBlock: router over mlp.gate, the token → expert grouping on the device, then each expert
// on its group of rows, outputs summed per token in expert order (moe_combine, as HF's loop over experts).
// Decode steps run every expert group in one grouped launch per projection
// (cuda/linear/moe_grouped_linear.h), driven by the grouping on the device: nothing waits for the host, so
// the step is graph-captured. Other steps (prefill, mixed) read the grouping back and run each expert through
// the dispatch table (its GEMM entries at large M).
Status Qwen3Cuda::sparse_moe_block(size_t i, int64_t rows, bool decode) {
  const Weights::Layer& l = w_->layers[i];
  const ModelConfig& c = config_;
  Buffers& b = *b_;
  const int64_t H = c.hidden_size, E = c.num_experts, K = c.num_experts_per_tok, Im = c.moe_intermediate_size;
  const double rd = static_cast<double>(rows);
  int32_t* offsets = b.moe_offsets.as<int32_t>() + static_cast<int64_t>(i) * (E + 1);
  int32_t* active = b.moe_active.as<int32_t>() + static_cast<int64_t>(i) * E;
  // mlp.gate (router logits, f32)
  if (Status st =
          linear_f32(*lin_, l.router.w, b.normed.as<uint16_t>(), rows, b.router_logits.as<float>(), stream_);
      !st)
    return fail_in(*l.router.name, st.error());
  // softmax, topk, norm_topk_prob, and the grouping by expert
  MoeRouteArgs ra{};
  ra.logits_f32 = b.router_logits.as<float>();
  ra.num_tokens = dev_meta_.num_tokens;
  ra.ids = b.moe_ids.as<int32_t>();
  ra.weights = b.moe_weights.as<float>();
  ra.counts = b.moe_counts.as<int32_t>() + static_cast<int64_t>(i) * E;
  ra.offsets = offsets;
  ra.sorted_rows = b.moe_sorted.as<int32_t>();
  ra.row_of = b.moe_row_of.as<int32_t>();
  ra.active = active;
  ra.max_tokens = static_cast<int>(rows);
  ra.experts = static_cast<int>(E);
  ra.top_k = static_cast<int>(K);
  ra.norm_topk_prob = c.norm_topk_prob;
  MXQ_LAUNCH("moe_route", launch_moe_route(ra, stream_));
  const int64_t cap = rows * K;  // entries of this step at most
  uint16_t *gu = b.gu.as<uint16_t>(), *act = b.acte.as<uint16_t>(), *ye = b.ye.as<uint16_t>();
  if (decode) {
    if (Status st = mark(StepOp::kMoeRoute, l.router.bytes + rd * static_cast<double>(H * 2 + E * 4)); !st)
      return st;
    // A profiled (eager) step counts the bytes the grouped ops read from this layer's grouping after the
    // step: weights of the active experts, activation rows of the entries.
    auto late = [&](double per_expert, double per_entry) {
      if (!profiler_) return Status{};
      return profiler_->late_bytes([offsets, E, per_expert, per_entry]() -> double {
        std::vector<int32_t> h(static_cast<size_t>(E + 1));
        if (cudaMemcpy(h.data(), offsets, h.size() * 4, cudaMemcpyDeviceToHost) != cudaSuccess) return 0;
        int64_t n = 0;
        for (int64_t e = 0; e < E; ++e) n += h[e + 1] > h[e];
        return static_cast<double>(n) * per_expert + static_cast<double>(h[E]) * per_entry;
      });
    };
    const MoeGroups g{offsets, active, b.moe_sorted.as<int32_t>(), K, cap};
    // mlp.experts.gate_up_proj [E, 2I, H] (per entry row: gate then up) / mlp.experts.<e>.gate_proj, up_proj
    // (gate rows in the first `cap` rows of gu, up rows in the next)
    auto xg = moe_input(*l.grouped_gate_up, b.normed.as<uint16_t>(), rows);
    if (!xg) return tl::unexpected(xg.error());
    if (Status st = moe_grouped_linear(*l.grouped_gate_up, g, /*gather=*/true, *xg, gu, stream_); !st)
      return st;
    if (Status st = mark(StepOp::kGateUpLinear, 0); !st) return st;
    if (Status st = late(l.expert_gate_up_bytes, static_cast<double>(H) * 2); !st) return st;
    // act_fn(gate) * up over every entry (the entry count offsets[E] read on the device)
    if (!l.gate_up.empty())
      MXQ_LAUNCH("swiglu", launch_swiglu_fused(gu, Im, offsets + E, cap, act, stream_));
    else
      MXQ_LAUNCH("swiglu", launch_swiglu(gu, gu + cap * Im, Im, offsets + E, cap, act, stream_));
    if (Status st = mark(StepOp::kSwiglu, 0); !st) return st;
    if (Status st = late(0, static_cast<double>(Im) * 4); !st) return st;
    // mlp.experts.down_proj [E, H, I] / mlp.experts.<e>.down_proj, on the entries in order
    auto xd = moe_input(*l.grouped_down, act, cap);
    if (!xd) return tl::unexpected(xd.error());
    if (Status st = moe_grouped_linear(*l.grouped_down, g, /*gather=*/false, *xd, ye, stream_); !st)
      return st;
    if (Status st = mark(StepOp::kDownLinear, 0); !st) return st;
    if (Status st = late(l.expert_down_bytes, static_cast<double>(Im) * 2); !st) return st;
  } else {
    // note: the host-driven loop (prefill and mixed steps, never captured): the grouping read back
    MXQ_CUDA_CHECK(cudaMemcpyAsync(b.host_offsets, offsets, (E + 1) * 4, cudaMemcpyDeviceToHost, stream_));
    MXQ_CUDA_CHECK(
        cudaMemcpyAsync(b.host_sorted, b.moe_sorted.as(), rows * K * 4, cudaMemcpyDeviceToHost, stream_));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const int32_t entries = b.host_offsets[E];
    // expert inputs in sorted_rows order: entry p reads token sorted_rows[p] / K (runs of consecutive tokens
    // copied at once)
    const uint16_t* x = b.normed.as<uint16_t>();
    uint16_t* xe = b.xe.as<uint16_t>();
    for (int32_t p = 0; p < entries;) {
      const int32_t t0 = b.host_sorted[p] / static_cast<int32_t>(K);
      int32_t run = 1;
      while (p + run < entries && b.host_sorted[p + run] / K == t0 + run) ++run;
      MXQ_CUDA_CHECK(cudaMemcpyAsync(xe + p * H, x + t0 * H, run * H * 2, cudaMemcpyDeviceToDevice, stream_));
      p += run;
    }
    if (Status st = mark(StepOp::kMoeRoute, l.router.bytes + rd * static_cast<double>(H * 2 + E * 4) +
                                                static_cast<double>(entries * H) * 2);
        !st)
      return st;
    // [gate | up] rows of each expert entry: stacked experts write them fused (gate_up_proj); one module per
    // expert writes gate rows in the first half of `gu` and up rows in the second (no strided output).
    const int64_t gcap = b.tokens * K;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t off = b.host_offsets[e], cnt = b.host_offsets[e + 1] - off;
      if (cnt == 0) continue;
      const double cd = static_cast<double>(cnt);
      if (!l.gate_up.empty()) {
        // mlp.experts.gate_up_proj [E, 2I, H]: per row gate then up
        if (auto st = run_linear(l.gate_up[e], xe + off * H, cnt, gu + off * 2 * Im); !st) return st;
        if (Status st = mark(StepOp::kGateUpLinear, l.gate_up[e].bytes + cd * static_cast<double>(H) * 2);
            !st)
          return st;
        MXQ_LAUNCH("swiglu",
                   launch_swiglu_fused(gu + off * 2 * Im, Im, nullptr, cnt, act + off * Im, stream_));
      } else {
        // mlp.experts.<e>.gate_proj / up_proj
        uint16_t *gp = gu + off * Im, *up = gu + gcap * Im + off * Im;
        if (auto st = run_linear(l.gate[e], xe + off * H, cnt, gp); !st) return st;
        if (auto st = run_linear(l.up[e], xe + off * H, cnt, up); !st) return st;
        if (Status st = mark(StepOp::kGateUpLinear,
                             l.gate[e].bytes + l.up[e].bytes + 2 * cd * static_cast<double>(H) * 2);
            !st)
          return st;
        MXQ_LAUNCH("swiglu", launch_swiglu(gp, up, Im, nullptr, cnt, act + off * Im, stream_));
      }
      if (Status st = mark(StepOp::kSwiglu, cd * static_cast<double>(Im) * 4); !st) return st;
      // mlp.experts.down_proj [E, H, I] / mlp.experts.<e>.down_proj
      if (auto st = run_linear(l.down[e], act + off * Im, cnt, ye + off * H); !st) return st;
      if (Status st = mark(StepOp::kDownLinear, l.down[e].bytes + cd * static_cast<double>(Im) * 2); !st)
        return st;
    }
  }
  // routing weights, summed per token in increasing expert id
  MXQ_LAUNCH("moe_combine",
             launch_moe_combine(ye, H, b.moe_ids.as<int32_t>(), b.moe_weights.as<float>(),
                                b.moe_row_of.as<int32_t>(), dev_meta_.num_tokens, static_cast<int>(rows),
                                static_cast<int>(K), b.hidden.as<uint16_t>(), stream_));
  return mark(StepOp::kMoeCombine, rd * static_cast<double>(K * H) * 2);
}

}  // namespace mxq::cuda
