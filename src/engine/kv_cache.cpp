#include "engine/kv_cache.h"

namespace mxq {

Result<KvCache> KvCache::create(Backend& backend, const ModelConfig& c, int64_t capacity) {
  if (capacity < 1 || capacity > c.max_position_embeddings)
    return fail("KV cache: {} positions requested, the context is max_position_embeddings = {}", capacity,
                c.max_position_embeddings);
  KvCache kv;
  kv.floats_per_layer_ = capacity * c.num_key_value_heads * c.head_dim;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    kv.buffers_.push_back(backend.alloc_f32(kv.floats_per_layer_));
    kv.view_.k.push_back(kv.buffers_.back().get());
    kv.buffers_.push_back(backend.alloc_f32(kv.floats_per_layer_));
    kv.view_.v.push_back(kv.buffers_.back().get());
  }
  kv.view_.capacity = capacity;
  return kv;
}

int64_t KvCache::bytes() const {
  return static_cast<int64_t>(buffers_.size()) * floats_per_layer_ * static_cast<int64_t>(sizeof(float));
}

}  // namespace mxq
