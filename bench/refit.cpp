// mxq-bench refit: in-place refit of Qwen3-8B-shaped MXFP8 weights (36 layers x q,k,v,o,gate,up,down, GEMV
// native layout) held in a CUDA WeightStore. Rows: full refit from device memory and from pinned host memory
// (WeightStore::apply_tensors: one batched write with fused block sums, 64 KiB tiles staged in shared memory
// by default; the same by warps with the chains overlapped (CudaMemoryOptions::warp_full_write), or with the
// plain kernel (staged_full_write off); or with a re-read of the live planes)
// against a device-to-device copy and the pinned host-to-device copy of the same bytes measured in the same
// run; the write and the checksum alone; sparse refits (refit::apply_delta: host validation on all cores,
// int32 indices + new bytes packed into pinned staging and uploaded once, scatter with undo capture, checksum
// batch) at uniform fractions of both planes, the RL step patterns of docs/refit-format.md section 7 and a
// clustered pattern, with the stage times (ApplyTimings) and the physical bounds; then the same deltas on the
// wire path (refit::apply_delta on a DeltaView parsed from the body: index sets uploaded encoded, decoded and
// checked on the device) from a pinned and from a pageable body, with parse / validate / stage / upload /
// decode / write / checksum times. Times are CUDA-event medians on the store's stream (the host-synchronous
// steps in between show up as wall time). Deltas and their wire bodies are built outside the timing.

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"

#if defined(MXQ_HAVE_CUDA)
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "bench/bench_cuda.h"
#include "bench/cuda/copy_ceiling.h"
#include "cuda/common/check.h"
#include "cuda/linear/gemv_layout.h"
#include "model/weight_memory_cuda.h"
#include "refit/applier.h"
#include "refit/delta_format.h"
#endif

namespace mxq::cli {

#if defined(MXQ_HAVE_CUDA)
namespace {

using cuda::DeviceBuffer;

struct Shape {
  const char* name;
  int64_t n, k;
};
// note: Qwen3-8B: hidden 4096, 32 q heads / 8 kv heads of 128, intermediate 12288, 36 layers.
constexpr Shape kShapes[] = {{"self_attn.q_proj", 4096, 4096}, {"self_attn.k_proj", 1024, 4096},
                             {"self_attn.v_proj", 1024, 4096}, {"self_attn.o_proj", 4096, 4096},
                             {"mlp.gate_proj", 12288, 4096},   {"mlp.up_proj", 12288, 4096},
                             {"mlp.down_proj", 4096, 12288}};

// The GEMV native layout of an MXFP8 [n, k] tensor built from the contract (gemv_layout.h; the GPU tests
// probe it with probe_layout and check it is this permutation): values separable, scales identity.
Layout gemv_layout(int64_t n, int64_t k) {
  Layout l{"cuda_gemv",
           {PlaneKind::kSeparable, {n, k}, n * k, {}, {}},
           {PlaneKind::kIdentity, {n, k / 32}, n * k / 32, {}, {}}};
  for (int64_t r = 0; r < n; ++r) l.values.row_off.push_back(r * k);
  for (int64_t c = 0; c < k; ++c) l.values.col_off.push_back(cuda::gemv_native_elem(Format::kMXFP8, k, c));
  return l;
}

struct Tensor {
  std::string name;
  int64_t values = 0, scales = 0;
  size_t offset = 0;  // of its values plane in the flat canonical image (scales follow)
};

template <class F>
void parallel_for(size_t n, F&& f) {
  const size_t threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (size_t i = t; i < n; i += threads) f(i);
    });
  for (auto& th : pool) th.join();
}

// A random valid E4M3 byte (no NaN code) or E8M0 scale near 1.
uint8_t value_byte(uint64_t r) {
  auto b = static_cast<uint8_t>(r);
  return (b & 0x7F) == 0x7F ? static_cast<uint8_t>(b ^ 1) : b;
}
uint8_t scale_byte(uint64_t r) { return static_cast<uint8_t>(118 + r % 16); }

// A CUDA store holding the 7 Qwen3-8B MXFP8 linears of `layers` layers in the GEMV layout, each at its offset
// in a flat canonical image of `total` bytes.
struct LinearStore {
  WeightStore store;
  cudaStream_t stream = nullptr;
  std::vector<Tensor> tensors;
  size_t total = 0;
};

