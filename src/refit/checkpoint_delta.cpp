#include "refit/checkpoint_delta.h"

#include <fmt/ranges.h>

#include "format/quantize_parallel.h"
#include "model/open_checkpoint.h"
#include "refit/delta_encoder.h"

namespace mxq::refit {
namespace {

Result<Format> float_format(const std::string& dtype, std::string_view name) {
  if (dtype == "BF16") return Format::kBF16;
  if (dtype == "F16") return Format::kF16;
  if (dtype == "F32") return Format::kF32;
  return fail("{}: dtype {}, expected BF16, F16 or F32 master weights", name, dtype);
}

Result<ModelCheckpoint> open_master(const std::string& dir) {
  auto m = open_model_checkpoint(dir, /*check_bytes=*/false);
  if (!m) return tl::unexpected(m.error());
  if (m->scheme.kind != SchemeKind::kNone)
    return fail("{}: already quantized (scheme {}); a delta is made from unquantized master weights", dir,
                scheme_name(m->scheme.kind));
  return m;
}

}  // namespace

Result<Delta> make_checkpoint_delta(const std::string& base_dir, const std::string& target_dir,
                                    const CheckpointDeltaOptions& options, const ProgressFn& progress) {
  const Format q = options.quantization;
  if (!is_quantized(q)) return fail("--quantization {}: expected mxfp8, mxfp4 or fp8-b128", traits(q).name);
  auto base = open_master(base_dir);
  if (!base) return tl::unexpected(base.error());
  auto target = open_master(target_dir);
  if (!target) return tl::unexpected(target.error());
  const TensorMetaMap base_meta = base->files.meta(), target_meta = target->files.meta();
  for (const auto& [name, meta] : base_meta) {
    auto t = target_meta.find(name);
    if (t == target_meta.end()) return fail("{}: {} is missing from the target", target_dir, name);
    if (t->second.dtype != meta.dtype || t->second.shape != meta.shape)
      return fail("{}: {} is {} [{}] in the target, {} [{}] in the base", target_dir, name, t->second.dtype,
                  fmt::join(t->second.shape, ", "), meta.dtype, fmt::join(meta.shape, ", "));
  }
  if (target_meta.size() != base_meta.size())
    return fail("{}: {} tensors, the base has {}", target_dir, target_meta.size(), base_meta.size());

  Delta delta{options.base_version, options.new_version, {}};
  int64_t done = 0;
  for (const WeightSpec& spec : base->specs) {
    const TensorMeta& meta = base_meta.at(spec.name);
    auto src = float_format(meta.dtype, spec.name);
    if (!src) return tl::unexpected(src.error());
    auto old_raw = read_tensor(base->files, spec.name);
    if (!old_raw) return tl::unexpected(old_raw.error());
    auto new_raw = read_tensor(target->files, spec.name);
    if (!new_raw) return tl::unexpected(new_raw.error());
    Result<TensorDelta> t = fail("unset");
    if (spec.linear) {
      // note: the loader's rule for `--quantization`: linear projections quantized, all else as stored.
      const ScaleRule rule = default_scale_rule(q);
      auto o = quantize_tensor(q, rule, *src, *old_raw, meta.shape, spec.name, options.threads);
      if (!o) return fail_in(base_dir, o.error());
      auto n = quantize_tensor(q, rule, *src, *new_raw, meta.shape, spec.name, options.threads);
      if (!n) return fail_in(target_dir, n.error());
      CanonicalPlanes op{o->values, o->scales}, np{n->values, n->scales};
      t = diff_tensor(spec.name, q, meta.shape, &op, np, options.force_anchor);
    } else {
      CanonicalPlanes op{*old_raw, {}}, np{*new_raw, {}};
      t = diff_tensor(spec.name, *src, meta.shape, &op, np, options.force_anchor);
    }
    if (!t) return tl::unexpected(t.error());
    delta.tensors.push_back(std::move(*t));
    if (progress && !progress({"delta", spec.name, ++done, static_cast<int64_t>(base->specs.size())}))
      return fail("cancelled after {} of {} tensors", done, base->specs.size());
  }
  return delta;
}

}  // namespace mxq::refit
