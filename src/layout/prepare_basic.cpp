// Row-major and transposed view (no byte moves), the 128x4 scale swizzle, MN-major FP8-B128 scales, and
// the table of built-ins.
#include <fmt/format.h>

#include <algorithm>

#include "layout/prepare.h"
#include "layout/prepare_checks.h"

namespace mxq {

int64_t swizzle_128x4_offset(int64_t r, int64_t c, int64_t cols) {
  const int64_t k_tiles = cdiv(cols, 4);
  return r / 128 * k_tiles * 512 + c / 4 * 512 + r % 32 * 16 + r % 128 / 32 * 4 + c % 4;
}

int64_t swizzle_128x4_bytes(int64_t rows, int64_t cols) { return cdiv(rows, 128) * 128 * cdiv(cols, 4) * 4; }

std::vector<uint8_t> swizzle_scales(const TensorGeometry& g, std::span<const uint8_t> scales,
                                    std::span<const int64_t> src_row) {
  const int64_t rows = g.rows, cols = g.scales.row_bytes, per_expert = swizzle_128x4_bytes(rows, cols);
  std::vector<uint8_t> out(static_cast<size_t>(g.experts * per_expert), 0);
  for (int64_t e = 0; e < g.experts; ++e)
    for (int64_t j = 0; j < rows; ++j) {
      const uint8_t* src = scales.data() + (e * rows + (src_row.empty() ? j : src_row[j])) * cols;
      for (int64_t c = 0; c < cols; ++c) out[e * per_expert + swizzle_128x4_offset(j, c, cols)] = src[c];
    }
  return out;
}

Status check_planes(std::string_view layout, const TensorGeometry& g, const HostPlanes& in) {
  if (static_cast<int64_t>(in.values.size()) != g.values.bytes() ||
      static_cast<int64_t>(in.scales.size()) != g.scales.bytes())
    return fail("{}: planes of {} + {} bytes (expected {} + {})", layout, in.values.size(), in.scales.size(),
                g.values.bytes(), g.scales.bytes());
  return {};
}

Status check_mx(std::string_view layout, const TensorGeometry& g) {
  if (traits(g.format).scale != ScaleKind::kE8M0)
    return fail("{}: format {} (expected mxfp8 or mxfp4: E8M0 1x32 scales)", layout, traits(g.format).name);
  return {};
}

Result<HostPlanes> prepare_row_major(const TensorGeometry& g, const HostPlanes& canonical) {
  if (auto s = check_planes("row_major", g, canonical); !s) return tl::unexpected(s.error());
  return canonical;
}

Result<HostPlanes> prepare_transposed_view(const TensorGeometry& g, const HostPlanes& canonical) {
  if (auto s = check_planes("transposed_view", g, canonical); !s) return tl::unexpected(s.error());
  return canonical;
}

Result<HostPlanes> prepare_scale_swizzle_128x4(const TensorGeometry& g, const HostPlanes& canonical) {
  constexpr std::string_view kName = "scale_swizzle_128x4";
  if (auto s = check_mx(kName, g); !s) return tl::unexpected(s.error());
  if (auto s = check_planes(kName, g, canonical); !s) return tl::unexpected(s.error());
  return HostPlanes{canonical.values, swizzle_scales(g, canonical.scales, {})};
}

Result<HostPlanes> prepare_scales_mn_major(const TensorGeometry& g, const HostPlanes& canonical) {
  constexpr std::string_view kName = "scales_mn_major";
  if (traits(g.format).scale != ScaleKind::kF32)
    return fail("{}: format {} (expected fp8-b128: f32 block scales)", kName, traits(g.format).name);
  if (auto s = check_planes(kName, g, canonical); !s) return tl::unexpected(s.error());
  const int64_t entry = traits(g.format).scale_bytes, rows = g.scales.rows / std::max<int64_t>(g.experts, 1);
  const int64_t cols = g.scales.row_bytes / entry;
  HostPlanes out{canonical.values, std::vector<uint8_t>(canonical.scales.size())};
  for (int64_t e = 0; e < g.experts; ++e)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        std::copy_n(canonical.scales.begin() + ((e * rows + r) * cols + c) * entry, entry,
                    out.scales.begin() + ((e * cols + c) * rows + r) * entry);
  return out;
}

namespace {
constexpr NamedPrepare kBuiltins[] = {
    {"row_major", prepare_row_major},
    {"transposed_view", prepare_transposed_view},
    {"scale_swizzle_128x4", prepare_scale_swizzle_128x4},
    {"scales_mn_major", prepare_scales_mn_major},
    {"trtllm_moe_w13", prepare_trtllm_moe_w13},
    {"trtllm_moe_w2", prepare_trtllm_moe_w2},
    {"marlin", prepare_marlin},
};
}  // namespace

std::span<const NamedPrepare> builtin_prepares() { return kBuiltins; }

Result<Layout> probe_builtin(std::string_view tensor, std::string_view layout, Format f,
                             std::span<const int64_t> shape) {
  for (const NamedPrepare& b : kBuiltins) {
    if (b.name != layout) continue;
    auto g = tensor_geometry(tensor, f, shape);
    if (!g) return tl::unexpected(g.error());
    const TensorGeometry geometry = *g;
    return probe_layout(tensor, layout, f, shape,
                        [&](const HostPlanes& in) { return b.prepare(geometry, in); });
  }
  std::string known;
  for (const NamedPrepare& b : kBuiltins) known += fmt::format("{}{}", known.empty() ? "" : ", ", b.name);
  return fail("{}: unknown layout '{}' (known: {})", tensor, layout, known);
}

}  // namespace mxq