Result<LinearStore> linear_store(int layers) {
  auto mem = cuda::cuda_weight_memory();
  if (!mem) return tl::unexpected(mem.error());
  const cudaStream_t stream = cuda::weight_memory_stream(**mem);
  LinearStore b{WeightStore(std::move(*mem)), stream, {}, 0};
  std::map<std::pair<int64_t, int64_t>, Layout> layouts;
  for (int l = 0; l < layers; ++l)
    for (const Shape& s : kShapes) {
      auto it = layouts.try_emplace({s.n, s.k}, gemv_layout(s.n, s.k)).first;
      Tensor t{fmt::format("model.layers.{}.{}.weight", l, s.name), s.n * s.k, s.n * s.k / 32, b.total};
      if (Status st = b.store.add(t.name, Format::kMXFP8, {s.n, s.k}, it->second); !st)
        return tl::unexpected(st.error());
      b.total += static_cast<size_t>(t.values + t.scales);
      b.tensors.push_back(std::move(t));
    }
  return b;
}

Status run_bench(int layers, const std::vector<double>& fractions, int reps) {
  auto bench = linear_store(layers);
  if (!bench) return tl::unexpected(bench.error());
  auto& [store, stream, tensors, total] = *bench;
  // Canonical image A in pinned host memory, random non-zero bytes; a device copy of it.
  uint8_t* pinned = nullptr;
  MXQ_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pinned), total, cudaHostAllocDefault));
  std::unique_ptr<uint8_t, decltype(&cudaFreeHost)> pinned_guard(pinned, &cudaFreeHost);
  parallel_for(tensors.size(), [&](size_t i) {
    std::mt19937_64 rng(1000 + i);
    const Tensor& t = tensors[i];
    for (int64_t b = 0; b < t.values; ++b) pinned[t.offset + static_cast<size_t>(b)] = value_byte(rng());
    for (int64_t b = 0; b < t.scales; ++b)
      pinned[t.offset + static_cast<size_t>(t.values + b)] = scale_byte(rng());
  });
  auto dev_a = DeviceBuffer::alloc(total), dev_copy = DeviceBuffer::alloc(total);
  if (!dev_a || !dev_copy) return fail("bench refit: device buffers of {} bytes", total);
  MXQ_CUDA_CHECK(cudaMemcpy(dev_a->as(), pinned, total, cudaMemcpyHostToDevice));
  auto writes = [&](const uint8_t* base) {
    std::vector<TensorWrite> w;
    for (const Tensor& t : tensors)
      w.push_back({t.name,
                   {base + t.offset, static_cast<size_t>(t.values)},
                   {base + t.offset + t.values, static_cast<size_t>(t.scales)}});
    return w;
  };
  const auto dev_writes = writes(dev_a->as<uint8_t>()), host_writes = writes(pinned);
  std::vector<std::string_view> names;
  for (const Tensor& t : tensors) names.push_back(t.name);
  const double gb = static_cast<double>(total) / 1e9;
  fmt::print(
      "mxq-bench refit: {} layers x 7 Qwen3-8B MXFP8 tensors, GEMV layout, {:.3f} GB (values + scales)\n",
      layers, gb);

  auto copy = median_ms(stream, 1, reps, [&](int) -> Status {
    MXQ_CUDA_CHECK(cudaMemcpyAsync(dev_copy->as(), dev_a->as(), total, cudaMemcpyDeviceToDevice, stream));
    return {};
  });
  // The SM copy ceiling: the fastest of copy_ceiling's four variants over the same bytes (total % 16 == 0:
  // the shapes' byte counts are multiples of 1 KiB).
  float sm_copy = 0;
  std::vector<float> sm_copies;
  for (int variant = 0; variant < 4; ++variant) {
    auto ms = median_ms(stream, 1, reps, [&](int) -> Status {
      MXQ_CUDA_CHECK(cuda::launch_copy_ceiling(dev_copy->as<uint8_t>(), dev_a->as<uint8_t>(),
                                               static_cast<int64_t>(total), variant, stream));
      return {};
    });
    if (!ms) return tl::unexpected(ms.error());
    if (variant == 0 || *ms < sm_copy) sm_copy = *ms;
    sm_copies.push_back(*ms);
  }
  auto h2d = median_ms(stream, 1, reps, [&](int) -> Status {
    MXQ_CUDA_CHECK(cudaMemcpyAsync(dev_copy->as(), pinned, total, cudaMemcpyHostToDevice, stream));
    return {};
  });
  auto full = median_ms(stream, 1, reps, [&](int) { return store.apply_tensors(dev_writes); });
  cuda::set_warp_full_write(store.memory(), true);
  auto full_warp = median_ms(stream, 1, reps, [&](int) { return store.apply_tensors(dev_writes); });
  cuda::set_warp_full_write(store.memory(), false);
  cuda::set_staged_full_write(store.memory(), false);
  auto full_plain = median_ms(stream, 1, reps, [&](int) { return store.apply_tensors(dev_writes); });
  cuda::set_staged_full_write(store.memory(), true);
  cuda::set_checksum_from_live(store.memory(), true);
  auto full_reread = median_ms(stream, 1, reps, [&](int) { return store.apply_tensors(dev_writes); });
  cuda::set_checksum_from_live(store.memory(), false);
  auto write_only = median_ms(stream, 1, reps, [&](int) -> Status {
    for (const Tensor& t : tensors) {
      const QTensor& q = store.at(t.name);
      if (Status s =
              store.memory().write_plane(q.layout.values, dev_writes[&t - tensors.data()].values, q.values);
          !s)
        return s;
      if (Status s =
              store.memory().write_plane(q.layout.scales, dev_writes[&t - tensors.data()].scales, q.scales);
          !s)
        return s;
    }
    return store.sync();
  });
  auto sums = median_ms(stream, 1, reps, [&](int) { return store.refresh_checksums(names); });
  auto full_pinned =
      median_ms(stream, 1, std::max(1, reps / 2), [&](int) { return store.apply_tensors(host_writes); });
  for (auto* r :
       {&copy, &h2d, &full, &full_warp, &full_plain, &full_reread, &write_only, &sums, &full_pinned})
    if (!*r) return tl::unexpected(r->error());
  const double copy_gbs = 2 * gb / (*copy * 1e-3), h2d_gbs = gb / (*h2d * 1e-3);
  fmt::print("{:<52} {:>9} {:>9} {:>9}\n", "row", "ms", "GB/s", "% ceiling");
  fmt::print("{:<52} {:>9.3f} {:>9.0f} {:>9}\n", "D2D copy of the same bytes (read + written)", *copy,
             copy_gbs, "-");
  fmt::print("{:<52} {:>9.3f} {:>9.0f} {:>8.1f}%\n", "SM copy kernel of the same bytes (copy_ceiling)",
             sm_copy, 2 * gb / (sm_copy * 1e-3), 100 * *copy / sm_copy);
  fmt::print(
      "  (its variants, ms: streaming x4 / x8 loads {:.3f} / {:.3f}, cached {:.3f} / {:.3f}; % = D2D / it)\n",
      sm_copies[0], sm_copies[1], sm_copies[2], sm_copies[3]);
  fmt::print("{:<52} {:>9.3f} {:>9.1f} {:>9}\n", "pinned H2D copy of the same bytes", *h2d, h2d_gbs, "-");
  auto row = [&](const char* what, float ms, double moved_gb, double ceiling) {
    const double gbs = moved_gb / (ms * 1e-3);
    fmt::print("{:<52} {:>9.3f} {:>9.0f} {:>8.1f}%\n", what, ms, gbs, 100 * gbs / ceiling);
  };
  row("full refit from device (staged tiles, fused sums)", *full, 2 * gb, copy_gbs);
  fmt::print("{:<52} {:>9} {:>9} {:>8.1f}%\n", "  the same, against the SM copy kernel", "", "",
             100 * sm_copy / *full);
  row("  the same, warp write with the chains overlapped", *full_warp, 2 * gb, copy_gbs);
  row("  the same, plain kernel (no shared-memory staging)", *full_plain, 2 * gb, copy_gbs);
  row("full refit from device, checksum re-read from live", *full_reread, 2 * gb, copy_gbs);
  row("  per-plane write kernels only (previous path)", *write_only, 2 * gb, copy_gbs);
  row("  checksum of the live planes alone (one batch)", *sums, gb, copy_gbs / 2);
  fmt::print("{:<52} {:>9.3f} {:>9.1f} {:>8.1f}%\n", "full refit from pinned host (write + checksum)",
             *full_pinned, gb / (*full_pinned * 1e-3), 100 * (*h2d / *full_pinned));

  // Sparse: for each pattern, delta A -> B and B -> A built on the host (outside the timing). A pattern
  // changes a fraction of the values bytes and of the scales bytes, in runs of `run` consecutive bytes.
  struct Pattern {
    std::string name;
    double values, scales;
    int run;
  };
  std::vector<Pattern> patterns;
  for (double f : fractions) patterns.push_back({fmt::format("uniform {:g}%", 100 * f), f, f, 1});
  if (!fractions.empty()) {
    // note: the RL step measurements of docs/refit-format.md section 7 (mxfp8, lr 1e-6 and 1e-5), and 1%
    // changed in runs of 64 bytes (a clustered update: rows or blocks thawed together).
    patterns.push_back({"RL lr 1e-6 (0.259% values, 0.001% scales)", 0.00259, 0.00001, 1});
    patterns.push_back({"RL lr 1e-5 (1.698% values, 0.026% scales)", 0.01698, 0.00026, 1});
    patterns.push_back({"clustered 1% (runs of 64 bytes)", 0.01, 0.01, 64});
  }
  fmt::print(
      "sparse refit (apply_delta), ms: total = validate + stage (pack, upload) + write + checksum; "
      "bound = device DRAM bytes at copy rate, h2d = upload at pinned H2D rate; [full] re-hashes every "
      "touched tensor, [incr] keeps block sums (incremental_checksums)\n");
  fmt::print("{:<51} {:>8} {:>10} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7} {:>7}\n", "pattern", "total",
             "entries", "validate", "stage", "write", "checksum", "bound", "h2d", "%fulldev", "%fullpin");
  uint64_t version = 1;
  for (const Pattern& pat : patterns) {
    refit::Delta fwd{0, 0, {}}, back{0, 0, {}};
    fwd.tensors.resize(tensors.size());
    back.tensors.resize(tensors.size());
    std::vector<int64_t> sectors(tensors.size(), 0);
    parallel_for(tensors.size(), [&](size_t i) {
      const Tensor& t = tensors[i];
      std::mt19937_64 rng(77 + i + static_cast<uint64_t>(pat.values * 1e7) + static_cast<uint64_t>(pat.run));
      const uint8_t* a = pinned + t.offset;
      std::vector<uint8_t> b(a, a + t.values + t.scales);
      for (refit::TensorDelta* d : {&fwd.tensors[i], &back.tensors[i]}) {
        d->name = t.name;
        d->format = Format::kMXFP8;
        d->shape = store.at(t.name).shape;
      }
      for (int p = 0; p < 2; ++p) {
        const int64_t start = p == 0 ? 0 : t.values, size = p == 0 ? t.values : t.scales;
        const double frac = p == 0 ? pat.values : pat.scales;
        std::geometric_distribution<int64_t> gap(std::min(1.0, frac / pat.run));
        refit::PlaneDelta& f = p == 0 ? fwd.tensors[i].values : fwd.tensors[i].scales;
        refit::PlaneDelta& r = p == 0 ? back.tensors[i].values : back.tensors[i].scales;
        int64_t last_sector = -1;
        for (int64_t run_at = gap(rng); run_at < size; run_at += pat.run + gap(rng))
          for (int64_t pos = run_at; pos < std::min(size, run_at + pat.run); ++pos) {
            uint8_t nb;
            do nb = p == 0 ? value_byte(rng()) : scale_byte(rng());
            while (nb == a[start + pos]);
            f.indices.push_back(pos), f.bytes.push_back(nb);
            r.indices.push_back(pos), r.bytes.push_back(a[start + pos]);
            b[static_cast<size_t>(start + pos)] = nb;
            // note: the GEMV layout keeps every 64-byte group in place, so a 32-byte canonical sector stands
            // for the native sector it lands in (one or two of the group's).
            if (pos / 32 != last_sector) ++sectors[i], last_sector = pos / 32;
          }
      }
      fwd.tensors[i].checksum = canonical_checksum({b.data(), static_cast<size_t>(t.values)},
                                                   {b.data() + t.values, static_cast<size_t>(t.scales)});
      back.tensors[i].checksum = store.at(t.name).checksum;
    });
    int64_t entries = 0, sector_count = 0;
    for (const auto& t : fwd.tensors)
      entries += static_cast<int64_t>(t.values.indices.size() + t.scales.indices.size());
    for (int64_t c : sectors) sector_count += c;
    // The wire form of both deltas (records encoded on all cores and joined: records are independent), in
    // pageable memory as read, and in pinned memory (a receiver that reads the body into pinned buffers).
    std::vector<uint8_t> bodies[2];
    for (int d = 0; d < 2; ++d) {
      const refit::Delta& delta = d == 0 ? fwd : back;
      std::vector<std::vector<uint8_t>> records(delta.tensors.size());
      std::vector<Status> status(delta.tensors.size());
      parallel_for(delta.tensors.size(), [&](size_t i) {
        refit::Delta one{0, 1, {delta.tensors[i]}};
        auto b = refit::encode_delta_body(one);
        if (!b)
          status[i] = tl::unexpected(b.error());
        else
          records[i].assign(b->begin() + 20, b->end());  // note: 8 + 8 + 4 bytes of body header
      });
      for (Status& st : status)
        if (!st) return st;
      std::vector<uint8_t>& body = bodies[d];
      const uint32_t count = static_cast<uint32_t>(delta.tensors.size());
      body.resize(20);
      std::memcpy(body.data() + 16, &count, 4);
      for (const auto& r : records) body.insert(body.end(), r.begin(), r.end());
    }
    uint8_t* pinned_bodies = nullptr;
    MXQ_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pinned_bodies),
                                 bodies[0].size() + bodies[1].size(), cudaHostAllocDefault));
    std::unique_ptr<uint8_t, decltype(&cudaFreeHost)> bodies_guard(pinned_bodies, &cudaFreeHost);
    std::memcpy(pinned_bodies, bodies[0].data(), bodies[0].size());
    std::memcpy(pinned_bodies + bodies[0].size(), bodies[1].data(), bodies[1].size());
    const std::span<const uint8_t> pinned_body[2] = {{pinned_bodies, bodies[0].size()},
                                                     {pinned_bodies + bodies[0].size(), bodies[1].size()}};
    const double wire_bytes = static_cast<double>(bodies[0].size() + bodies[1].size()) / 2;
    for (bool incremental : {false, true}) {
      // note: incremental: the kept block sums are built by one full hash outside the timing.
      cuda::set_incremental_checksums(store.memory(), incremental);
      if (incremental)
        if (Status s = store.refresh_checksums(names); !s) return s;
      refit::ApplyTimings tf, tb, sum_t{};
      refit::ApplyOptions of, ob;
      of.timings = &tf, ob.timings = &tb;
      const int sparse_reps = std::max(2, reps / 2);
      auto ms = median_ms(stream, 1, sparse_reps, [&](int rep) -> Status {
        fwd.base_version = version, fwd.new_version = version + 1;
        if (Status s = refit::apply_delta(store, version, fwd, of); !s) return s;
        back.base_version = version, back.new_version = version + 1;
        if (Status s = refit::apply_delta(store, version, back, ob); !s) return s;
        if (rep >= 0)
          for (auto* t : {&tf, &tb})
            sum_t.validate += t->validate, sum_t.stage += t->stage, sum_t.write += t->write,
                sum_t.checksum += t->checksum;
        return {};
      });
      if (!ms) return tl::unexpected(ms.error());
      const double per = 2.0 * sparse_reps;
      const float one = *ms / 2;
      // Device DRAM bytes: each touched 32-byte sector read (undo) and written back, the new bytes and
      // indices read, the undo bytes written, and the checksum's one read of every plane. note: incremental:
      // no re-read, but each touched block's 64 bytes of sums read and written back.
      const double blocks_touched = std::min(static_cast<double>(sector_count), gb * 1e9 / 1024);
      const double dev_bytes = 64.0 * static_cast<double>(sector_count) + 6.0 * static_cast<double>(entries) +
                               (incremental ? 128.0 * blocks_touched : gb * 1e9);
      const double upload = 5.0 * static_cast<double>(entries);
      fmt::print(
          "{:<51} {:>8.2f} {:>10} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>7.2f} {:>7.2f} {:>6.1f}% "
          "{:>6.1f}%\n",
          fmt::format("{} [{}]", pat.name, incremental ? "incr" : "full"), one, entries, sum_t.validate / per,
          sum_t.stage / per, sum_t.write / per, sum_t.checksum / per, dev_bytes / (copy_gbs * 1e9) * 1e3,
          upload / (h2d_gbs * 1e9) * 1e3, 100 * one / *full, 100 * one / *full_pinned);
    }
    // The wire path: index sets decoded and checked on the device (apply_delta on a DeltaView).
    fmt::print("{:<51} {:>8} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>7}\n", "  wire path",
               "total", "parse", "validate", "stage", "upload", "decode", "write", "checksum", "bound", "h2d",
               "%fullpin");
    for (bool pinned_wire : {true, false}) {
      cuda::set_incremental_checksums(store.memory(), true);
      if (Status s = store.refresh_checksums(names); !s) return s;
      refit::ApplyTimings tf, tb, sum_t{};
      double parse_ms = 0;
      refit::ApplyOptions of, ob;
      of.timings = &tf, ob.timings = &tb;
      const int sparse_reps = std::max(2, reps / 2);
      auto ms = median_ms(stream, 1, sparse_reps, [&](int rep) -> Status {
        for (int d = 0; d < 2; ++d) {
          const auto t0 = std::chrono::steady_clock::now();
          auto view =
              refit::parse_delta_view(pinned_wire ? pinned_body[d] : std::span<const uint8_t>(bodies[d]));
          if (!view) return tl::unexpected(view.error());
          const double parse =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          view->base_version = version, view->new_version = version + 1;
          if (Status s = refit::apply_delta(store, version, *view, d == 0 ? of : ob); !s) return s;
          if (rep >= 0) {
            const refit::ApplyTimings& t = d == 0 ? tf : tb;
            parse_ms += parse;
            sum_t.validate += t.validate, sum_t.stage += t.stage, sum_t.upload += t.upload,
                sum_t.decode += t.decode, sum_t.write += t.write, sum_t.checksum += t.checksum;
          }
        }
        return {};
      });
      if (!ms) return tl::unexpected(ms.error());
      const double per = 2.0 * sparse_reps;
      const float one = *ms / 2;
      const double blocks_touched = std::min(static_cast<double>(sector_count), gb * 1e9 / 1024);
      // note: device bytes as above with 4-byte positions written and read twice (scatter, sums) instead of
      // int32 uploads, plus the encoded bytes read once by the decode.
      const double dev_bytes = 64.0 * static_cast<double>(sector_count) +
                               14.0 * static_cast<double>(entries) + wire_bytes + 128.0 * blocks_touched;
      fmt::print(
          "{:<51} {:>8.2f} {:>10.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>7.2f} {:>7.2f} "
          "{:>6.1f}%\n",
          fmt::format("{} [wire, {} body, incr]", pat.name, pinned_wire ? "pinned" : "pageable"), one,
          parse_ms / per, sum_t.validate / per, sum_t.stage / per, sum_t.upload / per, sum_t.decode / per,
          sum_t.write / per, sum_t.checksum / per, dev_bytes / (copy_gbs * 1e9) * 1e3,
          wire_bytes / (h2d_gbs * 1e9) * 1e3, 100 * one / *full_pinned);
    }
    fmt::print("{:<51} wire body {:.1f} MB = {:.2f} bytes per changed entry\n", "", wire_bytes / 1e6,
               wire_bytes / static_cast<double>(entries));
  }
  cuda::set_incremental_checksums(store.memory(), false);
  return {};
}

