#include "refit/checkpoint_delta.h"

#include <fmt/ranges.h>

#include "format/quantize.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/scheme.h"
#include "model/qwen3_weights.h"
#include "refit/delta_encoder.h"

namespace mxq::refit {
namespace {

Result<Format> float_format(const std::string& dtype, std::string_view name) {
  if (dtype == "BF16") return Format::kBF16;
  if (dtype == "F16") return Format::kF16;
  if (dtype == "F32") return Format::kF32;
  return fail("{}: dtype {}, expected BF16, F16 or F32 master weights", name, dtype);
}

struct Planes {
  std::vector<uint8_t> values, scales;
};

// Quantizes a [..., N, K] tensor one [N, K] matrix at a time, so FP8-B128 blocks never span two experts.
Result<Planes> quantize_planes(Format q, Format src, const std::vector<uint8_t>& raw,
                               const std::vector<int64_t>& shape, const std::string& name) {
  const int64_t n = shape[shape.size() - 2], k = shape.back();
  const int64_t matrix = n * k,
                batch =
                    matrix ? static_cast<int64_t>(raw.size()) / (matrix * traits(src).element_bits / 8) : 0;
  Planes p{std::vector<uint8_t>(static_cast<size_t>(batch * values_bytes(q, n, k))),
           std::vector<uint8_t>(static_cast<size_t>(batch * scales_bytes(q, n, k)))};
  for (int64_t e = 0; e < batch; ++e) {
    const size_t in_at = static_cast<size_t>(e * matrix * traits(src).element_bits / 8);
    if (auto s = quantize(q, default_scale_rule(q), src, raw.data() + in_at, n, k,
                          p.values.data() + e * values_bytes(q, n, k),
                          p.scales.data() + e * scales_bytes(q, n, k), name);
        !s)
      return tl::unexpected(s.error());
  }
  return p;
}

}  // namespace

Result<Delta> make_checkpoint_delta(const std::string& base_dir, const std::string& target_dir,
                                    const CheckpointDeltaOptions& options, const ProgressFn& progress) {
  if (!is_quantized(options.quantization))
    return fail("--quantization {}: expected mxfp8, mxfp4 or fp8-b128", traits(options.quantization).name);
  auto cfg = read_config(base_dir);
  if (!cfg) return tl::unexpected(cfg.error());
  if (!cfg->quantization_config.is_null())
    return fail("{}: config.json has a quantization_config; a delta is made from unquantized master weights",
                base_dir);
  auto base = Checkpoint::open(base_dir);
  if (!base) return tl::unexpected(base.error());
  auto target = Checkpoint::open(target_dir);
  if (!target) return tl::unexpected(target.error());
  const TensorMetaMap base_meta = base->meta(), target_meta = target->meta();
  auto specs = check_qwen3_tensors(*cfg, Scheme{}, base_meta);
  if (!specs) return fail_in(base_dir, specs.error());
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
  for (const WeightSpec& spec : *specs) {
    const TensorMeta& meta = base_meta.at(spec.name);
    auto src = float_format(meta.dtype, spec.name);
    if (!src) return tl::unexpected(src.error());
    std::vector<uint8_t> old_raw(base->find(spec.name)->nbytes()), new_raw(old_raw.size());
    if (auto s = base->read(spec.name, old_raw); !s) return tl::unexpected(s.error());
    if (auto s = target->read(spec.name, new_raw); !s) return tl::unexpected(s.error());
    Result<TensorDelta> t = fail("unset");
    if (spec.linear) {
      auto o = quantize_planes(options.quantization, *src, old_raw, spec.shape, spec.name);
      if (!o) return fail_in(base_dir, o.error());
      auto n = quantize_planes(options.quantization, *src, new_raw, spec.shape, spec.name);
      if (!n) return fail_in(target_dir, n.error());
      CanonicalPlanes op{o->values, o->scales}, np{n->values, n->scales};
      t = diff_tensor(spec.name, options.quantization, spec.shape, &op, np, options.force_anchor);
    } else {
      CanonicalPlanes op{old_raw, {}}, np{new_raw, {}};
      t = diff_tensor(spec.name, *src, spec.shape, &op, np, options.force_anchor);
    }
    if (!t) return tl::unexpected(t.error());
    delta.tensors.push_back(std::move(*t));
    if (progress && !progress({"delta", spec.name, ++done, static_cast<int64_t>(specs->size())}))
      return fail("cancelled after {} of {} tensors", done, specs->size());
  }
  return delta;
}

}  // namespace mxq::refit
