#include "model/open_checkpoint.h"

#include <filesystem>

#include "base/one_line.h"
#include "base/regular_file.h"

namespace mxq {
namespace {

// note: config.json is a few KB; 16 MiB (io/config's cap) bounds a hostile one.
Result<nlohmann::json> read_json_file(const std::filesystem::path& path) {
  auto text = read_regular_file(path.string(), uint64_t{16} << 20);
  if (!text) return tl::unexpected(text.error());
  if (!*text) return fail("{}: missing", path.string());
  return parse_json_text(**text, path.string());
}

}  // namespace

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

Result<std::vector<uint8_t>> read_tensor(const Checkpoint& ckpt, std::string_view name) {
  const TensorEntry* e = ckpt.find(name);
  if (!e) return fail("{}: no tensor '{}'", ckpt.dir(), name);
  std::vector<uint8_t> out(e->nbytes());
  if (auto st = ckpt.read(name, out); !st) return tl::unexpected(st.error());
  return out;
}

std::string shard_of(const Checkpoint& ckpt, std::string_view name) {
  const SafetensorsFile* f = ckpt.file_of(name);
  return f ? std::filesystem::path(f->path()).filename().string() : std::string();
}

namespace {

Result<ModelCheckpoint> open_unescaped(const std::string& dir, bool check_bytes, const ProgressFn& progress) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return fail("{}: not a directory", dir);

  auto config_json = read_json_file(fs::path(dir) / "config.json");
  if (!config_json) return tl::unexpected(config_json.error());
  auto config = read_config(dir);
  if (!config) return tl::unexpected(config.error());
  if (auto st = check_architecture(*config); !st) return fail_in((fs::path(dir) / "config.json").string(), st.error());

  auto files = Checkpoint::open(dir);
  if (!files) return tl::unexpected(files.error());

  auto hf_quant = read_hf_quant_config(dir);
  if (!hf_quant) return tl::unexpected(hf_quant.error());
  const TensorMetaMap meta = files->meta();
  auto scheme = detect_scheme(config->quantization_config, *hf_quant ? &**hf_quant : nullptr, meta);
  if (!scheme) return fail_in(dir, scheme.error());
  auto specs = check_qwen3_tensors(*config, *scheme, meta);
  if (!specs) return fail_in(dir, specs.error());

  if (check_bytes) {
    std::vector<uint8_t> buf;
    int64_t done = 0;
    for (const auto& [name, m] : meta) {
      if (progress && !progress({"check", name, done, static_cast<int64_t>(meta.size())}))
        return fail("{}: cancelled", dir);
      auto bytes = read_tensor(*files, name);
      if (!bytes) return tl::unexpected(bytes.error());
      if (auto st = check_tensor_bytes(*scheme, name, *bytes); !st) return fail_in(dir, st.error());
      ++done;
    }
  }
  return ModelCheckpoint{dir, std::move(*files), std::move(*config_json), std::move(*config),
                         std::move(*scheme), std::move(*specs)};
}

}  // namespace

// note: tensor names and config strings reach these messages from many sites; one_line escapes what any of
// them let through (issue 22: a header name holding "\n" or ESC made a multi-line, terminal-driving error).
Result<ModelCheckpoint> open_model_checkpoint(const std::string& dir, bool check_bytes,
                                              const ProgressFn& progress) {
  auto m = open_unescaped(dir, check_bytes, progress);
  if (!m) return tl::unexpected(one_line(m.error()));
  return m;
}

}  // namespace mxq
