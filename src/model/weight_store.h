// The weight store: HF tensor name -> live QTensor. Buffers are allocated once and never move (CUDA graphs
// and refit hold their addresses). apply_tensor() is the only function that writes weight bytes: the
// checkpoint loader, online quantization, full updates and sparse deltas all go through it (apply_tensors
// is its batched form, apply_sparse and scatter_sparse refit's sparse forms).
// The live bytes sit in the store's WeightMemory, chosen at construction: host memory by default, CUDA
// device memory with cuda::cuda_weight_memory() (model/weight_memory_cuda.h). For a device store the
// QTensor spans hold device addresses, and the span arguments of the write / read functions may be device
// or host memory (weight_memory.h); checksums are computed on the device.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "format/formats.h"
#include "layout/layout.h"
#include "model/weight_memory.h"

namespace mxq {

struct QTensor {
  std::string name;            // HF name of the logical weight ("model.layers.0.mlp.up_proj.weight")
  Format format;               // plain (BF16/F16/F32) or quantized (MXFP8/MXFP4/FP8-B128)
  std::vector<int64_t> shape;  // logical shape; quantized weights are [.., N, K]
  std::span<uint8_t> values;   // live native bytes (layout.values.native_bytes)
  std::span<uint8_t> scales;   // empty for plain formats
  uint64_t checksum = 0;       // XXH3-64 of the canonical values plane then the scales plane
  // Canonical -> native byte permutation of each plane; identity on the CPU backend.
  // note: an identity plane's canonical geometry is one row of all its bytes (any rank, no K needed).
  Layout layout;
};

// Canonical plane sizes of a tensor: values then scales (a leading batch of stacked experts multiplies both).
struct PlaneBytes {
  int64_t values = 0, scales = 0;
};
Result<PlaneBytes> plane_bytes(Format format, const std::vector<int64_t>& shape, std::string_view name);

// XXH3-64 over the canonical values bytes followed by the canonical scales bytes.
uint64_t canonical_checksum(std::span<const uint8_t> values, std::span<const uint8_t> scales);

// One full update of a tensor for apply_tensors.
struct TensorWrite {
  std::string_view name;
  std::span<const uint8_t> values, scales;  // canonical planes
};

class WeightStore {
 public:
  WeightStore();  // host memory
  explicit WeightStore(std::unique_ptr<WeightMemory> memory);
  WeightStore(WeightStore&& o) noexcept;
  WeightStore& operator=(WeightStore&& o) noexcept;
  ~WeightStore();

  // Reserves the tensor's buffers (zeroed). Adding a name twice is an error.
  Status add(std::string name, Format format, std::vector<int64_t> shape);
  // As add(), with live buffers in `layout` (native sizes, padding included); the layout's canonical planes
  // must be the tensor's canonical planes.
  Status add(std::string name, Format format, std::vector<int64_t> shape, Layout layout);
  // Writes full canonical planes through the tensor's layout; sizes must match exactly (W-08: no implicit
  // cast or reshape). Refreshes the checksum.
  Status apply_tensor(std::string_view name, std::span<const uint8_t> values,
                      std::span<const uint8_t> scales);
  // apply_tensor for several tensors: every name and size is checked before the first write, then all are
  // written and their checksums refreshed in one batch (one device pass for a CUDA store).
  Status apply_tensors(std::span<const TensorWrite> writes);
  // Refit's sparse path: writes entry indices[j] (`entry_bytes` canonical bytes from indices[j]·entry_bytes)
  // of one plane from bytes[j·entry_bytes..], through the layout. When `undo` is not empty (same size as
  // `bytes`) the overwritten bytes are copied there first. Indices must be strictly increasing and inside the
  // plane; everything is checked before the first write. The checksum is NOT refreshed (a tensor takes
  // several sparse writes): call refresh_checksum() after the last one. On a device store the index checks
  // run on the device and, when every span is device memory, the call is asynchronous: a refusal comes back
  // from the next refresh_checksum(s) / sync().
  Status apply_sparse(std::string_view name, Plane plane, std::span<const int64_t> indices, int entry_bytes,
                      std::span<const uint8_t> bytes, std::span<uint8_t> undo = {});
  // The same with int32 indices (a compact upload; the plane must have fewer than 2^31 entries).
  Status apply_sparse(std::string_view name, Plane plane, std::span<const int32_t> indices, int entry_bytes,
                      std::span<const uint8_t> bytes, std::span<uint8_t> undo = {});
  // Refit's device path, after WeightMemory::decode_sparse refused nothing: writes every job's decoded
  // entries through its layout, the old bytes to its undo first (WeightMemory::scatter_sparse). Each job's
  // native span must lie inside one of this store's live planes. Checksums are NOT refreshed (as
  // apply_sparse).
  Status scatter_sparse(std::span<const SparsePlaneJob> jobs, std::span<const uint8_t> positions);
  // Recomputes the tensor's checksum from its live bytes (gathered through the layout) and returns it.
  Result<uint64_t> refresh_checksum(std::string_view name);
  // refresh_checksum for several tensors in one batch.
  Status refresh_checksums(std::span<const std::string_view> names);
  // Waits for the store's queued device work and reports any refusal it raised (nothing to do on the host).
  Status sync();
  WeightMemory& memory() const { return *memory_; }
  bool on_device() const { return memory_->on_device(); }
  // Copies one canonical plane of the tensor out of its live bytes (through the layout).
  Status read_canonical(std::string_view name, Plane plane, std::span<uint8_t> out) const;

  const QTensor* find(std::string_view name) const;
  const QTensor& at(std::string_view name) const;  // the name must exist (programmer error otherwise)
  const std::map<std::string, QTensor, std::less<>>& tensors() const { return tensors_; }
  int64_t total_bytes() const { return total_bytes_; }

  // Set when an update failed and its undo could not complete: the live bytes are in neither version, and
  // nothing may serve from the store until a full load or a successful anchor update of every tensor.
  void mark_inconsistent(std::string reason) { inconsistent_ = std::move(reason); }
  void clear_inconsistent() { inconsistent_.clear(); }
  Status servable() const;

 private:
  void release();
  template <class I>
  Status apply_sparse_any(std::string_view name, Plane plane, std::span<const I> indices, int entry_bytes,
                          std::span<const uint8_t> bytes, std::span<uint8_t> undo);
  std::unique_ptr<WeightMemory> memory_;
  std::map<std::string, QTensor, std::less<>> tensors_;
  std::vector<std::span<uint8_t>> buffers_;  // every live plane, freed through memory_
  int64_t total_bytes_ = 0;
  std::string inconsistent_;
};

}  // namespace mxq
