#include "engine/cuda_runner.h"

#include <algorithm>
#include <climits>

#include "cpu/philox.h"
#include "cpu/sampling.h"
#include "cuda/common/check.h"
#include "cuda/ops/sample.h"
#include "engine/step_builder.h"

namespace mxq::cuda {

Result<std::unique_ptr<CudaRunner>> CudaRunner::create(const ModelConfig& config, const WeightStore& store,
                                                       const CudaRunnerOptions& options) {
  auto model = Qwen3Cuda::create(config, store, options.model);
  if (!model) return tl::unexpected(model.error());
  std::unique_ptr<CudaRunner> r(new CudaRunner());
  r->model_ = std::move(*model);
  r->options_ = options;
  r->options_.model = r->model_->options();
  return r;
}

CudaRunner::~CudaRunner() {
  for (auto& [bucket, exec] : graphs_)
    if (exec) cudaGraphExecDestroy(exec);
}

EngineConfig CudaRunner::engine_config() const {
  const Qwen3CudaOptions& o = model_->options();
  EngineConfig e;
  e.scheduler = {.max_num_seqs = o.max_num_seqs,
                 .max_num_batched_tokens = o.max_num_batched_tokens,
                 .max_model_len = o.max_model_len};
  e.block_size = o.block_size;
  e.num_blocks = model_->num_blocks();
  e.enable_prefix_caching = options_.enable_prefix_caching;
  return e;
}

int CudaRunner::graphs_captured() const { return static_cast<int>(graphs_.size()); }

int32_t CudaRunner::bucket(int32_t seqs) const {
  const int32_t cap = model_->options().max_num_seqs;
  int32_t b = 1;
  while (b < seqs) b *= 2;
  return std::min(b, cap);
}

Result<std::vector<float>> CudaRunner::last_logits(int32_t row) {
  std::vector<float> out(static_cast<size_t>(model_->config().vocab_size));
  if (auto st = model_->download_logits(row, out); !st) return tl::unexpected(st.error());
  return out;
}

// A decode step at bucket size `rows`: forward + sample, from the bucket's graph (captured on first use) or
// eagerly. Both enqueue the same kernels with the same arguments.
Status CudaRunner::launch_decode(int32_t rows, bool use_graph) {
  const ForwardShape shape{rows, rows, true, rows, {}};
  if (!use_graph) {
    if (auto st = model_->forward(shape); !st) return st;
    return model_->sample(rows);
  }
  cudaStream_t stream = model_->stream();
  auto it = graphs_.find(rows);
  if (it == graphs_.end()) {
    // note: the bucket's first step also runs once eagerly before the capture, so library plans and
    // heuristics (cuBLAS, cuBLASLt FP8 per M) are made outside it; the replay then recomputes the same step
    // (same KV writes, same Philox draws), so the outputs are those of one run.
    if (auto st = model_->forward(shape); !st) return st;
    if (auto st = model_->sample(rows); !st) return st;
    MXQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    Status st = model_->forward(shape);
    if (st) st = model_->sample(rows);
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    if (!st) {
      if (graph) cudaGraphDestroy(graph);
      return fail_in(fmt::format("capturing the decode graph of bucket {}", rows), st.error());
    }
    MXQ_CUDA_CHECK(end);
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    MXQ_CUDA_CHECK(inst);
    it = graphs_.emplace(rows, exec).first;
  }
  MXQ_CUDA_CHECK(cudaGraphLaunch(it->second, stream));
  ++replays_;
  return {};
}

Result<std::vector<SampledToken>> CudaRunner::run(const StepPlan& plan, const Scheduler& scheduler,
                                                  std::span<const SampleSpec> specs) {
  Qwen3Cuda& m = *model_;
  const Qwen3CudaOptions& o = m.options();
  StepMeta& h = m.host_meta();
  const int32_t S = static_cast<int32_t>(plan.chunks.size());
  const int64_t T = plan.tokens;
  const int64_t token_cap = std::max<int64_t>(o.max_num_batched_tokens, o.max_num_seqs);
  if (S < 1 || S > o.max_num_seqs || T < 1 || T > token_cap)
    return fail("step of {} sequences / {} tokens, capacity {} / {}", S, T, o.max_num_seqs, token_cap);
  const bool decode = is_decode_plan(plan);
  const int32_t seqs = decode ? bucket(S) : S;
  auto layout = build_step(plan, scheduler, specs, seqs, m.max_blocks_per_seq(), o.block_size, h);
  if (!layout) return tl::unexpected(layout.error());
  const int64_t rows = layout->rows;
  const int32_t j = *h.num_seqs;
  std::vector<int32_t>& sample_rows = layout->sample_rows;
  if (auto st = m.upload_meta(seqs); !st) return tl::unexpected(st.error());
  // Copy-on-write of partial blocks, eagerly on the model's stream before the forward or the graph replay
  // (a graph never holds a copy: its blocks change every time).
  for (const BlockCopy& cp : plan.copies)
    if (auto st = m.copy_kv_block(cp.src, cp.dst, cp.slots); !st) return tl::unexpected(st.error());

  if (decode) {
    // note: a step profile times eager steps (its events would be baked into a graph). MoE decode steps are
    // captured too: their expert groups run from the device grouping (grouped linears), no host wait.
    const bool graphs = !options_.enforce_eager && !m.profiler();
    if (auto st = launch_decode(seqs, graphs); !st) return tl::unexpected(st.error());
  } else {
    const ForwardShape shape{rows, seqs, false, j, sample_rows};
    if (auto st = m.forward(shape); !st) return tl::unexpected(st.error());
    if (j > 0)
      if (auto st = m.sample(j); !st) return tl::unexpected(st.error());
  }
  if (auto st = m.download_outputs(); !st) return tl::unexpected(st.error());

  const StepOutputs& out = m.host_outputs();
  if (*out.bad_token != INT32_MAX)
    return fail("step token {}: a token id outside [0, {}) or a KV slot outside the pool", *out.bad_token,
                m.config().vocab_size);
  std::vector<SampledToken> tokens;
  int32_t k = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    if (!c.samples) continue;
    if (out.status[k] != kSampleOk)
      return fail("request {}: sampling step {}: {}", c.id, specs[k].index,
                  out.status[k] == kSampleBadLogit ? "the logits hold NaN or +inf" : "every token is masked");
    SampledToken tok{out.token[k], out.logprob[k], {}};
    const SamplingParams& p = *specs[k].params;
    if (p.num_logprobs > 0) {
      // note: the top alternatives come from the host twin on this row's logits (cuda/sample reports the
      // chosen token's logprob only); its token is not used.
      auto row = last_logits(k);
      if (!row) return tl::unexpected(row.error());
      auto host = mxq::sample(row->data(), m.config().vocab_size, p,
                              philox_random_bits(specs[k].seed, static_cast<uint64_t>(specs[k].index)));
      if (!host) return fail_in(fmt::format("request {}: logprobs", c.id), host.error());
      tok.top_logprobs = std::move(host->top_logprobs);
    }
    tokens.push_back(std::move(tok));
    ++k;
  }
  return tokens;
}

Result<CudaEngine> make_cuda_engine(const ModelConfig& model, const Tokenizer* tokenizer,
                                    const WeightStore& store, const CudaRunnerOptions& options) {
  auto runner = CudaRunner::create(model, store, options);
  if (!runner) return tl::unexpected(runner.error());
  CudaRunner* raw = runner->get();
  const EngineConfig cfg = raw->engine_config();
  auto engine = Engine::create(model, tokenizer, cfg, std::move(*runner));
  if (!engine) return tl::unexpected(engine.error());
  return CudaEngine{std::move(*engine), raw};
}

}  // namespace mxq::cuda