// The full refit of a served model's tensor set: the linears of run_bench plus model.embed_tokens.weight and
// lm_head.weight (bf16 [151936, 4096], 1.24 GB each), in the same store. Their XXH3 chains (one sequential
// scramble per KiB) bound it, not the bytes: the peer of an update of every tensor (POST
// /update_weights_from_tensor re-reads the live planes, the second row).
Status embeddings_rows(int layers, int reps) {
  auto bench = linear_store(layers);
  if (!bench) return tl::unexpected(bench.error());
  auto& [store, stream, tensors, total] = *bench;
  const size_t first_plain = tensors.size();
  for (const char* name : {"model.embed_tokens.weight", "lm_head.weight"}) {
    Tensor t{name, int64_t{151936} * 4096 * 2, 0, total};
    if (Status st = store.add(t.name, Format::kBF16, {151936, 4096}); !st) return st;
    total += static_cast<size_t>(t.values);
    tensors.push_back(std::move(t));
  }
  std::vector<uint8_t> host(total);
  parallel_for(tensors.size(), [&](size_t i) {
    std::mt19937_64 rng(2000 + i);
    const Tensor& t = tensors[i];
    uint8_t* p = host.data() + t.offset;
    if (i >= first_plain) {
      // note: bf16 of magnitude 2^-8 .. 2, either sign: a weight, never a NaN or Inf
      for (int64_t b = 0; b < t.values; b += 2) {
        const uint64_t r = rng();
        p[b] = static_cast<uint8_t>(r),
        p[b + 1] = static_cast<uint8_t>(0x3B + (r >> 8) % 5 + ((r >> 16) & 0x80));
      }
      return;
    }
    for (int64_t b = 0; b < t.values; ++b) p[b] = value_byte(rng());
    for (int64_t b = 0; b < t.scales; ++b) p[t.values + b] = scale_byte(rng());
  });
  auto dev = DeviceBuffer::alloc(total);
  if (!dev) return fail("bench refit: a device buffer of {} bytes", total);
  MXQ_CUDA_CHECK(cudaMemcpy(dev->as(), host.data(), total, cudaMemcpyHostToDevice));
  std::vector<TensorWrite> w;
  const auto* base = dev->as<uint8_t>();
  for (const Tensor& t : tensors)
    w.push_back({t.name,
                 {base + t.offset, static_cast<size_t>(t.values)},
                 {base + t.offset + t.values, static_cast<size_t>(t.scales)}});
  auto fused = median_ms(stream, 1, reps, [&](int) { return store.apply_tensors(w); });
  cuda::set_checksum_from_live(store.memory(), true);
  auto reread = median_ms(stream, 1, reps, [&](int) { return store.apply_tensors(w); });
  cuda::set_checksum_from_live(store.memory(), false);
  if (!fused) return tl::unexpected(fused.error());
  if (!reread) return tl::unexpected(reread.error());
  const double gb = static_cast<double>(total) / 1e9;
  fmt::print("served tensor set: {} layers x 7 linears + embed_tokens + lm_head (bf16), {:.3f} GB\n", layers,
             gb);
  fmt::print("{:<52} {:>9.3f} {:>9.0f}\n", "full refit + embeddings (fused sums)", *fused,
             2 * gb / (*fused * 1e-3));
  fmt::print("{:<52} {:>9.3f} {:>9.0f}\n", "full refit + embeddings, checksum re-read from live", *reread,
             2 * gb / (*reread * 1e-3));
  return {};
}

}  // namespace
#endif

