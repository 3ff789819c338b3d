#include "engine/block_pool.h"

#include <algorithm>
#include <cassert>

#include "base/xxh3.h"

namespace mxq {

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size)
    : block_size_(block_size),
      refs_(static_cast<size_t>(num_blocks), 0),
      prev_(static_cast<size_t>(num_blocks) + 1, num_blocks),
      next_(static_cast<size_t>(num_blocks) + 1, num_blocks),
      hash_(static_cast<size_t>(num_blocks), 0),
      hashed_(static_cast<size_t>(num_blocks), 0) {
  assert(num_blocks >= 0 && block_size > 0);
  free_.reserve(static_cast<size_t>(num_blocks));
  // note: pushed in reverse so that a fresh pool hands out blocks 0, 1, 2, ... in order.
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockPool::blocks_for(int64_t tokens) const {
  return static_cast<int32_t>((tokens + block_size_ - 1) / block_size_);
}

void BlockPool::lru_push_back(int32_t b) {
  const int32_t end = num_blocks(), last = prev_[static_cast<size_t>(end)];
  prev_[static_cast<size_t>(b)] = last;
  next_[static_cast<size_t>(b)] = end;
  next_[static_cast<size_t>(last)] = b;
  prev_[static_cast<size_t>(end)] = b;
  ++cached_blocks_;
}

void BlockPool::lru_remove(int32_t b) {
  const int32_t p = prev_[static_cast<size_t>(b)], n = next_[static_cast<size_t>(b)];
  next_[static_cast<size_t>(p)] = n;
  prev_[static_cast<size_t>(n)] = p;
  --cached_blocks_;
}

void BlockPool::forget_hash(int32_t b) {
  by_hash_.erase(hash_[static_cast<size_t>(b)]);
  hashed_[static_cast<size_t>(b)] = 0;
}

bool BlockPool::allocate(int32_t count, std::vector<int32_t>& out) {
  assert(count >= 0);
  if (count > free_blocks()) return false;
  for (int32_t i = 0; i < count; ++i) {
    int32_t b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {
      b = next_[static_cast<size_t>(num_blocks())];  // the oldest cached block
      lru_remove(b);
      forget_hash(b);
      ++evictions_;
    }
    refs_[static_cast<size_t>(b)] = 1;
    out.push_back(b);
  }
  return true;
}

void BlockPool::release(std::span<const int32_t> blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int32_t b = *it;
    assert(b >= 0 && b < num_blocks() && refs_[static_cast<size_t>(b)] > 0);
    if (--refs_[static_cast<size_t>(b)] > 0) continue;
    if (hashed_[static_cast<size_t>(b)])
      lru_push_back(b);
    else
      free_.push_back(b);
  }
}

uint64_t BlockPool::hash_block(uint64_t parent, std::span<const int32_t> tokens) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent);
}

int32_t BlockPool::lookup(uint64_t hash) const {
  auto it = by_hash_.find(hash);
  return it == by_hash_.end() ? -1 : it->second;
}

void BlockPool::share(int32_t b) {
  assert(b >= 0 && b < num_blocks() && hashed_[static_cast<size_t>(b)]);
  if (refs_[static_cast<size_t>(b)]++ == 0) lru_remove(b);
}

bool BlockPool::register_hash(int32_t b, uint64_t hash) {
  assert(b >= 0 && b < num_blocks() && refs_[static_cast<size_t>(b)] > 0);
  if (hashed_[static_cast<size_t>(b)] || by_hash_.count(hash)) return false;
  hash_[static_cast<size_t>(b)] = hash;
  hashed_[static_cast<size_t>(b)] = 1;
  by_hash_.emplace(hash, b);
  return true;
}

void BlockPool::reset_prefix_cache() {
  const int32_t end = num_blocks();
  for (int32_t b = next_[static_cast<size_t>(end)]; b != end;) {
    const int32_t n = next_[static_cast<size_t>(b)];
    free_.push_back(b);
    b = n;
  }
  prev_[static_cast<size_t>(end)] = next_[static_cast<size_t>(end)] = end;
  cached_blocks_ = 0;
  std::fill(hashed_.begin(), hashed_.end(), 0);
  by_hash_.clear();
  ++epoch_;
}

}  // namespace mxq
