// The CUDA implementation of the step seam (model/backend.h, docs/one-forward.md commit 6): the launches of
// the CUDA engine's forward (model/qwen3_cuda.cpp) behind the ops the one forward (model/qwen3.cpp) calls,
// over weights in a CUDA WeightStore (cuda_load_target's layouts). bf16 activations, the residual stream,
// logits and router logits f32; a paged bf16 KV pool; the step metadata uploaded in one copy per step.
// Beside Qwen3Cuda until the one runner moves onto it (commit 8): eager steps only (no graph capture yet),
// the MoE chain as Qwen3Cuda runs it (grouped launches on decode steps, the host loop on others).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "base/error.h"
#include "format/formats.h"
#include "model/backend.h"

namespace mxq::cuda {

struct CudaBackendOptions {
  // kMXFP8: the W8A8 mode (cuda/linear/linear.h) for every MXFP8 / MXFP4 projection; kBF16: weight-only.
  Format act_quant = Format::kBF16;
};

// A backend on the current device with its own stream. Refuses an act_quant other than bf16 or mxfp8 and a
// device the linear table has no arch for.
Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options = {});

}  // namespace mxq::cuda
