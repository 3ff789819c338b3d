// The per-sequence (CPU) runner's mirror of the block pool. That runner computes into one contiguous KvCache
// per sequence, which is what Qwen3Model::forward reads; this store keeps a copy of every computed position
// in the pool block the scheduler gave it, so K/V reach another sequence that shares the block (prefix
// cache, n samples of one prompt) or the same sequence readmitted after preemption.
// note: per block one backend buffer [layer][K, V][block_size][kv_heads * head_dim] f32, allocated when the
// block is first written, so memory follows the blocks in use, not the pool size.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/error.h"
#include "io/config.h"
#include "model/backend.h"
#include "model/qwen3.h"

namespace mxq {

class CpuBlockStore {
 public:
  // `backend` must outlive the store.
  CpuBlockStore(Backend& backend, const ModelConfig& config, int32_t num_blocks, int32_t block_size);

  // Copies positions [begin, end) of `kv` into the blocks of `table` (block table: position p lives in
  // table[p / block_size]).
  void write(const SequenceKv& kv, std::span<const int32_t> table, int64_t begin, int64_t end);
  // Copies positions [kv.length, end) from the blocks of `table` into `kv` and advances kv.length. Refuses a
  // block never written, or a table or cache too short.
  Status read(std::span<const int32_t> table, int64_t end, SequenceKv& kv) const;
  // Copies slots [0, slots) of block `src` into block `dst`, K and V of every layer (a copy-on-write of a
  // prompt's partial block, StepPlan::copies). Refuses a source never written, ids outside the pool, slots
  // outside [0, block_size].
  Status copy(int32_t src, int32_t dst, int64_t slots);

  int32_t block_size() const { return block_size_; }
  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int64_t bytes() const;  // memory of the blocks allocated so far

 private:
  // K (kv = 0) or V (kv = 1) of `layer` at slot `slot` of block buffer `base`.
  float* at(float* base, int64_t layer, int kv, int64_t slot) const {
    return base + ((layer * 2 + kv) * block_size_ + slot) * row_;
  }
  // Block `b`'s buffer, allocated (zero-filled) on first use.
  float* writable(size_t b);

  Backend* backend_;
  int64_t layers_, row_;  // row_: floats of one position of one layer (kv_heads * head_dim)
  int32_t block_size_;
  std::vector<BackendBuffer<float>> blocks_;
  int64_t allocated_ = 0;
};

}  // namespace mxq
