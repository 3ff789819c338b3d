// The one table of format traits. Every codec, loader, kernel dispatch and refit reads kFormats[].
// Adding a format = adding an enum value and a row (the static_asserts keep them in step).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "base/error.h"

namespace mxq {

enum class Format : uint8_t {
  kBF16,
  kF16,
  kF32,
  kE4M3,     // float8_e4m3fn
  kE5M2,     // float8_e5m2
  kE2M1,     // fp4, one code per nibble
  kE8M0,     // power-of-two scale byte
  kMXFP8,    // E4M3 + E8M0 per 1x32 along K
  kMXFP4,    // E2M1 packed two per byte + E8M0 per 1x32
  kFP8_B128, // E4M3 + f32 weight_scale_inv per 128x128
  kCount,
};

enum class ScaleKind : uint8_t { kNone, kE8M0, kF32 };

struct FormatTraits {
  Format format;
  std::string_view name;      // CLI / log name
  std::string_view st_dtype;  // safetensors dtype of the values plane ("" = none)
  Format element;             // element codec; the format itself for plain dtypes
  int element_bits;           // bits per element in the values plane
  int block_rows;             // scale block shape (1x1 for plain dtypes)
  int block_cols;
  ScaleKind scale;
  int scale_bytes;            // bytes per scale entry (0 = no scale plane)
  double nmse_tolerance;      // linear-layer tolerance vs the f32 oracle on dequantized weights
};

// note: tolerances are for y = x·W^T against the same product on the dequantized weights in f64; the
// error left is bf16 rounding of x/y and f32 accumulation order, so they are loose only for 16-bit inputs.
inline constexpr FormatTraits kFormats[] = {
    {Format::kBF16, "bf16", "BF16", Format::kBF16, 16, 1, 1, ScaleKind::kNone, 0, 1e-4},
    {Format::kF16, "f16", "F16", Format::kF16, 16, 1, 1, ScaleKind::kNone, 0, 1e-5},
    {Format::kF32, "f32", "F32", Format::kF32, 32, 1, 1, ScaleKind::kNone, 0, 1e-10},
    {Format::kE4M3, "e4m3", "F8_E4M3", Format::kE4M3, 8, 1, 1, ScaleKind::kNone, 0, 1e-4},
    {Format::kE5M2, "e5m2", "F8_E5M2", Format::kE5M2, 8, 1, 1, ScaleKind::kNone, 0, 1e-4},
    {Format::kE2M1, "e2m1", "", Format::kE2M1, 4, 1, 1, ScaleKind::kNone, 0, 1e-4},
    {Format::kE8M0, "e8m0", "F8_E8M0", Format::kE8M0, 8, 1, 1, ScaleKind::kNone, 0, 1e-4},
    {Format::kMXFP8, "mxfp8", "F8_E4M3", Format::kE4M3, 8, 1, 32, ScaleKind::kE8M0, 1, 1e-4},
    {Format::kMXFP4, "mxfp4", "U8", Format::kE2M1, 4, 1, 32, ScaleKind::kE8M0, 1, 1e-4},
    {Format::kFP8_B128, "fp8-b128", "F8_E4M3", Format::kE4M3, 8, 128, 128, ScaleKind::kF32, 4, 1e-4},
};
static_assert(std::size(kFormats) == static_cast<size_t>(Format::kCount), "one row per Format");

constexpr const FormatTraits& traits(Format f) { return kFormats[static_cast<size_t>(f)]; }

constexpr bool rows_in_order() {
  for (size_t i = 0; i < std::size(kFormats); ++i)
    if (static_cast<size_t>(kFormats[i].format) != i) return false;
  return true;
}
static_assert(rows_in_order(), "kFormats rows must follow the enum order");
static_assert(traits(Format::kMXFP8).block_cols == 32 && traits(Format::kMXFP4).block_cols == 32);
static_assert(traits(Format::kFP8_B128).block_rows == 128 && traits(Format::kFP8_B128).block_cols == 128);

constexpr bool is_quantized(Format f) { return traits(f).scale != ScaleKind::kNone; }
// MX formats (E8M0 scale per 1x32): MXFP8, MXFP4. The W8A8 mode (cuda/linear/linear.h) applies to exactly
// these.
constexpr bool is_mx(Format f) { return traits(f).scale == ScaleKind::kE8M0; }

// Bytes of the values plane of a [rows, cols] tensor (MXFP4 packs two elements per byte).
constexpr int64_t values_bytes(Format f, int64_t rows, int64_t cols) {
  return rows * ((cols * traits(f).element_bits + 7) / 8);
}
constexpr int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Shape of the canonical scales plane: [N, K/32] for MX, [cdiv(N,128), cdiv(K,128)] for FP8-B128.
constexpr std::array<int64_t, 2> scales_shape(Format f, int64_t rows, int64_t cols) {
  const FormatTraits& t = traits(f);
  if (t.scale == ScaleKind::kNone) return {0, 0};
  return {cdiv(rows, t.block_rows), cdiv(cols, t.block_cols)};
}
constexpr int64_t scales_bytes(Format f, int64_t rows, int64_t cols) {
  auto s = scales_shape(f, rows, cols);
  return s[0] * s[1] * traits(f).scale_bytes;
}

// Looks a format up by its name ("mxfp8"); unknown names are a named error.
Result<Format> parse_format(std::string_view name);

}  // namespace mxq
