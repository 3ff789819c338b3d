#include "engine/block_pool.h"

#include <cassert>

namespace mxq {

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size)
    : block_size_(block_size), used_(static_cast<size_t>(num_blocks), 0) {
  assert(num_blocks >= 0 && block_size > 0);
  free_.reserve(static_cast<size_t>(num_blocks));
  // note: pushed in reverse so that a fresh pool hands out blocks 0, 1, 2, ... in order.
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockPool::blocks_for(int64_t tokens) const {
  return static_cast<int32_t>((tokens + block_size_ - 1) / block_size_);
}

bool BlockPool::allocate(int32_t count, std::vector<int32_t>& out) {
  assert(count >= 0);
  if (count > free_blocks()) return false;
  for (int32_t i = 0; i < count; ++i) {
    const int32_t b = free_.back();
    free_.pop_back();
    used_[static_cast<size_t>(b)] = 1;
    out.push_back(b);
  }
  return true;
}

void BlockPool::release(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    assert(b >= 0 && b < num_blocks() && used_[static_cast<size_t>(b)]);
    used_[static_cast<size_t>(b)] = 0;
    free_.push_back(b);
  }
}

}  // namespace mxq
