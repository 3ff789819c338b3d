#include "engine/sequence.h"

#include <numeric>

#include "engine/step_builder.h"

namespace mxq {

Result<Sequence> Sequence::create(Qwen3Model& model, int64_t capacity, int32_t block_size) {
  const ModelConfig& c = model.config();
  if (capacity < 1 || capacity > c.max_position_embeddings)
    return fail("sequence capacity {}: expected 1..{} (max_position_embeddings)", capacity,
                c.max_position_embeddings);
  if (block_size < 1) return fail("sequence block_size {}: expected >= 1", block_size);
  Sequence s;
  s.model_ = &model;
  s.capacity_ = capacity;
  s.block_size_ = block_size;
  const int64_t blocks = (capacity + block_size - 1) / block_size;
  auto kv = model.backend().create_kv({.layers = c.num_hidden_layers,
                                       .kv_heads = c.num_key_value_heads,
                                       .head_dim = c.head_dim,
                                       .num_blocks = blocks,
                                       .block_size = block_size,
                                       .max_blocks = blocks,
                                       .max_tokens = capacity,
                                       .max_seqs = 1});
  if (!kv) return tl::unexpected(kv.error());
  s.kv_ = std::move(*kv);
  s.state_.blocks.resize(static_cast<size_t>(blocks));
  std::iota(s.state_.blocks.begin(), s.state_.blocks.end(), 0);
  return s;
}

Status Sequence::append(std::span<const int32_t> ids, float* last_logits) {
  const int64_t n = static_cast<int64_t>(ids.size()), start = length();
  if (n == 0) return fail("sequence: no tokens to run");
  if (start + n > capacity_)
    return fail("sequence: {} cached + {} new tokens exceed its capacity of {} positions", start, n,
                capacity_);
  state_.tokens.insert(state_.tokens.end(), ids.begin(), ids.end());
  StepPlan plan;
  plan.chunks.push_back({.id = 0, .start = start, .count = n, .samples = true});
  plan.tokens = n;
  // note: the sampling parameters only fill the metadata; the caller samples (or not) from the logits
  static const SamplingParams unused{};
  std::mt19937_64 rng;
  const SampleSpec spec{.params = &unused, .rng = &rng, .seed = 0, .index = 0};
  const int32_t blocks = static_cast<int32_t>(state_.blocks.size());
  auto layout = build_step(
      plan, [&](uint64_t) { return &state_; }, std::span(&spec, 1), 1, blocks, block_size_, kv_->host_meta());
  if (!layout) {
    state_.tokens.resize(static_cast<size_t>(start));
    return tl::unexpected(layout.error());
  }
  if (auto st = model_->step(*kv_, forward_shape(*layout), last_logits); !st) {
    // note: positions past `start` may hold this chunk's K/V now; they are rewritten before any read
    state_.tokens.resize(static_cast<size_t>(start));
    return st;
  }
  return {};
}

Status Sequence::read_kv(int64_t layer, std::vector<float>& k, std::vector<float>& v) const {
  const ModelConfig& c = model_->config();
  const int64_t row = c.num_key_value_heads * c.head_dim;
  std::vector<int32_t> slots(static_cast<size_t>(length()));
  std::iota(slots.begin(), slots.end(), 0);  // blocks 0, 1, ... in order: slot p is position p
  k.resize(slots.size() * static_cast<size_t>(row));
  v.resize(k.size());
  return kv_->read_slots(layer, slots, k.data(), v.data());
}

}  // namespace mxq
