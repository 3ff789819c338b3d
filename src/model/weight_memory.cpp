#include "model/weight_memory.h"

#include <cassert>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "model/weight_store.h"

namespace mxq {
namespace {

class HostWeightMemory final : public WeightMemory {
 public:
  std::string_view name() const override { return "host"; }
  bool on_device() const override { return false; }

  Result<std::span<uint8_t>> allocate_plane(const PlaneLayout& layout) override {
    return allocate(static_cast<size_t>(layout.native_bytes));
  }
  void free_plane(std::span<uint8_t> native) override { std::free(native.data()); }
  Result<std::span<uint8_t>> allocate_scratch(size_t bytes) override { return allocate(bytes); }
  void free_scratch(std::span<uint8_t> scratch) override { std::free(scratch.data()); }
  Status upload(std::span<const uint8_t> host, std::span<uint8_t> dst) override {
    if (host.size() != dst.size()) return fail("upload of {} bytes into {}", host.size(), dst.size());
    if (!host.empty()) std::memcpy(dst.data(), host.data(), host.size());
    return {};
  }

  Status write_plane(const PlaneLayout& l, std::span<const uint8_t> canonical,
                     std::span<uint8_t> native) override {
    return to_native(l, canonical, native);
  }
  Status read_plane(const PlaneLayout& l, std::span<const uint8_t> native,
                    std::span<uint8_t> canonical) override {
    return to_canonical(l, native, canonical);
  }
  // note: the old byte is saved right before it is overwritten, in the order of `bytes`.
  Status scatter(const PlaneLayout& l, std::span<const int64_t> indices, int entry_bytes,
                 std::span<const uint8_t> bytes, std::span<uint8_t> undo, std::span<uint8_t> native,
                 std::string_view) override {
    const auto eb = static_cast<size_t>(entry_bytes);
    for (size_t j = 0; j < indices.size(); ++j) {
      const int64_t first = indices[j] * entry_bytes;
      for (size_t b = 0; b < eb; ++b) {
        uint8_t& dst = native[static_cast<size_t>(l.native_offset(first + static_cast<int64_t>(b)))];
        const size_t k = j * eb + b;
        if (!undo.empty()) undo[k] = dst;
        dst = bytes[k];
      }
    }
    return {};
  }
  // note: an identity layout's live bytes are the canonical planes: hash in place, no copy. Other layouts
  // gather both planes first (the checksum speaks canonical order, DESIGN.md).
  Status checksums(std::span<const ChecksumJob> jobs) override {
    for (const ChecksumJob& j : jobs) {
      if (j.values_layout->kind == PlaneKind::kIdentity && j.scales_layout->kind == PlaneKind::kIdentity) {
        *j.out = canonical_checksum(j.values, j.scales);
        continue;
      }
      std::vector<uint8_t> values(static_cast<size_t>(j.values_layout->canonical.bytes())),
          scales(static_cast<size_t>(j.scales_layout->canonical.bytes()));
      if (auto s = to_canonical(*j.values_layout, j.values, values); !s) return s;
      if (auto s = to_canonical(*j.scales_layout, j.scales, scales); !s) return s;
      *j.out = canonical_checksum(values, scales);
    }
    return {};
  }
  Status sync() override { return {}; }

 private:
  // note: 64-byte alignment so vector loads of a row never split a cache line at the start.
  static Result<std::span<uint8_t>> allocate(size_t bytes) {
    if (bytes == 0) return std::span<uint8_t>{};
    const size_t rounded = (bytes + 63) / 64 * 64;
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, rounded));
    if (!p) return fail("out of host memory for {} bytes", bytes);
    std::memset(p, 0, rounded);
    return std::span<uint8_t>{p, bytes};
  }
};

}  // namespace

Status WeightMemory::scatter32(const PlaneLayout& l, std::span<const int32_t> indices, int entry_bytes,
                               std::span<const uint8_t> bytes, std::span<uint8_t> undo,
                               std::span<uint8_t> native, std::string_view what) {
  const std::vector<int64_t> wide(indices.begin(), indices.end());
  return scatter(l, wide, entry_bytes, bytes, undo, native, what);
}

Result<std::optional<SparseRefusal>> WeightMemory::decode_sparse(std::span<const SparsePlaneJob>,
                                                                 std::span<uint8_t>) {
  return fail("{} memory: encoded sparse planes are decoded on the host", name());
}

Status WeightMemory::scatter_sparse(std::span<const SparsePlaneJob>, std::span<const uint8_t>) {
  return fail("{} memory: encoded sparse planes are decoded on the host", name());
}

Result<std::optional<SparseRefusal>> WeightMemory::check_planes(std::span<const PlaneCheckJob> jobs) {
  for (size_t j = 0; j < jobs.size(); ++j) {
    const PlaneCheckJob& job = jobs[j];
    if (job.policy == NewBytePolicy::kNone) continue;
    const auto n = static_cast<int64_t>(job.bytes.size() / static_cast<size_t>(job.entry_bytes));
    for (int64_t i = 0; i < n; ++i)
      if (new_entry_refused(job.policy, job.bytes.data() + i * job.entry_bytes)) return SparseRefusal{j, i};
  }
  return std::optional<SparseRefusal>();
}

bool WeightMemory::host_pinned(std::span<const uint8_t>) const { return false; }

std::span<uint8_t> WeightMemory::host_staging(size_t bytes) {
  if (host_staging_.size() < bytes) host_staging_.resize(bytes);
  return {host_staging_.data(), bytes};
}

Status WeightMemory::write_tensors(std::span<const TensorWriteJob> jobs) {
  std::vector<ChecksumJob> sums;
  for (const TensorWriteJob& j : jobs) {
    if (auto s = write_plane(*j.values_layout, j.values_src, j.values); !s) return fail_in(j.name, s.error());
    if (auto s = write_plane(*j.scales_layout, j.scales_src, j.scales); !s) return fail_in(j.name, s.error());
    sums.push_back({j.values_layout, j.values, j.scales_layout, j.scales, j.out});
  }
  return checksums(sums);
}

std::unique_ptr<WeightMemory> host_weight_memory() { return std::make_unique<HostWeightMemory>(); }

}  // namespace mxq
