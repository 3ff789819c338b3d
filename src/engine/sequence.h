// One sequence fed by its caller, chunk by chunk (teacher forcing: the golden tests, the refit checks, the
// CPU half of `mxq-bench decode`): its own KV pool on the model's backend, each append one step of
// Qwen3Model::step through the engine's step builder, so it runs the same forward as every engine step.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/error.h"
#include "engine/scheduler.h"
#include "model/backend.h"
#include "model/qwen3.h"

namespace mxq {

class Sequence {
 public:
  // A sequence of at most `capacity` positions (refused outside [1, max_position_embeddings]), in blocks of
  // `block_size`. `model` must outlive it.
  static Result<Sequence> create(Qwen3Model& model, int64_t capacity, int32_t block_size = 16);

  // Runs `ids` (the next tokens, at positions length() ..) through the model and writes the logits of the
  // last one to last_logits [vocab_size]. Refuses an empty chunk, an id outside the vocabulary, or more
  // tokens than the capacity has room for (naming it).
  Status append(std::span<const int32_t> ids, float* last_logits);

  // K and V of positions [0, length()) of one layer, f32 [length(), kv_heads * head_dim] each.
  Status read_kv(int64_t layer, std::vector<float>& k, std::vector<float>& v) const;

  int64_t length() const { return static_cast<int64_t>(state_.tokens.size()); }
  int64_t capacity() const { return capacity_; }

 private:
  Sequence() = default;

  Qwen3Model* model_ = nullptr;
  std::unique_ptr<KvPool> kv_;
  SequenceState state_;  // tokens so far and the block table 0, 1, ... (the pool is this sequence's alone)
  int64_t capacity_ = 0;
  int32_t block_size_ = 0;
};

}  // namespace mxq
