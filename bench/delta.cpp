// mxq-bench delta: the refit delta's index encodings (docs/refit-format.md) on one MXFP8 values plane —
// sizes of every encoding, raw and zstd, and encode / decode throughput by changed fraction, random or in
// runs; the delta is applied back and checked against the new plane on every repetition.
#include <fmt/format.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "cli/commands.h"
#include "refit/delta_encoder.h"
#include "refit/delta_format.h"
#include "refit/index_codec.h"

namespace mxq::cli {
namespace {

using refit::Delta;
using refit::IndexEncoding;
using refit::TensorDelta;

// An E4M3 plane (no NaN codes) and a copy with `fraction` of its bytes changed, either independently at
// random or in runs of 16 (a changed row segment of half an MX block).
std::pair<std::vector<uint8_t>, std::vector<uint8_t>> bench_planes(int64_t n, double fraction, bool clustered,
                                                                   uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> old_plane(static_cast<size_t>(n));
  for (auto& b : old_plane) b = static_cast<uint8_t>(rng() % 0x7F);
  auto new_plane = old_plane;
  // note: run length 16; the start probability is fraction / 16 so the changed fraction stays `fraction`.
  const int run = clustered ? 16 : 1;
  std::bernoulli_distribution start(fraction / run);
  for (int64_t i = 0; i < n; ++i)
    if (start(rng))
      for (int64_t k = i; k < std::min(n, i + run); ++k)
        new_plane[static_cast<size_t>(k)] =
            static_cast<uint8_t>((old_plane[static_cast<size_t>(k)] + 1) % 0x7F);
  return {std::move(old_plane), std::move(new_plane)};
}

size_t zstd_size(const std::vector<uint8_t>& bytes) {
  std::vector<uint8_t> dst(ZSTD_compressBound(bytes.size()));
  return ZSTD_compress(dst.data(), dst.size(), bytes.data(), bytes.size(), 3);
}

// note: thread CPU time, not wall time: on the shared 2-core development machine wall time mostly measures
// the other tenants; one thread does all the work here, so its CPU time is the cost.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

int bench(int64_t n) {
  // note: [n/256, 256] MXFP8 values; its n/32 scale bytes stay unchanged so the plane under test is the
  // values.
  const std::vector<int64_t> shape = {n / 256, 256};
  std::vector<uint8_t> scales(static_cast<size_t>(n / 32), 127);
  fmt::print("mxq-bench delta: MXFP8 values plane of {} bytes, zstd level 3, 1 thread, CPU time\n", n);
  {
    auto [plane, unused] = bench_planes(n, 0, false, 1);
    std::vector<uint8_t> copy(plane.size());
    const double t0 = cpu_seconds();
    std::memcpy(copy.data(), plane.data(), plane.size());
    fmt::print("memcpy ceiling: {:.2f} GB/s (first touch of the destination included, as in decode)\n\n",
               static_cast<double>(n) / 1e9 / (cpu_seconds() - t0));
  }
  fmt::print(
      "| pattern | changed | changed bytes | gaps raw / zstd | bitmap raw / zstd | runs raw / zstd | chosen "
      "| file bytes "
      "| % of plane | encode GB/s | decode GB/s |\n|{}\n",
      "---|---|---|---|---|---|---|---|---|---|---|");
  for (bool clustered : {false, true})
    for (double fraction : {0.001, 0.01, 0.05, 0.20}) {
      auto [old_plane, new_plane] = bench_planes(n, fraction, clustered, 42);
      refit::CanonicalPlanes op{old_plane, scales}, np{new_plane, scales};
      // note: best of 3 runs: the development machine is shared, and the minimum is the least disturbed.
      double encode_s = 1e30, decode_s = 1e30;
      Result<TensorDelta> t = fail("not run");
      Result<std::vector<uint8_t>> file = fail("not run");
      for (int rep = 0; rep < 3; ++rep) {
        const double t0 = cpu_seconds();
        t = refit::diff_tensor("bench", Format::kMXFP8, shape, &op, np);
        file = t ? refit::write_delta(Delta{1, 2, {*t}}) : tl::unexpected(t.error());
        encode_s = std::min(encode_s, cpu_seconds() - t0);
        if (!file) {
          fmt::print(stderr, "mxq-bench delta: {}\n", file.error().message);
          return 1;
        }
        const double t1 = cpu_seconds();
        auto back = refit::read_delta(*file);
        std::vector<uint8_t> applied = old_plane;
        if (back && !back->tensors[0].anchor)
          for (size_t k = 0; k < back->tensors[0].values.indices.size(); ++k)
            applied[static_cast<size_t>(back->tensors[0].values.indices[k])] =
                back->tensors[0].values.bytes[k];
        decode_s = std::min(decode_s, cpu_seconds() - t1);
        if (!back || applied != new_plane) {
          fmt::print(stderr, "mxq-bench delta: the delta does not reproduce the new plane\n");
          return 1;
        }
      }
      const auto& idx = t->values.indices;
      std::string sizes;
      for (int e = 0; e < refit::kIndexEncodingCount; ++e) {
        std::vector<uint8_t> payload;
        refit::encode_indices(static_cast<IndexEncoding>(e), idx, n, payload);
        const size_t raw = payload.size();
        payload.insert(payload.end(), t->values.bytes.begin(), t->values.bytes.end());
        sizes += fmt::format(" {} / {} |", raw, zstd_size(payload));
      }
      fmt::print("| {} | {:.1f}% | {} |{} {} | {} | {:.2f} | {:.2f} | {:.2f} |\n",
                 clustered ? "runs of 16" : "random", fraction * 100, idx.size(), sizes,
                 t->anchor ? "anchor" : refit::encoding_name(refit::choose_encoding(idx, n)), file->size(),
                 100.0 * static_cast<double>(file->size()) / static_cast<double>(n),
                 static_cast<double>(n) / 1e9 / encode_s, static_cast<double>(n) / 1e9 / decode_s);
    }
  fmt::print(
      "\nraw / zstd: index bytes alone / zstd of index bytes + new bytes. GB/s: plane bytes per thread-CPU "
      "second; "
      "encode = diff + index + body + zstd, decode = unzstd + parse + scatter.\n");
  return 0;
}

}  // namespace

void add_bench_delta(CLI::App& app, int& exit_code) {
  auto bytes = std::make_shared<int64_t>(int64_t{64} << 20);
  auto* cmd = app.add_subcommand("delta", "refit delta index encodings: sizes and encode/decode throughput by "
                                          "changed fraction");
  cmd->add_option("--bytes", *bytes, "plane bytes (a multiple of 256)")
      ->check(CLI::Range(int64_t{256}, int64_t{1} << 34));
  cmd->callback([&exit_code, bytes] {
    if (*bytes % 256) {
      fmt::print(stderr, "mxq-bench delta: --bytes {}: expected a multiple of 256\n", *bytes);
      exit_code = kExitBadInput;
      return;
    }
    exit_code = bench(*bytes);
  });
}

}  // namespace mxq::cli
