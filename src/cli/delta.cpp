// mxq delta: refit delta files (docs/refit-format.md).
//   make --base DIR --target DIR --quantization Q -o FILE: quantize both checkpoints, diff, write
//   inspect FILE [--json]: per tensor, changed entries per plane and the index encoding
//   recode IN -o OUT: read, check and write again (another zstd level)
// (the index encodings' benchmark is `mxq-bench delta`, bench/delta.cpp)

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "refit/checkpoint_delta.h"
#include "refit/delta_encoder.h"
#include "refit/delta_format.h"
#include "refit/index_codec.h"

namespace mxq::cli {
namespace {

using refit::Plane;
using refit::PlaneDelta;
using refit::TensorDelta;

nlohmann::json plane_json(const TensorDelta& t, Plane plane, const refit::PlaneGeometry& g) {
  const PlaneDelta& p = plane == Plane::kValues ? t.values : t.scales;
  const int64_t changed = t.anchor ? g.entries : static_cast<int64_t>(p.indices.size());
  nlohmann::json j = {{"entries", g.entries}, {"changed", changed}};
  if (!t.anchor) j["encoding"] = refit::encoding_name(refit::choose_encoding(p.indices, g.entries));
  return j;
}

int inspect(const std::string& path, bool json) {
  auto d = refit::read_delta_file(path);
  if (!d) {
    fmt::print(stderr, "mxq delta inspect: {}\n", d.error().message);
    return kExitBadInput;
  }
  nlohmann::json out = {{"base_version", d->base_version}, {"new_version", d->new_version}};
  out["tensors"] = nlohmann::json::array();
  for (const TensorDelta& t : d->tensors) {
    auto g = refit::tensor_geometry(t.format, t.shape, t.name);  // the reader checked it already
    if (auto s = refit::check_tensor_delta(t); !s) {
      fmt::print(stderr, "mxq delta inspect: {}: {}\n", path, s.error().message);
      return kExitBadInput;
    }
    nlohmann::json j = {{"name", t.name},
                        {"format", traits(t.format).name},
                        {"shape", t.shape},
                        {"kind", t.anchor ? "anchor" : "sparse"},
                        {"checksum", fmt::format("{:016x}", t.checksum)},
                        {"values", plane_json(t, Plane::kValues, (*g)[0])}};
    if (is_quantized(t.format)) j["scales"] = plane_json(t, Plane::kScales, (*g)[1]);
    out["tensors"].push_back(std::move(j));
  }
  if (json) {
    fmt::print("{}\n", out.dump());
    return 0;
  }
  fmt::print("delta {} -> {}: {} tensors\n", d->base_version, d->new_version, d->tensors.size());
  for (const auto& j : out["tensors"]) {
    std::string planes;
    for (const char* p : {"values", "scales"})
      if (j.contains(p))
        planes += fmt::format("  {} {}/{} ({:.3f}%){}", p, j[p]["changed"].get<int64_t>(),
                              j[p]["entries"].get<int64_t>(),
                              100.0 * j[p]["changed"].get<double>() / std::max<double>(1, j[p]["entries"]),
                              j[p].contains("encoding") ? " " + j[p]["encoding"].get<std::string>() : "");
    fmt::print("{} {} {} {} xxh3 {}{}\n", j["name"].get<std::string>(), j["format"].get<std::string>(),
               j["shape"].dump(), j["kind"].get<std::string>(), j["checksum"].get<std::string>(), planes);
  }
  return 0;
}

// note: as `mxq quantize`, never over an existing file (issue 22: `delta make -o` overwrote in silence).
bool refuse_existing(const char* cmd, const std::string& out) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(out, ec))) return false;
  fmt::print(stderr, "mxq delta {}: {}: output file exists (remove it first; mxq never overwrites)\n", cmd, out);
  return true;
}

int recode(const std::string& in, const std::string& out, int level) {
  if (refuse_existing("recode", out)) return kExitBadInput;
  auto d = refit::read_delta_file(in);
  if (!d) {
    fmt::print(stderr, "mxq delta recode: {}\n", d.error().message);
    return kExitBadInput;
  }
  if (auto s = refit::write_delta_file(*d, out, level); !s) {
    fmt::print(stderr, "mxq delta recode: {}\n", s.error().message);
    return kExitBadInput;
  }
  return 0;
}

struct MakeOptions {
  std::string base, target, out, quantization = "mxfp8";
  uint64_t base_version = 0, new_version = 1;
  bool anchor = false;
  int level = 3;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
};

double percent(int64_t part, int64_t whole) {
  return 100.0 * static_cast<double>(part) / std::max(1.0, static_cast<double>(whole));
}

