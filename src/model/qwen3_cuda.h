// Qwen3ForCausalLM and Qwen3MoeForCausalLM on the GPU: the same model as model/qwen3.h, batched over the
// tokens of one engine step and paged (vLLM layout, docs/cuda-ops.md), reading its weights in place from a
// CUDA WeightStore (model/weight_memory_cuda.h) in each kernel's native layout.
//
// Memory: everything is allocated once in create(), at capacity, and never moves, so a CUDA graph captured
// over forward() stays valid across steps and refits (refit writes the weight buffers in place):
//   activations (bf16 between ops, f32 residual stream), the paged bf16 KV pool, the step metadata (one
//   device block uploaded from a pinned host twin in one copy per step), the sampling outputs (one device
//   block copied back in one copy per step).
// forward() only enqueues work on stream(); it reads every per-step size it can from the device metadata.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "io/config.h"
#include "model/load_model.h"
#include "model/step.h"
#include "model/step_profile.h"
#include "model/weight_store.h"

namespace mxq::cuda {

class LinearContext;
class MoeGroupedWeights;
class StepProfiler;

// The load target of the CUDA engine: the store in device memory, MXFP8 / MXFP4 / FP8-B128 projections in
// the native layout of the linear dispatch table (cuda/linear/linear.h linear_prepare, probed so refit writes
// through it; one layout per format serves every M), everything else row-major. Refuses by name what the
// engine cannot run: formats with no table entry on the device's arch, F16/F32 tensors (the ops read BF16),
// attention biases, head_dim other than 64 or 128.
LoadTarget cuda_load_target();

struct Qwen3CudaOptions {
  int32_t max_num_seqs = 256;             // sequences in one step
  int64_t max_num_batched_tokens = 8192;  // tokens in one step
  int64_t max_model_len = 0;              // 0: max_position_embeddings
  int32_t block_size = 16;
  double gpu_memory_utilization = 0.9;  // fraction of device memory for weights + buffers + KV blocks
  int64_t num_blocks = 0;               // > 0: this many KV blocks (tests), else from the utilization
  // kMXFP8: the W8A8 mode (cuda/linear/linear.h) for every MXFP8 / MXFP4 projection, experts included:
  // activations quantized to MXFP8 per 1x32 block and dequantized before the weight-only kernels. kBF16:
  // weight-only.
  Format act_quant = Format::kBF16;
};

class Qwen3Cuda {
 public:
  // Resolves every tensor (which must live in a CUDA store in cuda_load_target()'s layouts, and outlive the
  // model), allocates every buffer at capacity and the KV pool (options.num_blocks, or what
  // gpu_memory_utilization leaves). Refuses by name unsupported configs and a utilization too small for
  // even one sequence.
  static Result<std::unique_ptr<Qwen3Cuda>> create(const ModelConfig& config, const WeightStore& store,
                                                   const Qwen3CudaOptions& options);
  ~Qwen3Cuda();
  Qwen3Cuda(const Qwen3Cuda&) = delete;
  Qwen3Cuda& operator=(const Qwen3Cuda&) = delete;

  // Enqueues the forward of the uploaded step; logits f32 [sample_rows, vocab] in logits(). Mixed steps
  // gather their sampling rows with copies decided on the host, and their MoE layers wait for the routing on
  // the host; decode steps (MoE included) wait for nothing and are graph-capturable.
  Status forward(const ForwardShape& shape);
  // Enqueues sampling of the first *num_seqs logits rows (capacity `rows`) into the outputs block.
  Status sample(int32_t rows);

  // The per-op step profile (model/step_profile_cuda.h; null: none, the default). While one is set, forward()
  // begins a profiled step and marks each op class, sample() marks sampling; the caller ends the step with
  // profiler->finish_step(). Eager steps only (CudaRunner runs no graph while a profiler is set).
  void set_profiler(StepProfiler* p) { profiler_ = p; }
  StepProfiler* profiler() const { return profiler_; }

  StepMeta& host_meta() { return host_meta_; }
  // One host → device copy of the metadata block, block-table rows of the first `seqs` sequences included.
  Status upload_meta(int32_t seqs);
  Status download_outputs();  // one device → host copy of the outputs block (then a sync)
  const StepOutputs& host_outputs() const { return host_out_; }
  Status download_logits(int32_t row, std::span<float> out);  // one logits row (synchronous)
  // Enqueues on stream() a copy of slots [0, slots) of KV block `src` into block `dst`, K and V of every
  // layer (copy-on-write of a prompt's partial block, engine/scheduler.h BlockCopy): 2 · num_hidden_layers
  // device-to-device copies of slots · kv_heads · head_dim bf16. note: issued eagerly, never inside a
  // capture; stream order places it after the last step's KV writes and before this step's forward or
  // graph replay. Refuses block ids outside the pool and slots outside [0, block_size].
  Status copy_kv_block(int32_t src, int32_t dst, int32_t slots);

  const ModelConfig& config() const { return config_; }
  const Qwen3CudaOptions& options() const { return options_; }
  int64_t num_blocks() const { return num_blocks_; }
  int32_t max_blocks_per_seq() const { return max_blocks_; }
  bool has_moe() const;
  cudaStream_t stream() const { return stream_; }
  int64_t kv_bytes() const;

 private:
  struct Lin;
  struct Weights;
  struct Buffers;
  Qwen3Cuda() = default;
  Status mlp(size_t layer, int64_t rows);
  // decode: the grouped, graph-capturable path; otherwise the host-driven expert loop
  Status sparse_moe_block(size_t layer, int64_t rows, bool decode);
  // y [m, n] = x [m, k] · W^T through the dispatch table; errors name the tensor.
  Status run_linear(const Lin& l, const uint16_t* x, int64_t m, uint16_t* y);
  // Projections of the same x (q/k/v, gate/up; at most 3), y in the same order: cuda::linear_parts.
  Status run_linear_parts(std::initializer_list<const Lin*> ls, const uint16_t* x, int64_t m,
                          std::initializer_list<uint16_t*> ys);
  // The grouped MoE linears' input (they take no LinearContext): x [rows, k] quantize-dequantized into the
  // context's W8A8 scratch when w.act() is MXFP8, else x.
  Result<const uint16_t*> moe_input(const MoeGroupedWeights& w, const uint16_t* x, int64_t rows);
  // The end of one op of class `op` in the step profile; nothing without a profiler.
  Status mark(StepOp op, double bytes);

  ModelConfig config_;
  Qwen3CudaOptions options_;
  int64_t num_blocks_ = 0;
  int32_t max_blocks_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<LinearContext> lin_;  // cuBLAS / cuBLASLt handles and scratch of the table, one stream
  StepProfiler* profiler_ = nullptr;
  std::unique_ptr<Weights> w_;
  std::unique_ptr<Buffers> b_;
  StepMeta host_meta_{}, dev_meta_{};
  StepOutputs host_out_{}, dev_out_{};
};

}  // namespace mxq::cuda
