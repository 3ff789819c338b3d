// The KV block pool of the paged cache: a fixed number of blocks of `block_size` token slots, allocated once
// at engine start (sized by --gpu-memory-utilization) and handed to sequences block by block. Only block ids
// move; the cache memory itself never does (a CUDA graph holds its address).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mxq {

class BlockPool {
 public:
  BlockPool(int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const { return static_cast<int32_t>(used_.size()); }
  int32_t block_size() const { return block_size_; }
  int32_t free_blocks() const { return static_cast<int32_t>(free_.size()); }
  // Blocks needed to hold `tokens` token slots.
  int32_t blocks_for(int64_t tokens) const;

  // Appends `count` free block ids to `out`, or appends nothing and returns false when fewer are free.
  bool allocate(int32_t count, std::vector<int32_t>& out);
  // Returns blocks to the pool. A block that is not allocated is a programmer error (asserted).
  void release(std::span<const int32_t> blocks);

 private:
  int32_t block_size_;
  std::vector<int32_t> free_;  // note: a stack, so a just-freed (still cached in L2) block is reused first
  std::vector<uint8_t> used_;
};

}  // namespace mxq
