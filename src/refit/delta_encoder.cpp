#include "refit/delta_encoder.h"

#include <fmt/ranges.h>

#include <bit>
#include <cassert>
#include <cstring>

#include "model/weight_store.h"
#include "refit/index_codec.h"

namespace mxq::refit {

std::vector<int64_t> changed_entries(std::span<const uint8_t> old_plane, std::span<const uint8_t> new_plane,
                                     int entry_bytes) {
  assert(old_plane.size() == new_plane.size() && (entry_bytes == 1 || entry_bytes == 2 || entry_bytes == 4));
  std::vector<int64_t> out;
  const size_t n = new_plane.size();
  size_t i = 0;
  // note: most words are equal in a refit step, so the loop compares 8 bytes at a time and looks inside a
  // word only when it differs; entries never straddle a word because 8 % entry_bytes == 0.
  for (; i + 8 <= n; i += 8) {
    uint64_t a, b;
    std::memcpy(&a, old_plane.data() + i, 8);
    std::memcpy(&b, new_plane.data() + i, 8);
    if (a == b) continue;
    // note: the XOR has a non-zero byte exactly where the planes differ (little-endian: byte k = bits 8k..).
    const uint64_t x = a ^ b;
    if (entry_bytes == 1) {
      // note: the high bit of each byte of `m` is set iff that byte of x is non-zero (7 low bits carry into
      // it).
      constexpr uint64_t kLow7 = 0x7F7F7F7F7F7F7F7Full;
      for (uint64_t m = (((x & kLow7) + kLow7) | x) & ~kLow7; m; m &= m - 1)
        out.push_back(static_cast<int64_t>(i) + std::countr_zero(m) / 8);
      continue;
    }
    for (int e = 0; e < 8; e += entry_bytes) {
      const uint64_t mask = ((uint64_t{1} << (8 * entry_bytes)) - 1) << (8 * e);
      if (x & mask) out.push_back(static_cast<int64_t>(i + static_cast<size_t>(e)) / entry_bytes);
    }
  }
  for (; i < n; i += static_cast<size_t>(entry_bytes))
    if (std::memcmp(old_plane.data() + i, new_plane.data() + i, static_cast<size_t>(entry_bytes)) != 0)
      out.push_back(static_cast<int64_t>(i) / entry_bytes);
  return out;
}

int64_t sparse_record_bytes(const TensorDelta& t, const std::array<PlaneGeometry, 2>& geometry) {
  // note: per plane 1 encoding byte + u64 changed count + u64 index byte count.
  constexpr int64_t kPlaneHeader = 17;
  int64_t bytes = 0;
  for (int p = 0; p < (is_quantized(t.format) ? 2 : 1); ++p) {
    const PlaneDelta& pd = p == 0 ? t.values : t.scales;
    const int64_t entries = geometry[p].entries;
    bytes += kPlaneHeader + encoded_size(choose_encoding(pd.indices, entries), pd.indices, entries) +
             static_cast<int64_t>(pd.bytes.size());
  }
  return bytes;
}

namespace {

PlaneDelta sparse_plane(std::span<const uint8_t> old_plane, std::span<const uint8_t> new_plane, int w) {
  PlaneDelta p;
  p.indices = changed_entries(old_plane, new_plane, w);
  p.bytes.resize(p.indices.size() * static_cast<size_t>(w));
  const size_t width = static_cast<size_t>(w);
  for (size_t k = 0; k < p.indices.size(); ++k)
    for (size_t j = 0; j < width; ++j)
      p.bytes[k * width + j] = new_plane[static_cast<size_t>(p.indices[k]) * width + j];
  return p;
}

}  // namespace

Result<TensorDelta> diff_tensor(std::string_view name, Format format, const std::vector<int64_t>& shape,
                                const CanonicalPlanes* old_planes, const CanonicalPlanes& new_planes,
                                bool force_anchor) {
  auto g = tensor_geometry(format, shape, name);
  if (!g) return tl::unexpected(g.error());
  const auto sizes_match = [&](const CanonicalPlanes& p) {
    return static_cast<int64_t>(p.values.size()) == (*g)[0].bytes &&
           static_cast<int64_t>(p.scales.size()) == (*g)[1].bytes;
  };
  if (!sizes_match(new_planes) || (old_planes && !sizes_match(*old_planes)))
    return fail("{}: planes of {} + {} bytes, expected {} + {} for {} [{}]", name,
                (sizes_match(new_planes) ? *old_planes : new_planes).values.size(),
                (sizes_match(new_planes) ? *old_planes : new_planes).scales.size(), (*g)[0].bytes,
                (*g)[1].bytes, traits(format).name, fmt::join(shape, ", "));
  TensorDelta t{std::string(name),
                format,
                shape,
                false,
                canonical_checksum(new_planes.values, new_planes.scales),
                {},
                {}};
  if (old_planes && !force_anchor) {
    t.values = sparse_plane(old_planes->values, new_planes.values, entry_bytes(format, Plane::kValues));
    if (is_quantized(format))
      t.scales = sparse_plane(old_planes->scales, new_planes.scales, entry_bytes(format, Plane::kScales));
    if (sparse_record_bytes(t, *g) < (*g)[0].bytes + (*g)[1].bytes) return t;
  }
  t.anchor = true;
  t.values = PlaneDelta{{}, {new_planes.values.begin(), new_planes.values.end()}};
  t.scales = PlaneDelta{{}, {new_planes.scales.begin(), new_planes.scales.end()}};
  return t;
}

}  // namespace mxq::refit
