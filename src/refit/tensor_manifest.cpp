#include "refit/tensor_manifest.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>

namespace mxq::refit {
namespace {

// The element count of a shape (tensor_geometry has bounded it).
int64_t elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// [offset, offset + bytes) inside [0, size), offset aligned; `what` names the field.
Status check_range(const ManifestTensor& t, const char* what, uint64_t offset, uint64_t bytes, uint64_t size) {
  if (offset % kManifestAlign != 0)
    return fail("{}: {} {} is not a multiple of {} bytes", t.name, what, offset, kManifestAlign);
  if (offset > size || bytes > size - offset)
    return fail("{}: {} bytes at {} {} run past the buffer's {} bytes (W-03)", t.name, bytes, what, offset,
                size);
  return {};
}

}  // namespace

Result<Format> parse_manifest_dtype(std::string_view name) {
  if (name == "bfloat16") return Format::kBF16;
  if (name == "float16") return Format::kF16;
  if (name == "float32") return Format::kF32;
  for (Format f : {Format::kBF16, Format::kF16, Format::kF32, Format::kMXFP8, Format::kMXFP4, Format::kFP8_B128})
    if (name == traits(f).name) return f;
  return fail("dtype \"{}\": expected bf16, f16, f32 (or bfloat16, float16, float32), mxfp8, mxfp4 or fp8-b128",
              name.substr(0, 64));
}

Result<std::vector<ManifestStep>> plan_manifest(const TensorManifest& m, const TensorTable& table) {
  if (m.ipc_offset % kManifestAlign != 0)
    return fail("ipc_offset {} is not a multiple of {} bytes", m.ipc_offset, kManifestAlign);
  // note: coverage first, as a delta's validation reports it: a manifest of another model is named so, not as
  // the dtype or shape mismatches it would also show.
  CoverageReport cover;
  std::map<std::string_view, int> seen;
  for (const ManifestTensor& t : m.tensors)
    if (++seen[t.name] == 2) cover.duplicated.push_back(t.name);
  for (const auto& [name, n] : seen)
    if (!table.count(name)) cover.unknown.emplace_back(name);
  for (const auto& [name, spec] : table)
    if (!seen.count(name)) cover.missing.push_back(name);
  if (!cover.complete())
    return fail("the manifest does not cover the model's {} tensors exactly: {} (W-07)", table.size(),
                cover.summary());
  std::vector<ManifestStep> steps;
  steps.reserve(m.tensors.size());
  for (const ManifestTensor& t : m.tensors) {
    const TensorSpec& spec = table.find(t.name)->second;
    ManifestStep s;
    s.source = &t;
    s.live = spec.format;
    const bool plain_source = !is_quantized(t.dtype);
    s.quantize = plain_source && is_quantized(spec.format);
    // note: a source is quantized into the live format, never cast: bf16 into an f32 tensor is refused.
    if (t.dtype != spec.format && !s.quantize)
      return fail("{}: manifest dtype {}, the live tensor is {} (W-08: send {}{})", t.name, traits(t.dtype).name,
                  traits(spec.format).name, traits(spec.format).name,
                  is_quantized(spec.format) ? " planes, or bf16/f16/f32 weights" : "");
    if (t.shape != spec.shape)
      return fail("{}: manifest shape [{}], the live tensor is [{}] (W-08)", t.name, fmt::join(t.shape, ", "),
                  fmt::join(spec.shape, ", "));
    auto g = tensor_geometry(spec.format, spec.shape, t.name);
    if (!g) return tl::unexpected(g.error());
    s.planes = *g;
    if (s.quantize) {
      s.source_bytes = static_cast<uint64_t>(elements(t.shape)) * (traits(t.dtype).element_bits / 8);
      if (t.scales_offset != 0)
        return fail("{}: scales_offset given for {} source weights (it belongs to quantized planes)", t.name,
                    traits(t.dtype).name);
    } else {
      s.source_bytes = static_cast<uint64_t>(s.planes[0].bytes);
    }
    if (auto r = check_range(t, "offset", t.offset, s.source_bytes, m.size); !r) return tl::unexpected(r.error());
    if (!plain_source)
      if (auto r = check_range(t, "scales_offset", t.scales_offset, static_cast<uint64_t>(s.planes[1].bytes),
                               m.size);
          !r)
        return tl::unexpected(r.error());
    steps.push_back(s);
  }
  return steps;
}

}  // namespace mxq::refit
