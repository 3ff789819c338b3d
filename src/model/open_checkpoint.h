// Opening a model checkpoint directory the way loading does: safetensors validation, config.json, scheme
// detection, the architecture's tensor set, and (optionally) every tensor's bytes checked against the scheme's
// policy. `mxq inspect`, `mxq quantize` and the model loader all start here.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/progress.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/scheme.h"
#include "model/qwen3_weights.h"

namespace mxq {

struct ModelCheckpoint {
  std::string dir;
  Checkpoint files;
  nlohmann::json config_json;  // config.json as read (writers extend it)
  ModelConfig config;
  Scheme scheme;
  std::vector<WeightSpec> specs;  // the architecture's tensors, as matched
};

// The plain format of a checkpoint dtype (BF16, F16, F32); any other is refused, naming the tensor.
Result<Format> plain_format(Dtype d, std::string_view name);

// Copies one tensor's bytes out of the checkpoint through the guarded read path (L-19).
Result<std::vector<uint8_t>> read_tensor(const Checkpoint& ckpt, std::string_view name);

// The file name (not the path) of the shard that holds `name`.
std::string shard_of(const Checkpoint& ckpt, std::string_view name);

// `check_bytes` reads every tensor once through the guarded path and applies the scheme's byte policy.
Result<ModelCheckpoint> open_model_checkpoint(const std::string& dir, bool check_bytes,
                                              const ProgressFn& progress = {});

}  // namespace mxq
