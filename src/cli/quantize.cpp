// mxq quantize --to mxfp8|mxfp4|fp8-b128 [--rule R] IN_DIR OUT_DIR
// Reads a bf16/f16/f32 HF checkpoint, quantizes every linear projection of the decoder layers (attention
// q/k/v/o, MLP gate/up/down, every MoE expert) and writes a checkpoint the ecosystem loads:
//   mxfp8    ModelOpt:            <m>.weight F8_E4M3 [N,K] + <m>.weight_scale U8 [N,K/32], hf_quant_config.json
//   mxfp4    compressed-tensors:  <m>.weight_packed U8 [N,K/2] + <m>.weight_scale U8 [N,K/32]
//   fp8-b128 quant_method fp8:    <m>.weight F8_E4M3 [N,K] + <m>.weight_scale_inv F32 [N/128,K/128]
// Everything else keeps its bytes and is listed as ignored. Output shards mirror the input shards; the output is
// built in a temporary sibling directory and renamed into place, so a failure leaves nothing behind.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "cli/commands.h"
#include "cli/progress_bar.h"
#include "format/quantize_parallel.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/open_checkpoint.h"

namespace mxq::cli {
namespace {
namespace fs = std::filesystem;

struct Options {
  std::string to, rule, in, out;
  int threads = 0;
};

Result<SchemeKind> scheme_for(Format f) {
  switch (f) {
    case Format::kMXFP8: return SchemeKind::kModelOptMxfp8;
    case Format::kMXFP4: return SchemeKind::kCtMxfp4;
    case Format::kFP8_B128: return SchemeKind::kFp8Block128;
    default: return fail("--to {}: expected mxfp8, mxfp4 or fp8-b128", traits(f).name);
  }
}

Result<Format> source_format(const std::string& dtype, const std::string& name) {
  if (dtype == "BF16") return Format::kBF16;
  if (dtype == "F16") return Format::kF16;
  if (dtype == "F32") return Format::kF32;
  return fail("{}: dtype {} cannot be quantized, expected BF16, F16 or F32", name, dtype);
}

Status write_json(const fs::path& path, const nlohmann::json& j) {
  std::ofstream f(path, std::ios::binary);
  f << j.dump(2) << "\n";
  if (!f) return fail("{}: write failed", path.string());
  return {};
}

// Quantizes `m` into `tmp`. Returns the number of tensors quantized.
Result<int> quantize_into(const ModelCheckpoint& m, Format fmt, ScaleRule rule, SchemeKind kind,
                          const fs::path& tmp, int threads) {
  std::set<std::string> linear;
  std::vector<std::string> ignored;
  for (const WeightSpec& w : m.specs) {
    if (w.linear) linear.insert(w.name);
    else ignored.push_back(w.name.ends_with(".weight") ? w.name.substr(0, w.name.size() - 7) : w.name);
  }
  std::sort(ignored.begin(), ignored.end());
  ignored.erase(std::unique(ignored.begin(), ignored.end()), ignored.end());

  // Group tensors by the file that holds them so each output shard mirrors one input shard.
  const TensorMetaMap metas = m.files.meta();  // note: meta() builds the map; keep one copy
  std::map<std::string, std::vector<std::string>> by_file;
  for (const auto& [name, meta] : metas) by_file[shard_of(m.files, name)].push_back(name);

  ProgressBar bar("quantize");
  const ProgressFn progress = bar.fn();
  const int64_t total = static_cast<int64_t>(metas.size());
  int64_t done = 0;
  int quantized = 0;
  std::map<std::string, std::string> weight_map;  // output tensor -> shard file
  for (const auto& [file, names] : by_file) {
    // note: owned buffers live until the shard is written; peak memory is one shard in and out.
    std::vector<std::vector<uint8_t>> keep;
    std::vector<TensorToWrite> out;
    for (const std::string& name : names) {
      progress({"quantize", name, done++, total});
      const TensorMeta& meta = metas.at(name);
      auto bytes = read_tensor(m.files, name);
      if (!bytes) return tl::unexpected(bytes.error());
      auto dtype = parse_dtype(meta.dtype);
      if (!dtype) return tl::unexpected(dtype.error());
      if (!linear.count(name)) {
        keep.push_back(std::move(*bytes));
        out.push_back({name, *dtype, meta.shape, keep.back()});
        continue;
      }
      auto src = source_format(meta.dtype, name);
      if (!src) return tl::unexpected(src.error());
      auto q = quantize_tensor(fmt, rule, *src, *bytes, meta.shape, name, threads);
      if (!q) return tl::unexpected(q.error());
      const std::string module = name.ends_with(".weight") ? name.substr(0, name.size() - 7) : name;
      keep.push_back(std::move(q->values));
      out.push_back({values_tensor_name(kind, module), fmt == Format::kMXFP4 ? Dtype::kU8 : Dtype::kF8_E4M3,
                     q->values_shape, keep.back()});
      keep.push_back(std::move(q->scales));
      out.push_back({scales_tensor_name(kind, module), fmt == Format::kFP8_B128 ? Dtype::kF32 : Dtype::kU8,
                     q->scales_shape, keep.back()});
      ++quantized;
    }
    for (const TensorToWrite& t : out) weight_map[t.name] = file;
    if (auto st = write_safetensors((tmp / file).string(), out, {{"format", "pt"}}); !st)
      return tl::unexpected(st.error());
  }
  progress({"quantize", "", total, total});

  nlohmann::json config = m.config_json;
  config["quantization_config"] = make_quantization_config(kind, ignored);
  if (auto st = write_json(tmp / "config.json", config); !st) return tl::unexpected(st.error());
  if (auto hq = make_hf_quant_config(kind, ignored))
    if (auto st = write_json(tmp / "hf_quant_config.json", *hq); !st) return tl::unexpected(st.error());
  if (by_file.size() > 1 || fs::exists(fs::path(m.dir) / "model.safetensors.index.json")) {
    // note: total_size is the tensors' bytes (transformers' save_pretrained), not the files' (headers included).
    int64_t size = 0;
    for (const auto& [file, names] : by_file) {
      auto f = SafetensorsFile::open((tmp / file).string());
      if (!f) return tl::unexpected(f.error());
      for (const TensorEntry& t : f->tensors()) size += static_cast<int64_t>(t.nbytes());
    }
    nlohmann::json index = {{"metadata", {{"total_size", size}}}, {"weight_map", weight_map}};
    if (auto st = write_json(tmp / "model.safetensors.index.json", index); !st) return tl::unexpected(st.error());
  }
  // Side files (tokenizer, generation config, ...) are copied as they are.
  for (const auto& e : fs::directory_iterator(m.dir)) {
    const std::string f = e.path().filename().string();
    if (!e.is_regular_file() || f.ends_with(".safetensors") || f == "config.json" ||
        f == "model.safetensors.index.json" || f == "hf_quant_config.json")
      continue;
    std::error_code ec;
    fs::copy_file(e.path(), tmp / f, ec);
    if (ec) return fail("{}: copy failed: {}", e.path().string(), ec.message());
  }
  return quantized;
}

int run_quantize(const Options& o) {
  auto bad = [](const std::string& msg) {
    fmt::print(stderr, "mxq quantize: {}\n", msg);
    return kExitBadInput;
  };
  // note: parse_format's own message lists every format, the plain ones too; --to takes the quantized ones.
  auto fmt = parse_format(o.to);
  if (!fmt) return bad(fmt::format("--to {}: expected mxfp8, mxfp4 or fp8-b128", o.to));
  auto kind = scheme_for(*fmt);
  if (!kind) return bad(kind.error().message);
  ScaleRule rule = default_scale_rule(*fmt);
  if (!o.rule.empty()) {
    auto r = parse_scale_rule(o.rule);
    if (!r) return bad(r.error().message);
    if (*fmt != Format::kMXFP8 && *r != rule)
      return bad(fmt::format("--rule {}: only MXFP8 has alternative scale rules ({} uses {})", o.rule, o.to,
                             scale_rule_name(rule)));
    rule = *r;
  }
  std::error_code ec;
  if (fs::exists(o.out, ec)) return bad(fmt::format("{}: output directory exists", o.out));

  auto m = open_model_checkpoint(o.in, /*check_bytes=*/false);
  if (!m) return bad(m.error().message);
  if (m->scheme.kind != SchemeKind::kNone)
    return bad(fmt::format("{}: already quantized (scheme {}); mxq quantize takes a bf16/f16/f32 checkpoint", o.in,
                           scheme_name(m->scheme.kind)));

  const fs::path out = fs::absolute(o.out);
  const fs::path tmp = out.parent_path() / fmt::format(".{}.partial-{}", out.filename().string(), getpid());
  fs::create_directories(tmp, ec);
  if (ec) return bad(fmt::format("{}: cannot create: {}", tmp.string(), ec.message()));
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto t0 = std::chrono::steady_clock::now();
  auto n = quantize_into(*m, *fmt, rule, *kind, tmp, threads);
  if (n) fs::rename(tmp, out, ec);
  if (!n || ec) {
    fs::remove_all(tmp, ec);
    return bad(n ? fmt::format("{}: rename failed", out.string()) : n.error().message);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("quantized {} tensors to {} (rule {}) in {:.2f} s -> {}", *n, o.to,
               *fmt == Format::kFP8_B128 ? "deepseek" : scale_rule_name(rule), s, o.out);
  return 0;
}

}  // namespace

void add_quantize(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("quantize", "Quantize a bf16/f16/f32 checkpoint to MXFP8, MXFP4 or FP8-B128");
  auto o = std::make_shared<Options>();
  cmd->add_option("--to", o->to, "Target format: mxfp8, mxfp4 or fp8-b128")->required();
  cmd->add_option("--rule", o->rule, "MXFP8 scale rule: ceil (default), ocp, floor, ct");
  cmd->add_option("--threads", o->threads, "Worker threads (default: all cores)");
  cmd->add_option("in_dir", o->in, "Input checkpoint directory")->required();
  cmd->add_option("out_dir", o->out, "Output directory (must not exist)")->required();
  cmd->callback([o, &exit_code] { exit_code = run_quantize(*o); });
}

}  // namespace mxq::cli