int make(const MakeOptions& o) {
  if (refuse_existing("make", o.out)) return kExitBadInput;
  auto q = parse_format(o.quantization);
  if (!q) {
    fmt::print(stderr, "mxq delta make: {}\n", q.error().message);
    return kExitBadInput;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto d = refit::make_checkpoint_delta(o.base, o.target,
                                        {*q, o.base_version, o.new_version, o.anchor, o.threads});
  auto body = d ? refit::encode_delta_body(*d) : tl::unexpected(d.error());
  auto file = body ? refit::wrap_body(*body, o.level) : tl::unexpected(body.error());
  if (!file) {
    fmt::print(stderr, "mxq delta make: {}\n", file.error().message);
    return kExitBadInput;
  }
  std::ofstream f(o.out, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(file->data()), static_cast<std::streamsize>(file->size()));
  if (!f.good()) {
    fmt::print(stderr, "mxq delta make: {}: cannot write {} bytes\n", o.out, file->size());
    return 1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Changed entries per plane kind over the whole model (an anchor counts every entry as changed).
  int64_t entries[2] = {0, 0}, changed[2] = {0, 0}, anchors = 0, plane_bytes = 0, by_encoding[3] = {0, 0, 0};
  for (const TensorDelta& t : d->tensors) {
    auto g = *refit::tensor_geometry(t.format, t.shape, t.name);
    anchors += t.anchor;
    for (int p = 0; p < 2; ++p) {
      const PlaneDelta& pd = p == 0 ? t.values : t.scales;
      entries[p] += g[p].entries;
      plane_bytes += g[p].bytes;
      changed[p] += t.anchor ? g[p].entries : static_cast<int64_t>(pd.indices.size());
      if (!t.anchor && g[p].entries)
        ++by_encoding[static_cast<int>(refit::choose_encoding(pd.indices, g[p].entries))];
    }
  }
  fmt::print("delta {} -> {}: {} tensors ({} anchors), {} canonical plane bytes\n", d->base_version,
             d->new_version, d->tensors.size(), anchors, plane_bytes);
  fmt::print("changed: values {:.4f}% of {} entries, scales {:.4f}% of {} entries\n",
             percent(changed[0], entries[0]), entries[0], percent(changed[1], entries[1]), entries[1]);
  fmt::print("index encodings of the sparse planes: gaps {}, bitmap {}, runs {}\n", by_encoding[0],
             by_encoding[1], by_encoding[2]);
  fmt::print("size: body {} bytes, file {} bytes (zstd {}) = {:.3f}% of the planes; {:.2f} s wall\n",
             body->size(), file->size(), o.level, percent(static_cast<int64_t>(file->size()), plane_bytes),
             secs);
  return 0;
}

}  // namespace

void add_delta(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("delta", "refit delta files: make, inspect, recode");
  cmd->require_subcommand(1);

  auto mk = std::make_shared<MakeOptions>();
  auto* mak = cmd->add_subcommand("make", "quantize two unquantized checkpoints, diff them, write the delta");
  mak->add_option("--base", mk->base, "checkpoint directory of the live (old) master weights")->required();
  mak->add_option("--target", mk->target, "checkpoint directory of the new master weights")->required();
  mak->add_option("--quantization", mk->quantization, "mxfp8, mxfp4 or fp8-b128")->required();
  mak->add_option("-o,--output", mk->out, "delta file")->required();
  mak->add_option("--base-version", mk->base_version, "version the delta applies to (default 0)");
  mak->add_option("--new-version", mk->new_version, "version after the delta (default 1)");
  mak->add_flag("--anchor", mk->anchor, "every tensor in full");
  mak->add_option("--level", mk->level, "zstd level (0: no zstd, the body stored raw)")->check(CLI::Range(0, 22));
  mak->add_option("--threads", mk->threads, "quantization threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
  mak->callback([&exit_code, mk] { exit_code = make(*mk); });

  struct Options {
    std::string in_path, out_path;
    bool json = false;
    int level = 3;
  };
  auto opt = std::make_shared<Options>();  // note: CLI11 writes into it after add_delta returns
  auto* ins = cmd->add_subcommand("inspect", "print what a delta file holds, per tensor and plane");
  ins->add_option("file", opt->in_path, "delta file")->required();
  ins->add_flag("--json", opt->json, "one JSON object on stdout");
  ins->callback([&exit_code, opt] { exit_code = inspect(opt->in_path, opt->json); });

  auto* rec = cmd->add_subcommand("recode", "read a delta, check it, write it again");
  rec->add_option("file", opt->in_path, "delta file")->required();
  rec->add_option("-o,--output", opt->out_path, "output file")->required();
  rec->add_option("--level", opt->level, "zstd level (0: no zstd, the body stored raw)")->check(CLI::Range(0, 22));
  rec->callback([&exit_code, opt] { exit_code = recode(opt->in_path, opt->out_path, opt->level); });
}

}  // namespace mxq::cli
