#include "server/weight_update.h"

#include <spdlog/spdlog.h>

#include <charconv>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>

#include "model/open_checkpoint.h"
#include "refit/applier.h"

namespace mxq::server {
namespace {

using SteadyClock = std::chrono::steady_clock;

double since(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// Bytes of every live tensor's canonical planes: what a full update (every tensor) writes.
uint64_t live_plane_bytes(const WeightStore& store) {
  uint64_t bytes = 0;
  for (const auto& [name, t] : store.tensors())
    if (auto planes = plane_bytes(t.format, t.shape, name))
      bytes += static_cast<uint64_t>(planes->values + planes->scales);
  return bytes;
}

}  // namespace

Result<uint64_t> parse_version(std::string_view field, std::string_view text) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  // note: digits only: from_chars takes no sign or space, and "+1", "1.0", "" or a 21-digit number fail.
  if (text.empty() || ec != std::errc() || ptr != end)
    return fail(
        "{} \"{}\": expected a decimal unsigned integer (weights versions are the delta format's "
        "integers)",
        field, text.substr(0, 64));
  return v;
}

Result<std::vector<uint8_t>> read_update_file(const std::string& path, size_t max_bytes) {
  namespace fs = std::filesystem;
  if (path.empty() || !fs::path(path).is_absolute())
    return fail("path \"{}\": expected an absolute path", path);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return fail("path {}: not a regular file", path);
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return fail("path {}: cannot read its size ({})", path, ec.message());
  if (size > max_bytes)
    return fail("path {}: {} bytes, larger than --max-update-bytes {}", path, size, max_bytes);
  std::ifstream f(path, std::ios::binary);
  if (!f) return fail("path {}: cannot open", path);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  if (!f.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size)))
    return fail("path {}: short read", path);
  return bytes;
}

WeightUpdater::WeightUpdater(WeightStore& store, const LoadOptions& load, size_t max_update_bytes)
    : store_(&store), max_update_bytes_(max_update_bytes), table_(refit::tensor_table(store)) {
  load_.quantization = load.quantization;
  load_.threads = load.threads;
}

UpdateOutcome WeightUpdater::finish(Status applied, uint64_t version, uint64_t bytes, double seconds) const {
  UpdateOutcome o;
  o.version = version;
  o.seconds = seconds;
  if (applied) {
    o.success = true;
    o.applied_bytes = bytes;
    o.message = fmt::format("weights at version {}", version);
    return o;
  }
  o.message = applied.error().message;
  o.lost = !store_->servable();
  return o;
}

UpdateOutcome WeightUpdater::apply_delta_file(std::span<const uint8_t> file, uint64_t& version) {
  const auto start = SteadyClock::now();
  const refit::ReadLimits limits{max_update_bytes_};
  auto size = refit::body_size(file, limits);
  if (!size) return finish(fail_in("delta", size.error()), version, 0, since(start));
  auto raw = refit::raw_body(file, limits, /*check_hash=*/false);
  if (!raw) return finish(fail_in("delta", raw.error()), version, 0, since(start));
  // note: a raw body is read where it lies (the posted bytes), and its hash runs on another thread beside the
  // parse and the applier's checks (validate; on the device path also stage, upload, decode): the applier
  // writes only once it passed (before_write). A zstd body on a device store decompresses into the pinned
  // staging, so it uploads without a copy (as refit::apply_delta_files does), and is hashed there.
  std::vector<uint8_t> pageable;
  std::span<const uint8_t> body;
  std::future<Status> hashed;
  double hash_ms = 0;
  if (*raw) {
    body = **raw;
    hashed = std::async(std::launch::async, [file, body, &hash_ms] {
      const auto t0 = SteadyClock::now();
      Status s = refit::check_body_hash(file, body);
      hash_ms = 1e3 * since(t0);
      return s;
    });
  } else {
    std::span<uint8_t> out;
    if (store_->on_device()) out = store_->memory().host_staging(static_cast<size_t>(*size));
    if (out.size() < *size) pageable.resize(static_cast<size_t>(*size)), out = pageable;
    out = out.first(static_cast<size_t>(*size));
    if (auto s = refit::decompress_body(file, out); !s)
      return finish(fail_in("delta", s.error()), version, 0, since(start));
    body = out;
  }
  std::optional<Status> hash_verdict;
  auto body_hash = [&]() -> Status {
    if (!hash_verdict) hash_verdict = hashed.valid() ? hashed.get() : Status{};
    return *hash_verdict;
  };
  const double decompressed = since(start);
  auto view = refit::parse_delta_view(body);
  // note: a body that fails its hash was damaged on the way: that is the reason given, whatever else fails
  if (!view) {
    Status h = body_hash();
    return finish(fail_in("delta", h ? view.error() : h.error()), version, 0, since(start));
  }
  // note: a delta of no records reaches no write, so no before_write: its hash is awaited here
  if (view->tensors.empty())
    if (Status h = body_hash(); !h) return finish(fail_in("delta", h.error()), version, 0, since(start));
  uint64_t bytes = 0;
  for (const refit::TensorView& t : view->tensors) bytes += t.values.bytes.size() + t.scales.bytes.size();
  const double parsed = since(start);
  refit::ApplyTimings a;
  refit::ApplyOptions options;
  options.timings = &a;
  options.before_write = body_hash;
  Status s = refit::apply_delta(*store_, version, *view, options);
  // note: joined either way (hash_ms is read below); on a failure a damaged body is the reason given
  if (Status h = body_hash(); !s && !h) s = tl::unexpected(h.error());
  UpdateOutcome o = finish(std::move(s), version, bytes, since(start));
  // note: the applier's stages (docs/refit-format.md "Device path"); a host store fills validate, write,
  // checksum. A raw body's hash ran beside parse .. decode ("body hash", last).
  o.stages = {{"decompress", 1e3 * decompressed},
              {"parse", 1e3 * (parsed - decompressed)},
              {"validate", a.validate},
              {"stage", a.stage},
              {"upload", a.upload},
              {"decode", a.decode},
              {"write", a.write},
              {"verify", a.checksum}};
  if (*raw) o.stages.emplace_back("body hash", hash_ms);
  return o;
}

