// Trainer side, whole model: the delta between two unquantized checkpoints of one Qwen3 model (old and new
// master weights), with the linear projections quantized by the engine's rule (same bytes as a load with
// `--quantization`) and everything else carried in its checkpoint dtype.
// Both checkpoints are opened as loading opens them (open_model_checkpoint) and quantized by quantize_tensor.
#pragma once

#include <cstdint>
#include <string>

#include "base/error.h"
#include "base/progress.h"
#include "format/formats.h"
#include "refit/delta_format.h"

namespace mxq::refit {

struct CheckpointDeltaOptions {
  Format quantization = Format::kMXFP8;  // mxfp8, mxfp4 or fp8-b128; default scale rule of each
  uint64_t base_version = 0;
  uint64_t new_version = 1;
  bool force_anchor = false;  // every tensor in full
  int threads = 1;            // quantize_tensor threads
};

// Refuses, by name: a quantized checkpoint, tensors the model does not use or
// misses (L-21), a target whose tensor names, dtypes or shapes differ from the base, NaN/Inf in a block.
Result<Delta> make_checkpoint_delta(const std::string& base_dir, const std::string& target_dir,
                                    const CheckpointDeltaOptions& options, const ProgressFn& progress = {});

}  // namespace mxq::refit
