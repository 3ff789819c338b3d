// The paged CPU runner: each plan as one batched step of Qwen3Model::step over a KV pool laid out as the
// CUDA engine's (Backend::create_kv, sized from the scheduler's pool on the first step), through the shared
// step builder; samples each sampling row on the host with its request's generator, in plan order, so a
// request draws what it draws alone.
#include <algorithm>

#include "engine/engine.h"
#include "engine/step_builder.h"
#include "model/qwen3.h"

namespace mxq {
namespace {

class CpuRunner final : public ModelRunner {
 public:
  explicit CpuRunner(Qwen3Model& model) : model_(&model) {}

  Result<std::vector<SampledToken>> run(const StepPlan& plan, const Scheduler& scheduler,
                                        std::span<const SampleSpec> specs) override {
    Backend& b = model_->backend();
    const ModelConfig& c = model_->config();
    const SchedulerConfig& sc = scheduler.config();
    const BlockPool& pool = scheduler.pool();
    if (!kv_) {
      max_blocks_ = static_cast<int32_t>((sc.max_model_len + pool.block_size() - 1) / pool.block_size());
      const KvShape shape{.layers = c.num_hidden_layers,
                          .kv_heads = c.num_key_value_heads,
                          .head_dim = c.head_dim,
                          .num_blocks = pool.num_blocks(),
                          .block_size = pool.block_size(),
                          .max_blocks = max_blocks_,
                          .max_tokens = std::max<int64_t>(sc.max_num_batched_tokens, sc.max_num_seqs),
                          .max_seqs = sc.max_num_seqs};
      auto kv = b.create_kv(shape);
      if (!kv) return tl::unexpected(kv.error());
      kv_ = std::move(*kv);
    }
    const int32_t S = static_cast<int32_t>(plan.chunks.size());
    auto layout = build_step(plan, scheduler, specs, S, max_blocks_, pool.block_size(), kv_->host_meta());
    if (!layout) return tl::unexpected(layout.error());
    // Copy-on-write of partial blocks before the step reads them.
    for (const BlockCopy& cp : plan.copies)
      if (auto st = kv_->copy_block(cp.src, cp.dst, cp.slots); !st) return tl::unexpected(st.error());
    const ForwardShape shape = forward_shape(*layout);
    logits_.resize(static_cast<size_t>(shape.sample_rows) * static_cast<size_t>(c.vocab_size));
    if (auto st = model_->step(*kv_, shape, logits_.data()); !st) return tl::unexpected(st.error());
    std::vector<SampledToken> out;
    int32_t r = 0;
    for (const ScheduledChunk& ch : plan.chunks) {
      if (!ch.samples) continue;
      const SampleSpec& spec = specs[r];
      auto tok = sample(logits_.data() + static_cast<int64_t>(r) * c.vocab_size, c.vocab_size, *spec.params,
                        *spec.rng);
      if (!tok) return fail_in(fmt::format("request {}: sampling step {}", ch.id, spec.index), tok.error());
      out.push_back(std::move(*tok));
      ++r;
    }
    return out;
  }

  void drop(uint64_t) override {}  // the KV blocks belong to the scheduler's pool

 private:
  Qwen3Model* model_;
  std::unique_ptr<KvPool> kv_;  // this runner's own, so engines may share a model
  int32_t max_blocks_ = 0;
  std::vector<float> logits_;
};

}  // namespace

std::unique_ptr<ModelRunner> make_cpu_runner(Qwen3Model& model) { return std::make_unique<CpuRunner>(model); }

}  // namespace mxq
