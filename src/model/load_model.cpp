#include "model/load_model.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "format/codec.h"
#include "format/quantize.h"
#include "io/checkpoint.h"

namespace mxq {
namespace {

bool is_supported_architecture(std::string_view arch) {
  return arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM";
}

Result<Format> plain_format(Dtype d, std::string_view name) {
  switch (d) {
    case Dtype::kBF16:
      return Format::kBF16;
    case Dtype::kF16:
      return Format::kF16;
    case Dtype::kF32:
      return Format::kF32;
    default:
      return fail("{}: dtype {}, expected BF16, F16 or F32", name, dtype_name(d));
  }
}

// Copies a tensor out of the mapping (the guarded path, L-19) and applies the scheme's byte policy (Q-07,
// Q-08) before anything reaches the store: a refused byte never becomes a live weight.
Result<std::vector<uint8_t>> read_tensor(const Checkpoint& ckpt, const Scheme& scheme,
                                         const std::string& name) {
  const TensorEntry* e = ckpt.find(name);
  if (!e) return fail("missing tensor '{}'", name);
  std::vector<uint8_t> bytes(e->nbytes());
  if (auto st = ckpt.read(name, bytes); !st) return tl::unexpected(st.error());
  if (auto st = check_tensor_bytes(scheme, name, bytes); !st) return tl::unexpected(st.error());
  return bytes;
}

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

struct Planes {
  std::vector<uint8_t> values, scales;
};

// Online quantization with the quantizer `mxq quantize` uses (format/quantize.h, default scale rule), one
// matrix per leading index of a stacked [E, N, K] tensor so no block straddles two experts.
// note: quantize() is row-local for MX and 128-row-stripe-local for FP8-B128, so one call per matrix gives
// the same bytes as the row-split multi-threaded driver.
Result<Planes> quantize_planes(Format fmt, Format src, const std::vector<uint8_t>& x,
                               const std::vector<int64_t>& shape, const std::string& name) {
  const int64_t rows = shape[shape.size() - 2], cols = shape.back();
  const int64_t batch = shape.size() == 3 ? shape[0] : 1;
  const int64_t vb = values_bytes(fmt, rows, cols), sb = scales_bytes(fmt, rows, cols);
  const int64_t in_bytes = rows * cols * traits(src).element_bits / 8;
  Planes p{std::vector<uint8_t>(static_cast<size_t>(batch * vb)),
           std::vector<uint8_t>(static_cast<size_t>(batch * sb))};
  for (int64_t e = 0; e < batch; ++e)
    if (auto st = quantize(fmt, default_scale_rule(fmt), src, x.data() + e * in_bytes, rows, cols,
                           p.values.data() + e * vb, p.scales.data() + e * sb, name);
        !st)
      return tl::unexpected(st.error());
  return p;
}

std::string module_of(const std::string& name) {
  constexpr std::string_view kSuffix = ".weight";
  return name.ends_with(kSuffix) ? name.substr(0, name.size() - kSuffix.size()) : name;
}

Result<nlohmann::json> read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail("{}: cannot open", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_json_text(ss.str(), path.string());
}

}  // namespace

Result<LoadedModel> load_model(const std::string& dir, const LoadOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return fail("{}: not a model directory", dir);
  auto config = read_config(dir);
  if (!config) return tl::unexpected(config.error());
  if (!is_supported_architecture(config->architecture))
    return fail(
        "{}/config.json: architecture '{}' is not supported (expected Qwen3ForCausalLM or "
        "Qwen3MoeForCausalLM)",
        dir, config->architecture);
  auto ckpt = Checkpoint::open(dir);
  if (!ckpt) return tl::unexpected(ckpt.error());
  std::optional<nlohmann::json> hf_quant;
  // ModelOpt writes its quantization settings a second time in hf_quant_config.json; detect_scheme checks
  // both.
  if (fs::exists(fs::path(dir) / "hf_quant_config.json", ec)) {
    auto j = read_json_file(fs::path(dir) / "hf_quant_config.json");
    if (!j) return tl::unexpected(j.error());
    hf_quant = std::move(*j);
  }
  const TensorMetaMap meta = ckpt->meta();
  auto scheme = detect_scheme(config->quantization_config, hf_quant ? &*hf_quant : nullptr, meta);
  if (!scheme) return fail_in(dir, scheme.error());
  auto specs = check_qwen3_tensors(*config, *scheme, meta);
  if (!specs) return fail_in(dir, specs.error());
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
  LoadedModel m{dir, std::move(*config), scheme->kind, scheme->format, std::move(*specs), {}};
  int64_t done = 0;
  const int64_t total = static_cast<int64_t>(m.specs.size());
  for (const WeightSpec& spec : m.specs) {
    if (options.progress && !options.progress({"load", spec.name, done, total}))
      return fail("{}: loading cancelled", dir);
    auto lin = spec.linear ? scheme->linears.find(module_of(spec.name)) : scheme->linears.end();
    if (lin != scheme->linears.end()) {
      // A projection stored quantized: canonical planes straight from the checkpoint.
      const QuantizedLinear& ql = lin->second;
      auto values = read_tensor(*ckpt, *scheme, ql.values);
      if (!values) return fail_in(dir, values.error());
      auto scales = read_tensor(*ckpt, *scheme, ql.scales);
      if (!scales) return fail_in(dir, scales.error());
      if (ql.format == Format::kFP8_B128 && ckpt->find(ql.scales)->dtype == Dtype::kBF16)
        *scales = widen_bf16_to_f32(*scales);
      if (auto st = m.store.add(spec.name, ql.format, spec.shape); !st) return fail_in(dir, st.error());
      if (auto st = m.store.apply_tensor(spec.name, *values, *scales); !st) return fail_in(dir, st.error());
    } else {
      auto bytes = read_tensor(*ckpt, *scheme, spec.name);
      if (!bytes) return fail_in(dir, bytes.error());
      auto fmt = plain_format(ckpt->find(spec.name)->dtype, spec.name);
      if (!fmt) return fail_in(dir, fmt.error());
      if (spec.linear && options.quantization) {
        auto planes = quantize_planes(*options.quantization, *fmt, *bytes, spec.shape, spec.name);
        if (!planes) return fail_in(dir, planes.error());
        m.linear_format = *options.quantization;
        if (auto st = m.store.add(spec.name, m.linear_format, spec.shape); !st)
          return fail_in(dir, st.error());
        if (auto st = m.store.apply_tensor(spec.name, planes->values, planes->scales); !st)
          return fail_in(dir, st.error());
        ++done;
        continue;
      }
      if (spec.linear) m.linear_format = *fmt;
      if (auto st = m.store.add(spec.name, *fmt, spec.shape); !st) return fail_in(dir, st.error());
      if (auto st = m.store.apply_tensor(spec.name, *bytes, {}); !st) return fail_in(dir, st.error());
    }
    ++done;
  }
  if (options.progress) options.progress({"load", "", done, total});
  return m;
}

}  // namespace mxq
