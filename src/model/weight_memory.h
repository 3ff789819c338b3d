// Where a WeightStore keeps its live bytes, and the few operations that touch them. The store decides what to
// write (checks, names, checksum bookkeeping); a WeightMemory only moves bytes through a Layout and hashes
// them. Host memory (this file's host_weight_memory) is the reference; model/weight_memory_cuda.h
// keeps the live buffers in CUDA device memory and runs the same operations as kernels (libmxq does not link
// CUDA, so the seam is this interface, chosen when the store is created).
//
// Memory spaces. `native` spans are always this memory's live buffers. Scratch spans come from
// allocate_scratch. Other spans (canonical planes, sparse indices / bytes / undo) may be host memory or this
// memory's: the host memory only takes host spans; the CUDA memory takes device, pinned or pageable host
// spans (pageable ones are staged through the device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "layout/layout.h"
#include "layout/plane_jobs.h"

namespace mxq {

class WeightMemory {
 public:
  WeightMemory() = default;
  WeightMemory(const WeightMemory&) = delete;
  WeightMemory& operator=(const WeightMemory&) = delete;
  virtual ~WeightMemory() = default;
  virtual std::string_view name() const = 0;  // "host" or "cuda"
  virtual bool on_device() const = 0;

  // A live plane buffer of layout.native_bytes, zeroed, that never moves until free_plane. The layout is
  // captured here (the CUDA memory uploads its tables); later calls pass the same layout and buffer.
  virtual Result<std::span<uint8_t>> allocate_plane(const PlaneLayout& layout) = 0;
  virtual void free_plane(std::span<uint8_t> native) = 0;
  // Scratch in this memory's space (undo logs, uploaded deltas); refused by name when it cannot be had.
  virtual Result<std::span<uint8_t>> allocate_scratch(size_t bytes) = 0;
  virtual void free_scratch(std::span<uint8_t> scratch) = 0;
  // Host bytes -> this memory (dst from allocate_scratch or a live plane is never passed here).
  virtual Status upload(std::span<const uint8_t> host, std::span<uint8_t> dst) = 0;

  // Full canonical plane -> native through the layout, padding written zero (layout/layout.h to_native).
  virtual Status write_plane(const PlaneLayout& l, std::span<const uint8_t> canonical,
                             std::span<uint8_t> native) = 0;
  // Native -> full canonical plane (to_canonical).
  virtual Status read_plane(const PlaneLayout& l, std::span<const uint8_t> native,
                            std::span<uint8_t> canonical) = 0;
  // Entry indices[j] (entry_bytes canonical bytes from indices[j]·entry_bytes) <- bytes[j·entry_bytes..],
  // saving the overwritten bytes into `undo` first when it is not empty. The caller has checked sizes.
  // Indices (inside the plane, strictly increasing) are checked before the first write: by the store for the
  // host memory, by the CUDA memory on the device (indices may live there). `what` names the tensor and plane
  // in errors. The CUDA memory runs this asynchronously when every span is device memory: a refusal then
  // comes back from the next sync().
  virtual Status scatter(const PlaneLayout& l, std::span<const int64_t> indices, int entry_bytes,
                         std::span<const uint8_t> bytes, std::span<uint8_t> undo, std::span<uint8_t> native,
                         std::string_view what) = 0;
  // scatter() with int32 indices (the applier's compact upload when every plane has < 2^31 entries); the
  // default widens them to int64 and calls scatter().
  virtual Status scatter32(const PlaneLayout& l, std::span<const int32_t> indices, int entry_bytes,
                           std::span<const uint8_t> bytes, std::span<uint8_t> undo, std::span<uint8_t> native,
                           std::string_view what);
  // A host buffer for uploads, valid until the next call (the CUDA memory keeps it pinned, so an upload
  // from it runs at the copy engine's rate); nullptr-spanned when it cannot be had.
  virtual std::span<uint8_t> host_staging(size_t bytes);
  // Refit's device path, step 1: decodes every job's index set into int32 entry positions (`positions`:
  // this memory's scratch, 4 bytes per entry of all jobs, jobs in order) and checks them (inside the plane,
  // strictly increasing, as many as `count`, the encoding well formed) and every new entry against its
  // policy, writing no live byte. Returns the first refused job (in job order) or nullopt. CPU twin:
  // refit::decode_indices + check_tensor_delta. The default (host memory) refuses: the host path decodes on
  // the host.
  virtual Result<std::optional<SparseRefusal>> decode_sparse(std::span<const SparsePlaneJob> jobs,
                                                             std::span<uint8_t> positions);
  // Step 2, after a decode that refused nothing: every job's entries written through its layout, the old
  // bytes saved to its undo first (and kept checksum sums updated), all jobs in one pass. Asynchronous.
  virtual Status scatter_sparse(std::span<const SparsePlaneJob> jobs, std::span<const uint8_t> positions);
  // Every job's entries against its policy, writing nothing: the first refused (job, entry) in job order, or
  // nullopt. The default reads the bytes on the host (the CUDA memory checks device spans on the device).
  virtual Result<std::optional<SparseRefusal>> check_planes(std::span<const PlaneCheckJob> jobs);
  // Whether `bytes` lies in page-locked host memory this memory can upload from without staging.
  virtual bool host_pinned(std::span<const uint8_t> bytes) const;
  // Every job's checksum, in one batch (the CUDA memory hashes all tensors at once).
  virtual Status checksums(std::span<const ChecksumJob> jobs) = 0;
  // Full writes of several tensors (write_plane of both planes) and each one's checksum. The default writes
  // plane by plane, then hashes the live bytes (checksums). The CUDA memory writes every tensor in one pass
  // and hashes the bytes it writes on the way (weight_memory_cuda.h says why, and how to re-read instead).
  virtual Status write_tensors(std::span<const TensorWriteJob> jobs);
  // Waits for queued work; reports a refusal or device error raised since the last sync.
  virtual Status sync() = 0;

 private:
  std::vector<uint8_t> host_staging_;  // the default host_staging
};

// Live bytes in host memory (aligned_alloc), the layout functions of layout/layout.h, libxxhash.
std::unique_ptr<WeightMemory> host_weight_memory();

}  // namespace mxq
