#include "model/load_model.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include "base/one_line.h"
#include "format/codec.h"
#include "format/quantize_parallel.h"
#include "io/checkpoint.h"
#include "model/open_checkpoint.h"

namespace mxq {
namespace {

// Copies a tensor out of the mapping (the guarded path, L-19) and applies the scheme's byte policy (Q-07,
// Q-08) before anything reaches the store: a refused byte never becomes a live weight.
Result<std::vector<uint8_t>> read_checked(const Checkpoint& ckpt, const Scheme& scheme,
                                          const std::string& name) {
  auto bytes = read_tensor(ckpt, name);
  if (!bytes) return tl::unexpected(bytes.error());
  if (auto st = check_tensor_bytes(scheme, name, *bytes); !st) return tl::unexpected(st.error());
  return bytes;
}

int default_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

// FP8-B128 scales may be stored as BF16; the store always holds f32 multipliers.
std::vector<uint8_t> widen_bf16_to_f32(const std::vector<uint8_t>& bf16) {
  std::vector<uint8_t> out(bf16.size() * 2);
  for (size_t i = 0; i < bf16.size() / 2; ++i) {
    uint16_t h;
    std::memcpy(&h, bf16.data() + 2 * i, 2);
    const float f = bf16_to_f32(h);
    std::memcpy(out.data() + 4 * i, &f, 4);
  }
  return out;
}

std::string module_of(const std::string& name) {
  constexpr std::string_view kSuffix = ".weight";
  return name.ends_with(kSuffix) ? name.substr(0, name.size() - kSuffix.size()) : name;
}

}  // namespace

static Result<LoadedModel> load_unescaped(const std::string& dir, const LoadOptions& options) {
  // Safetensors validation, config.json, the architecture, scheme detection and the Qwen3 tensor plan.
  // note: bytes are not checked there (check_bytes = false) but here, tensor by tensor as each is read, so
  // the checkpoint is read once.
  auto ckpt = open_model_checkpoint(dir, /*check_bytes=*/false);
  if (!ckpt) return tl::unexpected(ckpt.error());
  const Scheme* scheme = &ckpt->scheme;
  if (options.quantization) {
    const Format q = *options.quantization;
    if (q != Format::kMXFP8 && q != Format::kMXFP4 && q != Format::kFP8_B128)
      return fail("--quantization {}: expected mxfp8, mxfp4 or fp8-b128", traits(q).name);
    if (scheme->kind != SchemeKind::kNone)
      return fail("{}: --quantization {} on a checkpoint already quantized as {}", dir, traits(q).name,
                  scheme_name(scheme->kind));
  }

  // note: weights are added in spec order (the tensor plan), each through apply_tensor, the store's only
  // writer; plain tensors keep their checkpoint dtype (BF16/F16/F32) and are decoded per row by the ops.
  LoadedModel m{dir, ckpt->config, scheme->kind, scheme->format, scheme->activations, ckpt->specs, {}};
  if (options.target.memory) {
    auto memory = options.target.memory();
    if (!memory) return fail_in(dir, memory.error());
    m.store = WeightStore(std::move(*memory));
  }
  // Every tensor's final format and native layout, decided (and refused) before the first byte is read.
  std::map<std::string, std::optional<Layout>> layouts;
  if (options.target.layout)
    for (const WeightSpec& spec : m.specs) {
      auto lin = spec.linear ? scheme->linears.find(module_of(spec.name)) : scheme->linears.end();
      Format f;
      if (lin != scheme->linears.end()) {
        f = lin->second.format;
      } else {
        auto plain = plain_format(ckpt->files.find(spec.name)->dtype, spec.name);
        if (!plain) return fail_in(dir, plain.error());
        f = spec.linear && options.quantization ? *options.quantization : *plain;
      }
      auto l = options.target.layout(spec.name, f, spec.shape);
      if (!l) return fail_in(dir, l.error());
      layouts[spec.name] = std::move(*l);
    }
  // note: add() in the target's layout when it chose one (identity otherwise).
  auto add = [&](const WeightSpec& spec, Format f) -> Status {
    auto it = layouts.find(spec.name);
    if (it != layouts.end() && it->second) return m.store.add(spec.name, f, spec.shape, *it->second);
    return m.store.add(spec.name, f, spec.shape);
  };
  int64_t done = 0;
  const int64_t total = static_cast<int64_t>(m.specs.size());
  for (const WeightSpec& spec : m.specs) {
    if (options.progress && !options.progress({"load", spec.name, done, total}))
      return fail("{}: loading cancelled", dir);
    auto lin = spec.linear ? scheme->linears.find(module_of(spec.name)) : scheme->linears.end();
    if (lin != scheme->linears.end()) {
      // A projection stored quantized: canonical planes straight from the checkpoint.
      const QuantizedLinear& ql = lin->second;
      auto values = read_checked(ckpt->files, *scheme, ql.values);
      if (!values) return fail_in(dir, values.error());
      auto scales = read_checked(ckpt->files, *scheme, ql.scales);
      if (!scales) return fail_in(dir, scales.error());
      if (ql.format == Format::kFP8_B128 && ckpt->files.find(ql.scales)->dtype == Dtype::kBF16)
        *scales = widen_bf16_to_f32(*scales);
      if (auto st = add(spec, ql.format); !st) return fail_in(dir, st.error());
      if (auto st = m.store.apply_tensor(spec.name, *values, *scales); !st) return fail_in(dir, st.error());
    } else {
      auto bytes = read_checked(ckpt->files, *scheme, spec.name);
      if (!bytes) return fail_in(dir, bytes.error());
      auto fmt = plain_format(ckpt->files.find(spec.name)->dtype, spec.name);
      if (!fmt) return fail_in(dir, fmt.error());
      if (spec.linear && options.quantization) {
        // note: the quantizer `mxq quantize` runs, with its default scale rule: bytes equal its output.
        const Format q = *options.quantization;
        auto planes = quantize_tensor(q, default_scale_rule(q), *fmt, *bytes, spec.shape, spec.name,
                                      options.threads > 0 ? options.threads : default_threads());
        if (!planes) return fail_in(dir, planes.error());
        m.linear_format = *options.quantization;
        if (auto st = add(spec, m.linear_format); !st) return fail_in(dir, st.error());
        if (auto st = m.store.apply_tensor(spec.name, planes->values, planes->scales); !st)
          return fail_in(dir, st.error());
        ++done;
        continue;
      }
      if (spec.linear) m.linear_format = *fmt;
      if (auto st = add(spec, *fmt); !st) return fail_in(dir, st.error());
      if (auto st = m.store.apply_tensor(spec.name, *bytes, {}); !st) return fail_in(dir, st.error());
    }
    ++done;
  }
  if (options.progress) options.progress({"load", "", done, total});
  return m;
}

// note: as open_model_checkpoint, the messages pass one_line (tensor names are untrusted).
Result<LoadedModel> load_model(const std::string& dir, const LoadOptions& options) {
  auto m = load_unescaped(dir, options);
  if (!m) return tl::unexpected(one_line(m.error()));
  return m;
}

}  // namespace mxq