UpdateOutcome WeightUpdater::apply_checkpoint(const std::string& dir, std::optional<uint64_t> new_version,
                                              uint64_t& version) {
  const auto start = SteadyClock::now();
  const uint64_t target = new_version.value_or(version + 1);
  if (target <= version)
    return finish(fail("weight_version {}: must exceed the live version {} (W-12)", target, version), version,
                  0, since(start));
  // note: a plain checkpoint is quantized by the startup rule (same bytes as a load with the same
  // --quantization); a quantized one loads as it is, and a format other than the live one is refused by
  // name (W-08) by the validator below.
  auto ckpt = open_model_checkpoint(dir, /*check_bytes=*/false);
  if (!ckpt) return finish(fail_in("model_path", ckpt.error()), version, 0, since(start));
  // note: the device quantizes with the startup rule, so it takes a checkpoint only where the startup
  // quantized one (or nothing is quantized); a pre-quantized start refuses a plain checkpoint (W-08) as
  // before
  bool quantized_live = false;
  for (const auto& [name, t] : store_->tensors()) quantized_live = quantized_live || is_quantized(t.format);
  if (device_checkpoint_ && (load_.quantization || !quantized_live)) {
    refit::StageTimes times;
    auto done = device_checkpoint_(*store_, version, target, *ckpt, &times);
    // note: device scratch too small for the source, its quantized planes and the undo log (W-26, nothing
    // written): the host path needs less of it
    if (!done && done.error().message.find("(W-26)") == std::string::npos) {
      UpdateOutcome o = finish(fail_in("model_path", done.error()), version, 0, since(start));
      o.stages = std::move(times);
      return o;
    }
    if (done && *done) {
      UpdateOutcome o = finish(Status{}, version, live_plane_bytes(*store_), since(start));
      o.stages = std::move(times);
      return o;
    }
  }
  LoadOptions options;
  options.threads = load_.threads;
  if (ckpt->scheme.kind == SchemeKind::kNone) options.quantization = load_.quantization;
  auto model = load_model(dir, options);
  if (!model) return finish(fail_in("model_path", model.error()), version, 0, since(start));

  refit::Delta delta{version, target, {}};
  uint64_t bytes = 0;
  for (const auto& [name, t] : model->store.tensors()) {
    auto planes = plane_bytes(t.format, t.shape, name);
    if (!planes) return finish(fail_in("model_path", planes.error()), version, 0, since(start));
    refit::TensorDelta& d = delta.tensors.emplace_back();
    d.name = name;
    d.format = t.format;
    d.shape = t.shape;
    d.anchor = true;
    d.checksum = t.checksum;
    d.values.bytes.resize(static_cast<size_t>(planes->values));
    d.scales.bytes.resize(static_cast<size_t>(planes->scales));
    if (auto s = model->store.read_canonical(name, Plane::kValues, d.values.bytes); !s)
      return finish(fail_in("model_path", s.error()), version, 0, since(start));
    if (planes->scales > 0)
      if (auto s = model->store.read_canonical(name, Plane::kScales, d.scales.bytes); !s)
        return finish(fail_in("model_path", s.error()), version, 0, since(start));
    bytes += d.values.bytes.size() + d.scales.bytes.size();
  }
  // note: the loaded copy is freed before the write; the delta's planes and the applier's undo log (the old
  // planes) are each one copy of the model in host memory while the update runs.
  model->store = WeightStore();
  Status s = refit::apply_delta(*store_, version, delta);
  return finish(std::move(s), version, bytes, since(start));
}

UpdateOutcome WeightUpdater::apply_tensor_manifest(const refit::TensorManifest& m,
                                                   std::optional<uint64_t> new_version, uint64_t& version) {
  const auto start = SteadyClock::now();
  if (!device_update_)
    return finish(fail("update_weights_from_tensor: this engine runs on the {} (a CUDA IPC buffer is device "
                       "memory: serve --device cuda)",
                       store_->memory().name() == "host" ? "CPU" : store_->memory().name()),
                  version, 0, since(start));
  const uint64_t target = new_version.value_or(version + 1);
  if (target <= version)
    return finish(fail("weight_version {}: must exceed the live version {} (W-12)", target, version), version,
                  0, since(start));
  const uint64_t bytes = live_plane_bytes(*store_);
  refit::StageTimes times;
  Status s = device_update_(*store_, version, target, m, &times);
  UpdateOutcome o = finish(std::move(s), version, bytes, since(start));
  o.stages = std::move(times);
  return o;
}

std::map<std::string, uint64_t> WeightUpdater::checksums() const {
  std::map<std::string, uint64_t> out;
  for (const auto& [name, t] : store_->tensors()) out.emplace(name, t.checksum);
  return out;
}

}  // namespace mxq::server
