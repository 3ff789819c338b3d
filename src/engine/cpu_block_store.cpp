#include "engine/cpu_block_store.h"

#include <algorithm>
#include <cassert>

namespace mxq {

CpuBlockStore::CpuBlockStore(Backend& backend, const ModelConfig& c, int32_t num_blocks, int32_t block_size)
    : backend_(&backend),
      layers_(c.num_hidden_layers),
      row_(c.num_key_value_heads * c.head_dim),
      block_size_(block_size),
      blocks_(static_cast<size_t>(num_blocks)) {
  assert(num_blocks >= 0 && block_size > 0);
}

float* CpuBlockStore::writable(size_t b) {
  assert(b < blocks_.size());
  if (!blocks_[b]) {
    blocks_[b] = backend_->alloc_f32(layers_ * 2 * block_size_ * row_);
    ++allocated_;
  }
  return blocks_[b].get();
}

void CpuBlockStore::write(const SequenceKv& kv, std::span<const int32_t> table, int64_t begin, int64_t end) {
  assert(begin >= 0 && end <= kv.length && end <= static_cast<int64_t>(table.size()) * block_size_);
  // One run of positions per block: [p, run_end) all sit in table[p / block_size].
  for (int64_t p = begin; p < end;) {
    const int64_t slot = p % block_size_, run = std::min(end - p, block_size_ - slot);
    const auto b = static_cast<size_t>(table[static_cast<size_t>(p / block_size_)]);
    float* base = writable(b);
    for (int64_t l = 0; l < layers_; ++l) {
      backend_->copy(kv.k[static_cast<size_t>(l)] + p * row_, run * row_, at(base, l, 0, slot));
      backend_->copy(kv.v[static_cast<size_t>(l)] + p * row_, run * row_, at(base, l, 1, slot));
    }
    p += run;
  }
}

Status CpuBlockStore::read(std::span<const int32_t> table, int64_t end, SequenceKv& kv) const {
  if (end > kv.capacity || end > static_cast<int64_t>(table.size()) * block_size_)
    return fail("KV blocks: {} positions asked, the cache holds {} and the block table {}", end, kv.capacity,
                static_cast<int64_t>(table.size()) * block_size_);
  for (int64_t p = kv.length; p < end;) {
    const int64_t slot = p % block_size_, run = std::min(end - p, block_size_ - slot);
    const int32_t b = table[static_cast<size_t>(p / block_size_)];
    if (b < 0 || b >= num_blocks() || !blocks_[static_cast<size_t>(b)])
      return fail("KV block {} (positions {}..{}) was never written", b, p, p + run - 1);
    float* base = blocks_[static_cast<size_t>(b)].get();
    for (int64_t l = 0; l < layers_; ++l) {
      backend_->copy(at(base, l, 0, slot), run * row_, kv.k[static_cast<size_t>(l)] + p * row_);
      backend_->copy(at(base, l, 1, slot), run * row_, kv.v[static_cast<size_t>(l)] + p * row_);
    }
    p += run;
  }
  kv.length = std::max(kv.length, end);
  return {};
}

Status CpuBlockStore::copy(int32_t src, int32_t dst, int64_t slots) {
  if (src < 0 || src >= num_blocks() || dst < 0 || dst >= num_blocks() || slots < 0 || slots > block_size_)
    return fail("KV block copy {} -> {} of {} slots: the pool has {} blocks of {}", src, dst, slots,
                num_blocks(), block_size_);
  if (!blocks_[static_cast<size_t>(src)])
    return fail("KV block copy {} -> {}: block {} was never written", src, dst, src);
  if (src == dst || slots == 0) return {};
  float* to = writable(static_cast<size_t>(dst));
  float* from = blocks_[static_cast<size_t>(src)].get();
  for (int64_t l = 0; l < layers_; ++l)
    for (int kv = 0; kv < 2; ++kv) backend_->copy(at(from, l, kv, 0), slots * row_, at(to, l, kv, 0));
  return {};
}

int64_t CpuBlockStore::bytes() const {
  return allocated_ * layers_ * 2 * block_size_ * row_ * static_cast<int64_t>(sizeof(float));
}

}  // namespace mxq
