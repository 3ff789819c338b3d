// Layout: the recorded byte permutation between a tensor's canonical planes and a kernel's native buffers.
// Canonical planes are byte matrices [rows, row_bytes] (DESIGN.md "Canonical planes"):
//   values: [E·N, K·bits/8]; scales: E8M0 [E·N, K/32] (MX) or f32 [E·cdiv(N,128), 4·cdiv(K,128)] (FP8-B128).
// A plane's native offset is either the canonical byte index (identity) or row_off[r] + col_off[c]
// (separable), so a Layout costs O(rows + row_bytes) memory whatever the tensor size. Native bytes that
// no canonical byte maps to are padding: to_native writes them as zero and nothing reads them back.
// note: byte granularity. A layout that moves single E2M1 nibbles between bytes (Marlin 4-bit packs 8
// nibbles of different K into one int32) is refused by probe_layout, by name; MXFP4 layouts that move whole
// bytes (TRT-LLM row shuffles, the CUDA GEMV 2-byte runs) are ordinary separable layouts.
// Errors say what is wrong with the buffers or indices; callers prefix tensor, layout and plane (fail_in).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "format/formats.h"

namespace mxq {

enum class Plane : uint8_t { kValues, kScales };
std::string_view plane_name(Plane p);

struct PlaneGeometry {
  int64_t rows = 0;
  int64_t row_bytes = 0;
  int64_t bytes() const { return rows * row_bytes; }
};

// A tensor [N, K] or stacked experts [E, N, K] and its two canonical planes.
// note: the expert dimension folds into plane rows (expert e's row r is plane row e·N + r); a kernel that
// places experts apart still has a separable layout because row_off is free per row.
struct TensorGeometry {
  Format format = Format::kBF16;
  int64_t experts = 1, rows = 0, cols = 0;
  PlaneGeometry values, scales;  // scales is {0, 0} for formats without a scale plane
  const PlaneGeometry& plane(Plane p) const { return p == Plane::kValues ? values : scales; }
};

// Refuses, naming the tensor: rank other than 2 or 3, negative or overflowing dims, K % 32 != 0 for MX.
Result<TensorGeometry> tensor_geometry(std::string_view tensor, Format f, std::span<const int64_t> shape);

enum class PlaneKind : uint8_t { kIdentity, kSeparable };

struct PlaneLayout {
  PlaneKind kind = PlaneKind::kIdentity;
  PlaneGeometry canonical;
  int64_t native_bytes = 0;      // padding included; == canonical.bytes() for identity
  std::vector<int64_t> row_off;  // separable only: one per canonical row
  std::vector<int64_t> col_off;  // separable only: one per canonical byte column (may be negative)

  // Native offset of canonical byte (r, c) / of canonical byte index i = r·row_bytes + c. The caller keeps
  // r, c, i in range (scatter / gather check them for deltas).
  int64_t native_offset(int64_t r, int64_t c) const {
    return kind == PlaneKind::kIdentity ? r * canonical.row_bytes + c : row_off[r] + col_off[c];
  }
  int64_t native_offset(int64_t i) const {
    return kind == PlaneKind::kIdentity ? i : native_offset(i / canonical.row_bytes, i % canonical.row_bytes);
  }
};

struct Layout {
  std::string name;  // kernel / layout name, as probed ("row_major", "marlin", ...)
  PlaneLayout values, scales;
  const PlaneLayout& plane(Plane p) const { return p == Plane::kValues ? values : scales; }
};

// Both planes identity (the CPU backend's layout, and any view that moves no byte).
Layout identity_layout(std::string name, const TensorGeometry& g);

// canonical (canonical.bytes()) → native (native_bytes, pads written zero), and back. Sizes are checked.
Status to_native(const PlaneLayout& l, std::span<const uint8_t> canonical, std::span<uint8_t> native);
Status to_canonical(const PlaneLayout& l, std::span<const uint8_t> native, std::span<uint8_t> canonical);

// Refit's sparse path: writes bytes[j] at the native offset of canonical byte indices[j], and reads them
// back. Indices must be strictly increasing and inside the plane; everything is checked before the first
// write, so a refused call leaves `native` untouched.
Status scatter(const PlaneLayout& l, std::span<const int64_t> indices, std::span<const uint8_t> bytes,
               std::span<uint8_t> native);
Status gather(const PlaneLayout& l, std::span<const int64_t> indices, std::span<const uint8_t> native,
              std::span<uint8_t> bytes);

}  // namespace mxq
