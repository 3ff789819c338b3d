// mxq inspect DIR [--json]: architecture, scheme, every tensor (name, dtype, shape, format, bytes), totals.
// It opens the checkpoint exactly as loading does (open_model_checkpoint, bytes checked), so it refuses what
// loading refuses, with the same message.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "model/open_checkpoint.h"

namespace mxq::cli {
namespace {

struct Row {
  std::string name, dtype, format, file;
  std::vector<int64_t> shape;
  int64_t bytes;
};

// What a tensor is under the scheme: "mxfp8 values", "mxfp8 scales", or its plain dtype.
std::map<std::string, std::string> tensor_formats(const ModelCheckpoint& m) {
  std::map<std::string, std::string> out;
  for (const auto& [module, ql] : m.scheme.linears) {
    out[ql.values] = fmt::format("{} values", traits(ql.format).name);
    out[ql.scales] = fmt::format("{} scales", traits(ql.format).name);
  }
  return out;
}

// The activation mode `generate` / `serve` run by default (--activation-quant auto), in words.
std::string activation_mode(const Scheme& s) {
  switch (s.activations) {
    case Format::kMXFP8:
      return "mxfp8 per 1x32, dynamic (W8A8, declared by quantization_config; --activation-quant none for "
             "weight-only)";
    case Format::kFP8_B128:
      return "fp8 per 1x128, dynamic (declared by quantization_config)";
    default:
      return "none (weight-only; --activation-quant mxfp8 for W8A8 on MX projections)";
  }
}

int run_inspect(const std::string& dir, bool json) {
  auto m = open_model_checkpoint(dir, /*check_bytes=*/true);
  if (!m) {
    fmt::print(stderr, "mxq inspect: {}\n", m.error().message);
    return kExitBadInput;
  }
  const auto formats = tensor_formats(*m);
  std::vector<Row> rows;
  int64_t total = 0;
  std::map<std::string, int64_t> by_format;
  const TensorMetaMap metas = m->files.meta();
  for (const auto& [name, meta] : metas) {
    auto f = formats.find(name);
    std::string fmt_name = f != formats.end() ? f->second : fmt::format("{}", meta.dtype);
    const int64_t bytes = static_cast<int64_t>(m->files.find(name)->nbytes());
    rows.push_back({name, meta.dtype, fmt_name, shard_of(m->files, name), meta.shape, bytes});
    total += bytes;
    by_format[fmt_name] += bytes;
  }
  const ModelConfig& c = m->config;
  const std::string format = m->scheme.kind == SchemeKind::kNone ? std::string(traits(m->scheme.format).name)
                                                                 : std::string(traits(m->scheme.format).name);
  if (json) {
    nlohmann::ordered_json j;
    j["path"] = dir;
    j["architecture"] = c.architecture;
    j["scheme"] = scheme_name(m->scheme.kind);
    j["format"] = format;
    j["activations"] = m->scheme.activations == Format::kBF16 ? std::string("none")
                                                            : std::string(traits(m->scheme.activations).name);
    j["ignored"] = m->scheme.ignored;
    j["config"] = {{"hidden_size", c.hidden_size},          {"num_hidden_layers", c.num_hidden_layers},
                   {"num_attention_heads", c.num_attention_heads}, {"num_key_value_heads", c.num_key_value_heads},
                   {"head_dim", c.head_dim},                {"intermediate_size", c.intermediate_size},
                   {"vocab_size", c.vocab_size},            {"num_experts", c.num_experts},
                   {"num_experts_per_tok", c.num_experts_per_tok}};
    auto& ts = j["tensors"] = nlohmann::ordered_json::array();
    for (const Row& r : rows)
      ts.push_back({{"name", r.name}, {"dtype", r.dtype}, {"shape", r.shape}, {"format", r.format},
                    {"bytes", r.bytes}, {"file", r.file}});
    j["totals"] = {{"tensors", rows.size()}, {"bytes", total}, {"by_format", by_format}};
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("{}\n", dir);
  fmt::print("  architecture  {} (layers {}, hidden {}, heads {}/{} x {}, vocab {}", c.architecture,
             c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
             c.vocab_size);
  if (c.num_experts > 0) fmt::print(", experts {} top-{}", c.num_experts, c.num_experts_per_tok);
  fmt::print(")\n  scheme        {} (format {})\n", scheme_name(m->scheme.kind), format);
  fmt::print("  activations   {}\n", activation_mode(m->scheme));
  if (!m->scheme.ignored.empty()) fmt::print("  ignored       {}\n", fmt::join(m->scheme.ignored, ", "));
  size_t w = 4;
  for (const Row& r : rows) w = std::max(w, r.name.size());
  fmt::print("\n  {:<{}}  {:<8} {:<18} {:<14} {:>12}\n", "name", w, "dtype", "shape", "format", "bytes");
  for (const Row& r : rows)
    fmt::print("  {:<{}}  {:<8} {:<18} {:<14} {:>12}\n", r.name, w, r.dtype, fmt::format("[{}]", fmt::join(r.shape, ", ")),
               r.format, r.bytes);
  fmt::print("\n  total: {} tensors, {} bytes ({:.2f} MiB)\n", rows.size(), total, static_cast<double>(total) / (1 << 20));
  for (const auto& [f, b] : by_format) fmt::print("    {:<14} {:>12} bytes\n", f, b);
  return 0;
}

}  // namespace

void add_inspect(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("inspect", "Show a checkpoint's architecture, scheme and tensors (validated as at load)");
  auto dir = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("dir", *dir, "Hugging Face checkpoint directory")->required();
  cmd->add_flag("--json", *json, "Print one JSON object");
  cmd->callback([dir, json, &exit_code] { exit_code = run_inspect(*dir, *json); });
}

}  // namespace mxq::cli
