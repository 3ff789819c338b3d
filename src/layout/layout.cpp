#include "layout/layout.h"

#include <cstring>

namespace mxq {
namespace {

bool mul_ok(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }

Status check_span(std::string_view what, size_t have, int64_t want) {
  if (static_cast<uint64_t>(want) != have) return fail("{} is {} bytes (expected {})", what, have, want);
  return {};
}

// Indices strictly increasing inside [0, bytes); named by the first offender.
Status check_indices(const PlaneLayout& l, std::span<const int64_t> indices, size_t values) {
  if (indices.size() != values)
    return fail("{} indices but {} bytes (expected one byte per index)", indices.size(), values);
  const int64_t n = l.canonical.bytes();
  for (size_t j = 0; j < indices.size(); ++j) {
    if (indices[j] < 0 || indices[j] >= n)
      return fail("index {} at position {} is outside the plane [0, {})", indices[j], j, n);
    if (j > 0 && indices[j] <= indices[j - 1])
      return fail("index {} at position {} does not follow {} (expected strictly increasing)", indices[j], j,
                  indices[j - 1]);
  }
  return {};
}

}  // namespace

std::string_view plane_name(Plane p) { return p == Plane::kValues ? "values" : "scales"; }

Result<TensorGeometry> tensor_geometry(std::string_view tensor, Format f, std::span<const int64_t> shape) {
  if (shape.size() != 2 && shape.size() != 3)
    return fail("{}: rank {} (expected [N, K] or [E, N, K])", tensor, shape.size());
  for (int64_t d : shape)
    if (d < 0) return fail("{}: negative dimension {} in shape", tensor, d);
  TensorGeometry g;
  g.format = f;
  g.experts = shape.size() == 3 ? shape[0] : 1;
  g.rows = shape[shape.size() - 2];
  g.cols = shape[shape.size() - 1];
  const FormatTraits& t = traits(f);
  if (t.scale == ScaleKind::kE8M0 && g.cols % t.block_cols != 0)
    return fail("{}: {} needs K a multiple of {} (got K = {})", tensor, t.name, t.block_cols, g.cols);
  if (t.element_bits == 4 && g.cols % 2 != 0)
    return fail("{}: 4-bit elements need an even K (got K = {})", tensor, g.cols);
  // note: every product below is checked so a crafted shape cannot wrap int64 (L-15).
  int64_t rows = 0, bits = 0, total = 0;
  if (!mul_ok(g.experts, g.rows, &rows) || !mul_ok(g.cols, t.element_bits, &bits) ||
      !mul_ok(rows, bits / 8, &total))
    return fail("{}: shape [{}, {}, {}] overflows int64 bytes", tensor, g.experts, g.rows, g.cols);
  g.values = {rows, bits / 8};
  if (t.scale != ScaleKind::kNone) {
    const auto s = scales_shape(f, g.rows, g.cols);
    int64_t srows = 0;
    if (!mul_ok(g.experts, s[0], &srows)) return fail("{}: scale rows overflow int64", tensor);
    g.scales = {srows, s[1] * t.scale_bytes};
  }
  return g;
}

Layout identity_layout(std::string name, const TensorGeometry& g) {
  Layout l;
  l.name = std::move(name);
  l.values = {PlaneKind::kIdentity, g.values, g.values.bytes(), {}, {}};
  l.scales = {PlaneKind::kIdentity, g.scales, g.scales.bytes(), {}, {}};
  return l;
}

Status to_native(const PlaneLayout& l, std::span<const uint8_t> canonical, std::span<uint8_t> native) {
  if (auto s = check_span("canonical plane", canonical.size(), l.canonical.bytes()); !s) return s;
  if (auto s = check_span("native plane", native.size(), l.native_bytes); !s) return s;
  if (l.kind == PlaneKind::kIdentity) {
    if (!canonical.empty()) std::memcpy(native.data(), canonical.data(), canonical.size());
    return {};
  }
  std::memset(native.data(), 0, native.size());
  const int64_t w = l.canonical.row_bytes;
  for (int64_t r = 0; r < l.canonical.rows; ++r) {
    uint8_t* dst = native.data() + l.row_off[r];
    const uint8_t* src = canonical.data() + r * w;
    for (int64_t c = 0; c < w; ++c) dst[l.col_off[c]] = src[c];
  }
  return {};
}

Status to_canonical(const PlaneLayout& l, std::span<const uint8_t> native, std::span<uint8_t> canonical) {
  if (auto s = check_span("canonical plane", canonical.size(), l.canonical.bytes()); !s) return s;
  if (auto s = check_span("native plane", native.size(), l.native_bytes); !s) return s;
  if (l.kind == PlaneKind::kIdentity) {
    if (!native.empty()) std::memcpy(canonical.data(), native.data(), native.size());
    return {};
  }
  const int64_t w = l.canonical.row_bytes;
  for (int64_t r = 0; r < l.canonical.rows; ++r) {
    const uint8_t* src = native.data() + l.row_off[r];
    uint8_t* dst = canonical.data() + r * w;
    for (int64_t c = 0; c < w; ++c) dst[c] = src[l.col_off[c]];
  }
  return {};
}

Status scatter(const PlaneLayout& l, std::span<const int64_t> indices, std::span<const uint8_t> bytes,
               std::span<uint8_t> native) {
  if (auto s = check_span("native plane", native.size(), l.native_bytes); !s) return s;
  if (auto s = check_indices(l, indices, bytes.size()); !s) return s;
  for (size_t j = 0; j < indices.size(); ++j) native[l.native_offset(indices[j])] = bytes[j];
  return {};
}

Status gather(const PlaneLayout& l, std::span<const int64_t> indices, std::span<const uint8_t> native,
              std::span<uint8_t> bytes) {
  if (auto s = check_span("native plane", native.size(), l.native_bytes); !s) return s;
  if (auto s = check_indices(l, indices, bytes.size()); !s) return s;
  for (size_t j = 0; j < indices.size(); ++j) bytes[j] = native[l.native_offset(indices[j])];
  return {};
}

}  // namespace mxq
