// The KV cache of one sequence: per layer, K and V buffers of a fixed capacity in backend memory.
// note: allocated once per request at prompt + max_new_tokens positions, so the buffers never move while
// a sequence runs (a CUDA graph may hold their addresses).
#pragma once

#include <cstdint>
#include <vector>

#include "base/error.h"
#include "io/config.h"
#include "model/backend.h"
#include "model/qwen3.h"

namespace mxq {

class KvCache {
 public:
  // Refuses a capacity outside [1, max_position_embeddings] (the context the model was built for).
  static Result<KvCache> create(Backend& backend, const ModelConfig& config, int64_t capacity);

  SequenceKv& sequence() { return view_; }
  int64_t length() const { return view_.length; }
  int64_t capacity() const { return view_.capacity; }
  void clear() { view_.length = 0; }
  int64_t bytes() const;

 private:
  std::vector<BackendBuffer<float>> buffers_;
  SequenceKv view_;
  int64_t floats_per_layer_ = 0;
};

}  // namespace mxq