void add_bench_refit(CLI::App& bench, int& exit_code) {
  auto* cmd = bench.add_subcommand("refit", "in-place refit of Qwen3-8B MXFP8 weights on the GPU");
  auto layers = std::make_shared<int>(36);
  auto reps = std::make_shared<int>(5);
  auto fractions = std::make_shared<std::vector<double>>(std::vector<double>{0.001, 0.01, 0.05, 0.2});
  cmd->add_option("--layers", *layers, "decoder layers (Qwen3-8B has 36)")->check(CLI::Range(1, 1024));
  cmd->add_option("--reps", *reps, "timed repetitions per row (median)")->check(CLI::Range(1, 100000));
  cmd->add_option("--sparse", *fractions, "changed fractions of the bytes, comma-separated")->delimiter(',');
  auto embeddings = std::make_shared<bool>(false);
  cmd->add_flag("--embeddings", *embeddings,
                "also time the full refit of the linears plus embed_tokens and lm_head (bf16), as served");
  cmd->callback([layers, reps, fractions, embeddings, &exit_code] {
#if defined(MXQ_HAVE_CUDA)
    Status st = run_bench(*layers, *fractions, std::max(1, *reps));
    if (st && *embeddings) st = embeddings_rows(*layers, std::max(1, *reps));
    if (!st) {
      fmt::print(stderr, "mxq-bench refit: {}\n", st.error().message);
      exit_code = 1;
    }
#else
    (void)layers, (void)reps, (void)fractions, (void)embeddings;
    fmt::print(stderr, "mxq-bench refit: this build has no CUDA backend\n");
    exit_code = kExitBadInput;
#endif
  });
}

}  // namespace mxq::cli
