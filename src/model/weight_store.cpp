#include "model/weight_store.h"

#include <algorithm>
#include <cassert>
#include <climits>

#include "base/xxh3.h"

namespace mxq {

WeightStore::WeightStore() : WeightStore(host_weight_memory()) {}

WeightStore::WeightStore(std::unique_ptr<WeightMemory> memory) : memory_(std::move(memory)) {
  assert(memory_ && "a weight store needs a memory");
}

WeightStore::WeightStore(WeightStore&& o) noexcept
    : memory_(std::move(o.memory_)),
      tensors_(std::move(o.tensors_)),
      buffers_(std::move(o.buffers_)),
      total_bytes_(o.total_bytes_),
      inconsistent_(std::move(o.inconsistent_)) {
  o.buffers_.clear();
  o.tensors_.clear();
}

WeightStore& WeightStore::operator=(WeightStore&& o) noexcept {
  if (this != &o) {
    release();
    memory_ = std::move(o.memory_);
    tensors_ = std::move(o.tensors_);
    buffers_ = std::move(o.buffers_);
    total_bytes_ = o.total_bytes_;
    inconsistent_ = std::move(o.inconsistent_);
    o.buffers_.clear();
    o.tensors_.clear();
  }
  return *this;
}

WeightStore::~WeightStore() { release(); }

void WeightStore::release() {
  for (std::span<uint8_t> b : buffers_) memory_->free_plane(b);
  buffers_.clear();
  tensors_.clear();
}

Result<PlaneBytes> plane_bytes(Format format, const std::vector<int64_t>& shape, std::string_view name) {
  int64_t n = 1;
  for (int64_t d : shape) {
    // note: each dimension is bounded too, so a zero elsewhere cannot let a huge one reach values_bytes().
    if (d < 0 || d > (int64_t{1} << 48) || (d > 0 && n > (int64_t{1} << 48) / d))
      return fail("{}: shape too large or negative", name);
    n *= d;
  }
  if (!is_quantized(format)) return PlaneBytes{n * traits(format).element_bits / 8, 0};
  if (shape.size() < 2)
    return fail("{}: a {} tensor needs rank >= 2, got {}", name, traits(format).name, shape.size());
  const int64_t rows = shape[shape.size() - 2], cols = shape.back();
  const int64_t batch = rows && cols ? n / (rows * cols) : 0;
  if (traits(format).block_rows == 1 && cols % traits(format).block_cols != 0)
    return fail("{}: K = {} is not a multiple of {} ({})", name, cols, traits(format).block_cols,
                traits(format).name);
  return PlaneBytes{batch * values_bytes(format, rows, cols), batch * scales_bytes(format, rows, cols)};
}

uint64_t canonical_checksum(std::span<const uint8_t> values, std::span<const uint8_t> scales) {
  XXH3_state_t* s = XXH3_createState();
  assert(s);
  XXH3_64bits_reset(s);
  XXH3_64bits_update(s, values.data(), values.size());
  XXH3_64bits_update(s, scales.data(), scales.size());
  const uint64_t h = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  return h;
}

namespace {

// note: one row of all the plane's bytes: identity offsets need no row width, and this works for any rank.
PlaneLayout flat_identity(int64_t bytes) {
  return {PlaneKind::kIdentity, PlaneGeometry{bytes ? 1 : 0, bytes}, bytes, {}, {}};
}

}  // namespace

Status WeightStore::add(std::string name, Format format, std::vector<int64_t> shape) {
  auto pb = plane_bytes(format, shape, name);
  if (!pb) return tl::unexpected(pb.error());
  return add(std::move(name), format, std::move(shape),
             Layout{"identity", flat_identity(pb->values), flat_identity(pb->scales)});
}

Status WeightStore::add(std::string name, Format format, std::vector<int64_t> shape, Layout layout) {
  if (tensors_.count(name)) return fail("{}: added twice to the weight store", name);
  auto pb = plane_bytes(format, shape, name);
  if (!pb) return tl::unexpected(pb.error());
  if (layout.values.canonical.bytes() != pb->values || layout.scales.canonical.bytes() != pb->scales)
    return fail("{}: layout {} maps {} value and {} scale bytes, the tensor has {} and {}", name, layout.name,
                layout.values.canonical.bytes(), layout.scales.canonical.bytes(), pb->values, pb->scales);
  QTensor t{name, format, std::move(shape), {}, {}, 0, std::move(layout)};
  for (Plane p : {Plane::kValues, Plane::kScales}) {
    auto buf = memory_->allocate_plane(t.layout.plane(p));
    if (!buf)
      return fail("{} {}: live buffer of {} bytes in {} memory: {}", t.name, plane_name(p),
                  t.layout.plane(p).native_bytes, memory_->name(), buf.error().message);
    if (!buf->empty()) buffers_.push_back(*buf);
    total_bytes_ += static_cast<int64_t>(buf->size());
    (p == Plane::kValues ? t.values : t.scales) = *buf;
  }
  const auto pos = tensors_.emplace(std::move(name), std::move(t)).first;
  return refresh_checksum(pos->first).map([](uint64_t) {});
}

Status WeightStore::apply_tensor(std::string_view name, std::span<const uint8_t> values,
                                 std::span<const uint8_t> scales) {
  const TensorWrite w{name, values, scales};
  return apply_tensors({&w, 1});
}

Status WeightStore::scatter_sparse(std::span<const SparsePlaneJob> jobs, std::span<const uint8_t> positions) {
  for (const SparsePlaneJob& j : jobs) {
    const bool live = std::any_of(buffers_.begin(), buffers_.end(), [&](std::span<uint8_t> b) {
      return j.native.data() >= b.data() && j.native.data() + j.native.size() <= b.data() + b.size();
    });
    if (!live) return fail("{}: the plane to scatter into is not a live plane of this store", j.what);
  }
  return memory_->scatter_sparse(jobs, positions);
}

Status WeightStore::apply_tensors(std::span<const TensorWrite> writes) {
  std::vector<TensorWriteJob> jobs;
  jobs.reserve(writes.size());
  for (const TensorWrite& w : writes) {
    auto it = tensors_.find(w.name);
    if (it == tensors_.end()) return fail("{}: not a tensor of this model", w.name);
    QTensor& t = it->second;
    const auto want_values = static_cast<uint64_t>(t.layout.values.canonical.bytes()),
               want_scales = static_cast<uint64_t>(t.layout.scales.canonical.bytes());
    if (w.values.size() != want_values || w.scales.size() != want_scales)
      return fail("{}: {} update with {} value bytes and {} scale bytes, expected {} and {}", w.name,
                  traits(t.format).name, w.values.size(), w.scales.size(), want_values, want_scales);
    jobs.push_back(
        {w.name, &t.layout.values, w.values, t.values, &t.layout.scales, w.scales, t.scales, &t.checksum});
  }
  // note: every write was checked above before the first byte moves.
  return memory_->write_tensors(jobs);
}

Status WeightStore::apply_sparse(std::string_view name, Plane plane, std::span<const int64_t> indices,
                                 int entry_bytes, std::span<const uint8_t> bytes, std::span<uint8_t> undo) {
  return apply_sparse_any(name, plane, indices, entry_bytes, bytes, undo);
}

Status WeightStore::apply_sparse(std::string_view name, Plane plane, std::span<const int32_t> indices,
                                 int entry_bytes, std::span<const uint8_t> bytes, std::span<uint8_t> undo) {
  return apply_sparse_any(name, plane, indices, entry_bytes, bytes, undo);
}

template <class I>
Status WeightStore::apply_sparse_any(std::string_view name, Plane plane, std::span<const I> indices,
                                     int entry_bytes, std::span<const uint8_t> bytes,
                                     std::span<uint8_t> undo) {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return fail("{}: not a tensor of this model", name);
  QTensor& t = it->second;
  const PlaneLayout& l = t.layout.plane(plane);
  const std::span<uint8_t> live = plane == Plane::kValues ? t.values : t.scales;
  const int64_t plane_size = l.canonical.bytes();
  if (entry_bytes < 1 || plane_size % entry_bytes != 0)
    return fail("{} {}: entries of {} bytes do not tile its {} bytes", name, plane_name(plane), entry_bytes,
                plane_size);
  const int64_t entries = plane_size / entry_bytes;
  const auto eb = static_cast<uint64_t>(entry_bytes);
  if (bytes.size() / eb != indices.size() || bytes.size() % eb != 0)
    return fail("{} {}: {} indices of {}-byte entries but {} new bytes", name, plane_name(plane),
                indices.size(), entry_bytes, bytes.size());
  if (!undo.empty() && undo.size() != bytes.size())
    return fail("{} {}: undo space of {} bytes for {} new bytes", name, plane_name(plane), undo.size(),
                bytes.size());
  // note: a device store's indices may be device memory: its memory checks them on the device instead.
  for (size_t j = 0; !memory_->on_device() && j < indices.size(); ++j) {
    if (indices[j] < 0 || indices[j] >= entries)
      return fail("{} {}: entry {} at position {} is outside [0, {})", name, plane_name(plane), indices[j], j,
                  entries);
    if (j > 0 && indices[j] <= indices[j - 1])
      return fail("{} {}: entry {} at position {} does not follow {} (expected strictly increasing)", name,
                  plane_name(plane), indices[j], j, indices[j - 1]);
  }
  // note: every check above runs before this first write, so a refused call leaves the live bytes as they
  // were.
  if (indices.empty()) return {};
  if constexpr (sizeof(I) == 4) {
    if (entries > INT32_MAX)
      return fail("{} {}: {} entries need int64 indices", name, plane_name(plane), entries);
    return memory_->scatter32(l, indices, entry_bytes, bytes, undo, live,
                              fmt::format("{} {}", name, plane_name(plane)));
  } else {
    return memory_->scatter(l, indices, entry_bytes, bytes, undo, live,
                            fmt::format("{} {}", name, plane_name(plane)));
  }
}

Status WeightStore::read_canonical(std::string_view name, Plane plane, std::span<uint8_t> out) const {
  const QTensor* t = find(name);
  if (!t) return fail("{}: not a tensor of this model", name);
  const std::span<const uint8_t> live = plane == Plane::kValues ? t->values : t->scales;
  if (auto s = memory_->read_plane(t->layout.plane(plane), live, out); !s)
    return fail_in(fmt::format("{} {}", name, plane_name(plane)), s.error());
  return {};
}

Result<uint64_t> WeightStore::refresh_checksum(std::string_view name) {
  if (auto s = refresh_checksums({&name, 1}); !s) return tl::unexpected(s.error());
  return tensors_.find(name)->second.checksum;
}

Status WeightStore::refresh_checksums(std::span<const std::string_view> names) {
  std::vector<ChecksumJob> jobs;
  for (std::string_view name : names) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return fail("{}: not a tensor of this model", name);
    QTensor& t = it->second;
    jobs.push_back({&t.layout.values, t.values, &t.layout.scales, t.scales, &t.checksum});
  }
  return memory_->checksums(jobs);
}

Status WeightStore::sync() { return memory_->sync(); }

Status WeightStore::servable() const {
  if (!inconsistent_.empty()) return fail("weights are in no committed version: {}", inconsistent_);
  return {};
}

const QTensor* WeightStore::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const QTensor& WeightStore::at(std::string_view name) const {
  const QTensor* t = find(name);
  assert(t && "weight missing from the store");
  return *t;
}

}  // namespace mxq
