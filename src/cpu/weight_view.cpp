#include "cpu/weight_view.h"

namespace mxq {

bool cpu_linear_supports(Format f) {
  switch (f) {
    case Format::kBF16:
    case Format::kF16:
    case Format::kF32:
    case Format::kE4M3:
    case Format::kE5M2:
    case Format::kMXFP8:
    case Format::kMXFP4:
    case Format::kFP8_B128:
      return true;
    default:
      return false;  // bare E2M1 / E8M0 planes are parts of a format, not weights
  }
}

Status check_weight_view(const WeightView& w, std::string_view what) {
  const FormatTraits& t = traits(w.format);
  if (!cpu_linear_supports(w.format))
    return fail(
        "{}: format {} is not a weight format the CPU backend reads (expected one of bf16, f16, "
        "f32, e4m3, e5m2, mxfp8, mxfp4, fp8-b128)",
        what, t.name);
  if (w.rows < 0 || w.cols < 0)
    return fail("{}: shape [{}, {}] has a negative dimension", what, w.rows, w.cols);
  if (t.scale == ScaleKind::kE8M0 && w.cols % t.block_cols != 0)
    return fail("{}: {} needs K to be a multiple of {}, got K = {}", what, t.name, t.block_cols, w.cols);
  if (w.rows > 0 && w.cols > 0) {
    if (w.values == nullptr) return fail("{}: values plane is missing", what);
    if (t.scale != ScaleKind::kNone && w.scales == nullptr)
      return fail("{}: {} needs a scales plane, got none", what, t.name);
  }
  return {};
}

}  // namespace mxq
