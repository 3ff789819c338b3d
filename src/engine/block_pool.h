// The KV block pool of the paged cache: a fixed number of blocks of `block_size` token slots, allocated once
// at engine start (sized by --gpu-memory-utilization) and handed to sequences block by block. Only block ids
// move; the cache memory itself never does (a CUDA graph holds its address).
// It is also the prefix cache (vLLM's automatic prefix caching): blocks are reference counted, so sequences
// with a common prefix share its blocks; a full block can carry the chained hash of its tokens; a released
// block keeps its hash and waits in an LRU list until a lookup takes it back or a fresh allocation evicts it.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace mxq {

class BlockPool {
 public:
  BlockPool(int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const { return static_cast<int32_t>(refs_.size()); }
  int32_t block_size() const { return block_size_; }
  // Blocks that allocate() can hand out: every unreferenced block, the cached (evictable) ones included, as
  // vLLM counts them. note: admission therefore never waits for the cache to drain; a cached block costs
  // only its reuse chance when evicted.
  int32_t free_blocks() const { return static_cast<int32_t>(free_.size()) + cached_blocks_; }
  // Unreferenced blocks that still carry a hash (a subset of free_blocks()).
  int32_t cached_blocks() const { return cached_blocks_; }
  // Blocks needed to hold `tokens` token slots.
  int32_t blocks_for(int64_t tokens) const;

  // Appends `count` block ids (each with reference count 1 and no hash) to `out`, or appends nothing and
  // returns false when fewer are free. Plain free blocks go first; then cached ones are evicted, oldest
  // first.
  bool allocate(int32_t count, std::vector<int32_t>& out);
  // Drops one reference of each block; at zero a hashed block becomes cached (evictable), others plain free.
  // Released last to first, so a sequence's tail (its least shared blocks) is evicted before its head.
  // A block that is not referenced is a programmer error (asserted).
  void release(std::span<const int32_t> blocks);

  // --- prefix cache ---
  // The chained hash of a full block: XXH3-64 of its token ids, seeded with the hash of the block before it
  // (kRootHash for the first block), so equal hashes mean equal whole prefixes.
  // note: a 64-bit collision (two prefixes, one hash) would serve wrong K/V; at 10^6 cached blocks its
  // chance is ~3e-8, which vLLM accepts for its builtin hash too.
  static constexpr uint64_t kRootHash = 0;
  static uint64_t hash_block(uint64_t parent, std::span<const int32_t> tokens);

  // The block holding `hash` (referenced or cached), or -1.
  int32_t lookup(uint64_t hash) const;
  // Adds a reference to a block that lookup() returned; a cached block leaves the LRU list (no longer free).
  void share(int32_t block);
  // Records that referenced block `block`, now full of computed K/V, holds the tokens `hash` names. Returns
  // false and records nothing when the block has a hash already or another block holds this one (two
  // sequences computed the same prefix side by side: the first stays the cached copy).
  bool register_hash(int32_t block, uint64_t hash);
  // Forgets every hash (after a weight update no cached K/V may be reused): cached blocks become plain free
  // blocks, referenced ones stay with their sequences unhashed. Advances epoch().
  void reset_prefix_cache();
  // Counts reset_prefix_cache() calls: a sequence admitted before a reset must not register its later
  // blocks, whose K/V depend on K/V of the old weights.
  uint64_t epoch() const { return epoch_; }

  int32_t ref_count(int32_t block) const { return refs_[static_cast<size_t>(block)]; }
  bool has_hash(int32_t block) const { return hashed_[static_cast<size_t>(block)] != 0; }
  int64_t evictions() const { return evictions_; }

 private:
  void lru_push_back(int32_t b);
  void lru_remove(int32_t b);
  void forget_hash(int32_t b);

  int32_t block_size_;
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;  // unhashed free blocks. note: a stack, so a just-freed block is reused first
  // The LRU list of cached blocks, intrusive: prev/next per block, index num_blocks is the sentinel;
  // the head (sentinel's next) is the oldest.
  std::vector<int32_t> prev_, next_;
  int32_t cached_blocks_ = 0;
  std::vector<uint64_t> hash_;
  std::vector<uint8_t> hashed_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  uint64_t epoch_ = 0;
  int64_t evictions_ = 0;
};

}  // namespace mxq
