#include "model/weight_store.h"

#include <xxhash.h>

#include <cassert>
#include <cstdlib>
#include <cstring>

namespace mxq {

void WeightStore::Free::operator()(uint8_t* p) const { std::free(p); }

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

bool is_identity(const Layout& l) {
  return l.values.kind == PlaneKind::kIdentity && l.scales.kind == PlaneKind::kIdentity;
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
  // note: 64-byte alignment so vector loads of a row never split a cache line at the start.
  auto alloc = [this](int64_t bytes) -> std::span<uint8_t> {
    if (bytes == 0) return {};
    const size_t rounded = (static_cast<size_t>(bytes) + 63) / 64 * 64;
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, rounded));
    assert(p && "out of host memory for weights");
    std::memset(p, 0, rounded);
    buffers_.emplace_back(p);
    total_bytes_ += bytes;
    return {p, static_cast<size_t>(bytes)};
  };
  QTensor t{name,
            format,
            std::move(shape),
            alloc(layout.values.native_bytes),
            alloc(layout.scales.native_bytes),
            0,
            std::move(layout)};
  const auto pos = tensors_.emplace(std::move(name), std::move(t)).first;
  return refresh_checksum(pos->first).map([](uint64_t) {});
}

Status WeightStore::apply_tensor(std::string_view name, std::span<const uint8_t> values,
                                 std::span<const uint8_t> scales) {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return fail("{}: not a tensor of this model", name);
  QTensor& t = it->second;
  const auto want_values = static_cast<uint64_t>(t.layout.values.canonical.bytes()),
             want_scales = static_cast<uint64_t>(t.layout.scales.canonical.bytes());
  if (values.size() != want_values || scales.size() != want_scales)
    return fail("{}: {} update with {} value bytes and {} scale bytes, expected {} and {}", name,
                traits(t.format).name, values.size(), scales.size(), want_values, want_scales);
  if (auto s = to_native(t.layout.values, values, t.values); !s) return fail_in(name, s.error());
  if (auto s = to_native(t.layout.scales, scales, t.scales); !s) return fail_in(name, s.error());
  return refresh_checksum(name).map([](uint64_t) {});
}

Status WeightStore::apply_sparse(std::string_view name, Plane plane, std::span<const int64_t> indices,
                                 int entry_bytes, std::span<const uint8_t> bytes, std::span<uint8_t> undo) {
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
  for (size_t j = 0; j < indices.size(); ++j) {
    if (indices[j] < 0 || indices[j] >= entries)
      return fail("{} {}: entry {} at position {} is outside [0, {})", name, plane_name(plane), indices[j], j,
                  entries);
    if (j > 0 && indices[j] <= indices[j - 1])
      return fail("{} {}: entry {} at position {} does not follow {} (expected strictly increasing)", name,
                  plane_name(plane), indices[j], j, indices[j - 1]);
  }
  // note: every check above runs before this first write, so a refused call leaves the live bytes as they
  // were; the old byte is saved right before it is overwritten, in the order of `bytes`.
  for (size_t j = 0; j < indices.size(); ++j) {
    const int64_t first = indices[j] * entry_bytes;
    for (int b = 0; b < entry_bytes; ++b) {
      uint8_t& dst = live[static_cast<size_t>(l.native_offset(first + b))];
      const size_t k = j * eb + static_cast<size_t>(b);
      if (!undo.empty()) undo[k] = dst;
      dst = bytes[k];
    }
  }
  return {};
}

Status WeightStore::read_canonical(std::string_view name, Plane plane, std::span<uint8_t> out) const {
  const QTensor* t = find(name);
  if (!t) return fail("{}: not a tensor of this model", name);
  const std::span<const uint8_t> live = plane == Plane::kValues ? t->values : t->scales;
  if (auto s = to_canonical(t->layout.plane(plane), live, out); !s)
    return fail_in(fmt::format("{} {}", name, plane_name(plane)), s.error());
  return {};
}

Result<uint64_t> WeightStore::refresh_checksum(std::string_view name) {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return fail("{}: not a tensor of this model", name);
  QTensor& t = it->second;
  // note: an identity layout's live bytes are the canonical planes: hash in place, no copy. Other layouts
  // gather both planes first (the checksum speaks canonical order, DESIGN.md).
  if (is_identity(t.layout)) return t.checksum = canonical_checksum(t.values, t.scales);
  std::vector<uint8_t> values(static_cast<size_t>(t.layout.values.canonical.bytes())),
      scales(static_cast<size_t>(t.layout.scales.canonical.bytes()));
  if (auto s = read_canonical(name, Plane::kValues, values); !s) return tl::unexpected(s.error());
  if (auto s = read_canonical(name, Plane::kScales, scales); !s) return tl::unexpected(s.error());
  return t.checksum = canonical_checksum(values, scales);
}

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
