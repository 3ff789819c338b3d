#include "refit/applier.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <iterator>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "refit/index_codec.h"

namespace mxq::refit {
namespace {

mxq::Plane store_plane(Plane p) { return p == Plane::kValues ? mxq::Plane::kValues : mxq::Plane::kScales; }

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Entries of plane p (0 values, 1 scales) of the record's tensor; 0 when its shape has none.
template <class T>
int64_t plane_entries(const T& t, int p) {
  auto g = tensor_geometry(t.format, t.shape, t.name);
  return g ? (*g)[static_cast<size_t>(p)].entries : 0;
}

// n rounded up to a multiple of 16 (device image segments start 16-byte aligned).
size_t up16(size_t n) { return (n + 15) / 16 * 16; }

// f(k) for k < n on all host cores (records in turn).
template <class F>
void parallel_records(size_t n, F&& f) {
  const size_t threads = std::min<size_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k = next++; k < n; k = next++) f(k);
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& th : pool) th.join();
}

// One write the undo log can reverse: a whole anchor (both planes) or one sparse plane of a record.
struct UndoStep {
  size_t record = 0;
  bool anchor = false;
  Plane plane = Plane::kValues;        // sparse only
  size_t offset = 0;                   // first byte of the saved old bytes in the log
  std::span<const int32_t> positions;  // the plane's decoded positions in device memory (encoded deltas)
};

// W-05 policy of a plane's new entries, as the device checks it (model/weight_memory.h).
NewBytePolicy policy_of(Format format, Plane plane) {
  if (plane == Plane::kScales)
    return traits(format).scale == ScaleKind::kE8M0 ? NewBytePolicy::kE8M0 : NewBytePolicy::kF32Scale;
  switch (format) {
    case Format::kMXFP8:
    case Format::kFP8_B128:
      return NewBytePolicy::kE4M3;
    case Format::kBF16:
      return NewBytePolicy::kBF16;
    case Format::kF16:
      return NewBytePolicy::kF16;
    case Format::kF32:
      return NewBytePolicy::kF32;
    default:
      return NewBytePolicy::kNone;
  }
}

// Where each record's old bytes go in the log, laid out in record order: an anchor's values then scales
// planes, a sparse record's old value entries then old scale entries.
template <class D>
std::vector<size_t> undo_offsets(const D& delta) {
  std::vector<size_t> at;
  size_t next = 0;
  for (const auto& t : delta.tensors) {
    at.push_back(next);
    next += t.values.bytes.size() + t.scales.bytes.size();
  }
  at.push_back(next);
  return at;
}

// D: Delta (decoded; host or device store) or DeltaView (index sets in their wire encoding; device store).
template <class D>
class Applier {
  static constexpr bool kDecoded = std::is_same_v<D, Delta>;

 public:
  Applier(WeightStore& store, const D& delta, const ApplyOptions& options)
      : store_(store), delta_(delta), options_(options), offsets_(undo_offsets(delta)) {}

  Status run(uint64_t& live_version) {
    if (auto s = store_.servable(); !s)
      return fail("delta {} -> {} refused: {}", from(), to(), s.error().message);
    const auto t0 = Clock::now();
    if constexpr (!kDecoded) {
      if (auto s = validate_delta_view(delta_, tensor_table(store_), live_version); !s) return s;
      if (options_.timings) *options_.timings = {ms_since(t0), 0, 0, 0};
      if (delta_.resident) return run_resident(live_version);
      return run_encoded_on_device(live_version);
    } else {
      if (auto s = validate_delta(delta_, tensor_table(store_), live_version); !s) return s;
      if (options_.timings) *options_.timings = {ms_since(t0), 0, 0, 0};
      return store_.on_device() ? run_on_device(live_version) : run_on_host(live_version);
    }
  }

  // A store in host memory: record by record, each written and verified before the next.
  Status run_on_host(uint64_t& live_version) {
    if (auto s = allocate_host_log(); !s) return s;
    if (auto s = hook({ApplyStage::kValidated, 0, {}}); !s) return s;  // nothing written yet
    // note: the stored checksums are the rollback's target: after an undo every touched tensor must hash to
    // them again, or the store is marked inconsistent.
    for (const TensorDelta& t : delta_.tensors) old_checksums_.push_back(store_.at(t.name).checksum);
    for (size_t k = 0; k < delta_.tensors.size(); ++k)
      if (auto s = write_and_verify(k); !s) return roll_back(k, k, s.error().message);
    live_version = delta_.new_version;
    return {};
  }

  // A store in device memory (DESIGN.md "Refit contract", docs/refit-format.md "Device path"): validation
  // above ran on the host; the undo log and the delta's bytes live in device memory (one upload); every
  // record is written first (anchors in one batch, sparse planes by the scatter kernel), then all checksums
  // are computed in one device batch and compared here, record by record, with the same hook stages.
  // note: one checksum batch instead of one per tensor: the XXH3 scramble chain is sequential per tensor,
  // so tensors must hash side by side for the GPU to be busy. The hooks' order therefore differs from the
  // host path (every kTensorWritten comes after every write), and any failure restores every record.
  Status run_on_device(uint64_t& live_version) {
    if (delta_.tensors.empty()) {
      live_version = delta_.new_version;
      return {};
    }
    const auto t_stage = Clock::now();  // note: the stage includes the scratch allocations
    WeightMemory& mem = store_.memory();
    auto undo_scratch = allocate_device_log(mem);
    if (!undo_scratch) return tl::unexpected(undo_scratch.error());
    Scratch log_guard{mem, *undo_scratch};
    // The delta's indices and new bytes, each segment 16-byte aligned, packed on all host cores into the
    // memory's (pinned) host staging and uploaded with one copy. note: indices go as int32 where the plane
    // has fewer than 2^31 entries (every plane of a model today), half the bytes of the decoded int64.
    struct Segment {
      size_t index_at = 0, bytes_at = 0;
      bool narrow = false;
    };
    std::vector<std::array<Segment, 2>> seg(delta_.tensors.size());
    size_t upload_bytes = 0;
    for (size_t k = 0; k < delta_.tensors.size(); ++k) {
      const TensorDelta& t = delta_.tensors[k];
      for (int p = 0; p < 2; ++p) {
        const PlaneDelta& d = p == 0 ? t.values : t.scales;
        Segment& sg = seg[k][static_cast<size_t>(p)];
        sg.narrow = plane_entries(t, p) <= INT32_MAX;
        sg.index_at = upload_bytes;
        upload_bytes += up16(d.indices.size() * (sg.narrow ? 4 : 8));
        sg.bytes_at = upload_bytes;
        upload_bytes += up16(d.bytes.size());
      }
    }
    auto up = mem.allocate_scratch(upload_bytes);
    if (!up)
      return fail(
          "delta {} -> {}: {} bytes of delta could not be placed in {} memory ({}); nothing written "
          "(W-26)",
          from(), to(), upload_bytes, mem.name(), up.error().message);
    Scratch up_guard{mem, *up};
    if (auto s = hook({ApplyStage::kValidated, 0, {}}); !s) return s;  // nothing written yet
    struct DevicePlaneDelta {
      std::span<const int32_t> narrow;  // one of the two, by Segment::narrow
      std::span<const int64_t> wide;
      size_t count = 0;
      std::span<const uint8_t> bytes;
    };
    std::span<uint8_t> host = mem.host_staging(upload_bytes);
    std::vector<uint8_t> fallback;  // note: no pinned memory to be had: pageable, same bytes
    if (host.size() < upload_bytes) fallback.resize(upload_bytes), host = fallback;
    parallel_records(delta_.tensors.size(), [&](size_t k) {
      const TensorDelta& t = delta_.tensors[k];
      for (int p = 0; p < 2; ++p) {
        const PlaneDelta& d = p == 0 ? t.values : t.scales;
        const Segment& sg = seg[k][static_cast<size_t>(p)];
        if (sg.narrow) {
          auto* out = reinterpret_cast<int32_t*>(host.data() + sg.index_at);
          for (size_t j = 0; j < d.indices.size(); ++j) out[j] = static_cast<int32_t>(d.indices[j]);
        } else if (!d.indices.empty()) {
          std::memcpy(host.data() + sg.index_at, d.indices.data(), d.indices.size() * sizeof(int64_t));
        }
        if (!d.bytes.empty()) std::memcpy(host.data() + sg.bytes_at, d.bytes.data(), d.bytes.size());
      }
    });
    if (auto s = mem.upload(host.first(upload_bytes), *up); !s) return s;
    std::vector<std::array<DevicePlaneDelta, 2>> dev(delta_.tensors.size());
    for (size_t k = 0; k < delta_.tensors.size(); ++k) {
      const TensorDelta& t = delta_.tensors[k];
      for (int p = 0; p < 2; ++p) {
        const PlaneDelta& d = p == 0 ? t.values : t.scales;
        const Segment& sg = seg[k][static_cast<size_t>(p)];
        DevicePlaneDelta& dd = dev[k][static_cast<size_t>(p)];
        if (sg.narrow)
          dd.narrow = {reinterpret_cast<const int32_t*>(up->data() + sg.index_at), d.indices.size()};
        else
          dd.wide = {reinterpret_cast<const int64_t*>(up->data() + sg.index_at), d.indices.size()};
        dd.count = d.indices.size();
        dd.bytes = up->subspan(sg.bytes_at, d.bytes.size());
      }
    }
    if (options_.timings) {
      if (auto s = mem.sync(); !s) return s;
      options_.timings->stage = ms_since(t_stage);
    }
    const auto t_write = Clock::now();
    for (const TensorDelta& t : delta_.tensors) old_checksums_.push_back(store_.at(t.name).checksum);
    const size_t last = delta_.tensors.size() - 1;
    // Anchors: old canonical planes into the log (device to device), then one batched write.
    std::vector<TensorWrite> anchors;
    for (size_t k = 0; k < delta_.tensors.size(); ++k) {
      const TensorDelta& t = delta_.tensors[k];
      if (!t.anchor) continue;
      if (auto s = log_anchor(k); !s) return roll_back(k, last, s.error().message);
      // note: the step is recorded before the write: restoring bytes that were never overwritten is harmless.
      steps_.push_back({k, true, Plane::kValues, offsets_[k], {}});
      anchors.push_back({t.name, dev[k][0].bytes, dev[k][1].bytes});
    }
    if (!anchors.empty())
      if (auto s = store_.apply_tensors(anchors); !s) return roll_back(0, last, s.error().message);
    // Sparse records: queued scatters with undo capture, then one checksum batch.
    std::vector<std::string_view> sparse;
    for (size_t k = 0; k < delta_.tensors.size(); ++k) {
      const TensorDelta& t = delta_.tensors[k];
      if (t.anchor) continue;
      size_t log_at = offsets_[k];
      for (Plane p : {Plane::kValues, Plane::kScales}) {
        const DevicePlaneDelta& d = dev[k][p == Plane::kValues ? 0 : 1];
        if (d.count == 0) continue;
        steps_.push_back({k, false, p, log_at, {}});
        const auto undo_span = log(log_at, d.bytes.size());
        const int eb = entry_bytes(t.format, p);
        if (auto s = d.narrow.empty()
                         ? store_.apply_sparse(t.name, store_plane(p), d.wide, eb, d.bytes, undo_span)
                         : store_.apply_sparse(t.name, store_plane(p), d.narrow, eb, d.bytes, undo_span);
            !s)
          return roll_back(k, last, s.error().message);
        log_at += d.bytes.size();
      }
      // note: a record that changes nothing keeps its planes, and so the checksum the store holds (compared
      // below): re-hashing it would cost a pass over an untouched tensor (an embedding: a 1.2 GB chain).
      if (dev[k][0].count + dev[k][1].count > 0) sparse.push_back(t.name);
    }
    if (options_.timings) {
      if (auto s = store_.sync(); !s) return roll_back(0, last, s.error().message);
      options_.timings->write = ms_since(t_write);
    }
    return verify_on_device(live_version, sparse);
  }

  // The device path for a delta whose index sets stay in their wire encoding (docs/refit-format.md "Device
  // path"): the host checks the records (chain, coverage, shapes: O(records)) and turns runs into run
  // tables (O(runs)); the encoded index bytes and new bytes go to the device as they are (one upload of the
  // body when it already sits in pinned memory, else one pass packing them into pinned staging); the device
  // decodes them to int32 positions and checks every index and new entry, and one read of its error word
  // decides before the first write. A refusal is worded on the host by decoding that record
  // (check_tensor_view), as the host path words it.
  Status run_encoded_on_device(uint64_t& live_version) {
    if (delta_.tensors.empty()) {
      live_version = delta_.new_version;
      return {};
    }
    const auto t_stage = Clock::now();
    WeightMemory& mem = store_.memory();
    const size_t n = delta_.tensors.size();
    std::vector<std::array<std::vector<int32_t>, 2>> run_tables(n);
    std::vector<Status> run_status(n);
    // note: anchors' new bytes are checked here on the host (in place, all cores); sparse planes' on the
    // device. Only records with work (anchors, runs sets) go to the threads, and none are started when there
    // are none: starting a thread per core costs ~1 ms per call, the whole stage of a gaps-only delta.
    std::vector<size_t> busy;
    for (size_t k = 0; k < n; ++k) {
      const auto& t = delta_.tensors[k];
      const auto runs = static_cast<uint8_t>(IndexEncoding::kRuns);
      if (t.anchor || t.values.encoding == runs || t.scales.encoding == runs) busy.push_back(k);
    }
    parallel_records(busy.size(), [&](size_t b) {
      const size_t k = busy[b];
      const auto& t = delta_.tensors[k];
      if (t.anchor) run_status[k] = check_tensor_view(t);
      for (int p = 0; p < 2 && !t.anchor; ++p) {
        const PlaneView& v = p == 0 ? t.values : t.scales;
        if (v.encoding != static_cast<uint8_t>(IndexEncoding::kRuns)) continue;
        auto table = decode_run_table(v.index, v.count, plane_entries(t, p));
        if (!table) {
          run_status[k] = fail("{} {}: {}", t.name, p == 0 ? "values" : "scales", table.error().message);
          return;
        }
        run_tables[k][static_cast<size_t>(p)] = std::move(*table);
      }
    });
    for (Status& st : run_status)
      if (!st) return st;
    auto undo_scratch = allocate_device_log(mem);
    if (!undo_scratch) return tl::unexpected(undo_scratch.error());
    Scratch log_guard{mem, *undo_scratch};
    // The device image: [the body, when pinned | packed: run tables, and (body not pinned) every index set,
    // new bytes and anchor plane], each packed segment 16-byte aligned.
    const std::span<const uint8_t> body = delta_.body;
    const bool zero_copy = mem.host_pinned(body);
    struct Segment {
      size_t index_at = 0, bytes_at = 0;
    };
    std::vector<std::array<Segment, 2>> seg(n);
    const size_t body_part = zero_copy ? up16(body.size()) : 0;
    size_t packed = 0, entries = 0;
    for (size_t k = 0; k < n; ++k) {
      const auto& t = delta_.tensors[k];
      for (int p = 0; p < 2; ++p) {
        const PlaneView& v = p == 0 ? t.values : t.scales;
        Segment& sg = seg[k][static_cast<size_t>(p)];
        const auto& runs = run_tables[k][static_cast<size_t>(p)];
        entries += t.anchor ? 0 : static_cast<size_t>(v.count);
        if (!runs.empty()) {
          sg.index_at = body_part + packed, packed += up16(runs.size() * 4);
        } else if (zero_copy) {
          sg.index_at = static_cast<size_t>(v.index.data() - body.data());
        } else {
          sg.index_at = body_part + packed, packed += up16(v.index.size());
        }
        if (zero_copy) {
          sg.bytes_at = v.bytes.empty() ? 0 : static_cast<size_t>(v.bytes.data() - body.data());
        } else {
          sg.bytes_at = body_part + packed, packed += up16(v.bytes.size());
        }
      }
    }
    const size_t image_bytes = body_part + packed;
    auto image = mem.allocate_scratch(image_bytes);
    if (!image)
      return fail(
          "delta {} -> {}: {} bytes of delta could not be placed in {} memory ({}); nothing written (W-26)",
          from(), to(), image_bytes, mem.name(), image.error().message);
    Scratch image_guard{mem, *image};
    auto positions = mem.allocate_scratch(entries * 4);
    if (!positions)
      return fail(
          "delta {} -> {}: {} decoded positions could not be placed in {} memory ({}); nothing "
          "written (W-26)",
          from(), to(), entries, mem.name(), positions.error().message);
    Scratch positions_guard{mem, *positions};
    // note: a zero-copy body may itself sit in the pinned staging (apply_delta_files), so its small pack (run
    // tables) goes through pageable memory; no pinned memory to be had: pageable too, same bytes.
    std::span<uint8_t> host = packed && !zero_copy ? mem.host_staging(packed) : std::span<uint8_t>{};
    std::vector<uint8_t> fallback;
    if (host.size() < packed) fallback.resize(packed), host = fallback;
    // note: nothing to pack (a pinned body without runs sets): no threads.
    parallel_records(packed ? n : 0, [&](size_t k) {
      const auto& t = delta_.tensors[k];
      for (int p = 0; p < 2; ++p) {
        const PlaneView& v = p == 0 ? t.values : t.scales;
        const Segment& sg = seg[k][static_cast<size_t>(p)];
        const auto& runs = run_tables[k][static_cast<size_t>(p)];
        if (!runs.empty())
          std::memcpy(host.data() + sg.index_at - body_part, runs.data(), runs.size() * 4);
        else if (!zero_copy && !v.index.empty())
          std::memcpy(host.data() + sg.index_at - body_part, v.index.data(), v.index.size());
        if (!zero_copy && !v.bytes.empty())
          std::memcpy(host.data() + sg.bytes_at - body_part, v.bytes.data(), v.bytes.size());
      }
    });
    if (options_.timings) options_.timings->stage = ms_since(t_stage);
    const auto t_upload = Clock::now();
    if (zero_copy)
      if (auto s = mem.upload(body, image->first(body.size())); !s) return s;
    if (packed)
      if (auto s = mem.upload(host.first(packed), image->subspan(body_part, packed)); !s) return s;
    if (options_.timings) {
      if (auto s = mem.sync(); !s) return s;
      options_.timings->upload = ms_since(t_upload);
    }
    // Jobs: every sparse plane that carries entries or index bytes, in record order.
    const auto t_decode = Clock::now();
    std::vector<SparsePlaneJob> jobs;
    std::vector<std::string> whats;
    std::vector<size_t> job_record;
    whats.reserve(2 * n);
    size_t at = 0;
    for (size_t k = 0; k < n; ++k) {
      const auto& t = delta_.tensors[k];
      if (t.anchor) continue;
      size_t log_at = offsets_[k];
      for (int p = 0; p < 2; ++p) {
        const PlaneView& v = p == 0 ? t.values : t.scales;
        const Plane plane = p == 0 ? Plane::kValues : Plane::kScales;
        // note: an empty gaps or runs set is no work; a bitmap must still have its length checked.
        if (v.count == 0 && v.index.empty() && v.encoding != static_cast<uint8_t>(IndexEncoding::kBitmap))
          continue;
        if (p == 1 && !is_quantized(t.format)) continue;
        const Segment& sg = seg[k][static_cast<size_t>(p)];
        const auto& runs = run_tables[k][static_cast<size_t>(p)];
        const QTensor& live = store_.at(t.name);
        SparsePlaneJob j;
        whats.push_back(fmt::format("{} {}", t.name, p == 0 ? "values" : "scales"));
        j.what = whats.back();
        j.layout = &live.layout.plane(store_plane(plane));
        j.native = p == 0 ? live.values : live.scales;
        j.encoding = v.encoding;
        j.index = image->subspan(sg.index_at, runs.empty() ? v.index.size() : runs.size() * 4);
        j.count = v.count;
        j.entries = plane_entries(t, p);
        j.entry_bytes = entry_bytes(t.format, plane);
        j.policy = policy_of(t.format, plane);
        j.bytes = image->subspan(sg.bytes_at, v.bytes.size());
        j.undo = log(log_at, v.bytes.size());
        log_at += v.bytes.size();
        jobs.push_back(j);
        job_record.push_back(k);
        steps_.push_back(
            {k,
             false,
             plane,
             static_cast<size_t>(j.undo.data() - device_log_),
             {reinterpret_cast<const int32_t*>(positions->data()) + at, static_cast<size_t>(v.count)}});
        at += static_cast<size_t>(v.count);
      }
    }
    auto refused = mem.decode_sparse(jobs, *positions);
    if (!refused) return tl::unexpected(refused.error());
    if (*refused) {
      steps_.clear();
      const size_t k = job_record[(*refused)->job];
      if (auto s = check_tensor_view(delta_.tensors[k]); !s) return s;
      return fail(
          "{}: the device refused entry {} (its index or new bytes), the host finds no fault; nothing "
          "written",
          jobs[(*refused)->job].what, (*refused)->position);
    }
    if (options_.timings) options_.timings->decode = ms_since(t_decode);
    if (auto s = hook({ApplyStage::kValidated, 0, {}}); !s) return s;  // nothing written yet
    const auto t_write = Clock::now();
    for (const auto& t : delta_.tensors) old_checksums_.push_back(store_.at(t.name).checksum);
    const size_t last = n - 1;
    // note: the sparse steps are recorded above; anchors' steps go first in the log of undo order.
    std::vector<UndoStep> sparse_steps = std::move(steps_);
    steps_.clear();
    std::vector<TensorWrite> anchors;
    for (size_t k = 0; k < n; ++k) {
      const auto& t = delta_.tensors[k];
      if (!t.anchor) continue;
      if (auto s = log_anchor(k); !s) return roll_back(k, last, s.error().message);
      steps_.push_back({k, true, Plane::kValues, offsets_[k], {}});
      anchors.push_back({t.name, image->subspan(seg[k][0].bytes_at, t.values.bytes.size()),
                         image->subspan(seg[k][1].bytes_at, t.scales.bytes.size())});
    }
    if (!anchors.empty())
      if (auto s = store_.apply_tensors(anchors); !s) return roll_back(0, last, s.error().message);
    steps_.insert(steps_.end(), sparse_steps.begin(), sparse_steps.end());
    if (auto s = store_.scatter_sparse(jobs, *positions); !s) return roll_back(0, last, s.error().message);
    std::vector<std::string_view> sparse;
    for (const auto& t : delta_.tensors)
      if (!t.anchor && t.values.count + t.scales.count > 0) sparse.push_back(t.name);  // as run_on_device
    if (options_.timings) {
      if (auto s = store_.sync(); !s) return roll_back(0, last, s.error().message);
      options_.timings->write = ms_since(t_write);
    }
    return verify_on_device(live_version, sparse);
  }

  // Anchors whose planes already sit in the store's memory (DeltaView::resident;
  // refit/tensor_update_cuda.h): their new bytes are checked where they are (check_planes: the device for
  // a CUDA store), the old planes go to the undo log, then one batched write and the checksums, as on the
  // device path.
  Status run_resident(uint64_t& live_version) {
    if constexpr (!kDecoded) {
      if (delta_.tensors.empty()) {
        live_version = delta_.new_version;
        return {};
      }
      WeightMemory& mem = store_.memory();
      std::vector<PlaneCheckJob> checks;
      std::vector<std::pair<size_t, Plane>> check_of;
      for (size_t k = 0; k < delta_.tensors.size(); ++k) {
        const auto& t = delta_.tensors[k];
        if (!t.anchor) return fail("{}: a resident delta carries anchors only", t.name);
        auto g = tensor_geometry(t.format, t.shape, t.name);
        if (!g) return tl::unexpected(g.error());
        for (Plane p : {Plane::kValues, Plane::kScales}) {
          const PlaneView& v = p == Plane::kValues ? t.values : t.scales;
          const int i = p == Plane::kValues ? 0 : 1;
          if (static_cast<int64_t>(v.bytes.size()) != (*g)[static_cast<size_t>(i)].bytes)
            return fail("{}: anchor {} plane of {} bytes, expected {} (W-08)", t.name,
                        i == 0 ? "values" : "scales", v.bytes.size(), (*g)[static_cast<size_t>(i)].bytes);
          if (v.bytes.empty()) continue;
          checks.push_back({v.bytes, entry_bytes(t.format, p), policy_of(t.format, p)});
          check_of.emplace_back(k, p);
        }
      }
      auto refused = mem.check_planes(checks);
      if (!refused) return tl::unexpected(refused.error());
      if (*refused) {
        const auto [k, p] = check_of[(*refused)->job];
        return fail("{} {}: entry {} is not a valid new value for {} (W-05); nothing written",
                    delta_.tensors[k].name, p == Plane::kValues ? "values" : "scales", (*refused)->position,
                    traits(delta_.tensors[k].format).name);
      }
      std::optional<Scratch> log_guard;
      if (store_.on_device()) {
        auto undo_scratch = allocate_device_log(mem);
        if (!undo_scratch) return tl::unexpected(undo_scratch.error());
        log_guard.emplace(mem, *undo_scratch);
      } else if (auto s = allocate_host_log(); !s) {
        return s;
      }
      if (auto s = hook({ApplyStage::kValidated, 0, {}}); !s) return s;  // nothing written yet
      const auto t_write = Clock::now();
      for (const auto& t : delta_.tensors) old_checksums_.push_back(store_.at(t.name).checksum);
      const size_t last = delta_.tensors.size() - 1;
      std::vector<TensorWrite> anchors;
      for (size_t k = 0; k < delta_.tensors.size(); ++k) {
        const auto& t = delta_.tensors[k];
        if (auto s = log_anchor(k); !s) return roll_back(k, last, s.error().message);
        steps_.push_back({k, true, Plane::kValues, offsets_[k], {}});
        anchors.push_back({t.name, t.values.bytes, t.scales.bytes});
      }
      if (auto s = store_.apply_tensors(anchors); !s) return roll_back(0, last, s.error().message);
      if (options_.timings) {
        if (auto s = store_.sync(); !s) return roll_back(0, last, s.error().message);
        options_.timings->write = ms_since(t_write);
      }
      if (options_.await_checksums)
        if (auto s = options_.await_checksums(); !s) return roll_back(0, last, s.error().message);
      return verify_on_device(live_version, {});
    }
    return fail("a resident delta is a DeltaView");
  }

  // Every touched tensor's checksum in one device batch, then the comparisons and hooks in record order.
  Status verify_on_device(uint64_t& live_version, std::span<const std::string_view> sparse) {
    const size_t last = delta_.tensors.size() - 1;
    const auto t_sum = Clock::now();
    if (auto s = store_.refresh_checksums(sparse); !s) return roll_back(0, last, s.error().message);
    const auto n = static_cast<int64_t>(delta_.tensors.size());
    for (size_t k = 0; k < delta_.tensors.size(); ++k) {
      const auto& t = delta_.tensors[k];
      if (auto s = hook({ApplyStage::kTensorWritten, k, t.name}); !s)
        return roll_back(k, last, s.error().message);
      const uint64_t sum = store_.at(t.name).checksum;
      if (sum != t.checksum)
        return roll_back(k, last,
                         fmt::format("canonical checksum {:016x} after the update, the delta says {:016x} "
                                     "(W-06/W-09)",
                                     sum, t.checksum));
      if (auto s = hook({ApplyStage::kChecksumVerified, k, t.name}); !s)
        return roll_back(k, last, s.error().message);
      if (options_.progress && !options_.progress({"refit", t.name, static_cast<int64_t>(k) + 1, n}))
        return roll_back(k, last, "cancelled by the progress callback");
    }
    if (options_.timings) options_.timings->checksum = ms_since(t_sum);
    live_version = delta_.new_version;
    return {};
  }

  struct Scratch {
    // note: a constructor, so std::optional::emplace can build one in place on clang 14 too (no parenthesized
    // aggregate init there); a temporary moved in would free the scratch twice.
    Scratch(WeightMemory& m, std::span<uint8_t> b) : mem(m), bytes(b) {}
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    ~Scratch() { mem.free_scratch(bytes); }
    WeightMemory& mem;
    std::span<uint8_t> bytes;
  };

 private:
  uint64_t from() const { return delta_.base_version; }
  uint64_t to() const { return delta_.new_version; }
  Status hook(const StagePoint& p) const {
    if (p.stage == ApplyStage::kValidated && options_.before_write)
      if (auto s = options_.before_write(); !s) return s;
    return options_.fault ? options_.fault(p) : Status{};
  }
  // The undo log in host memory (log_), from options_.allocate_undo when the caller gives one.
  Status allocate_host_log() {
    const size_t log_bytes = offsets_.back();
    log_ = options_.allocate_undo ? options_.allocate_undo(log_bytes)
                                  : std::unique_ptr<uint8_t[]>(new (std::nothrow) uint8_t[log_bytes]);
    if (!log_ && log_bytes > 0)
      return fail("delta {} -> {}: undo log of {} bytes could not be allocated; nothing written (W-26)",
                  from(), to(), log_bytes);
    return {};
  }
  // The undo log in `mem`'s scratch (device_log_ points at it; the caller frees it through a Scratch guard).
  Result<std::span<uint8_t>> allocate_device_log(WeightMemory& mem) {
    const size_t log_bytes = offsets_.back();
    auto undo_scratch = mem.allocate_scratch(log_bytes);
    if (!undo_scratch)
      return fail(
          "delta {} -> {}: undo log of {} bytes could not be allocated in {} memory ({}); nothing "
          "written (W-26)",
          from(), to(), log_bytes, mem.name(), undo_scratch.error().message);
    device_log_ = undo_scratch->data();
    return *undo_scratch;
  }
  std::span<uint8_t> log(size_t offset, size_t bytes) {
    return {(device_log_ ? device_log_ : log_.get()) + offset, bytes};
  }

  // An anchor's old canonical planes (values, then scales) into its span of the undo log.
  Status log_anchor(size_t k) {
    const auto& t = delta_.tensors[k];
    const auto old_values = log(offsets_[k], t.values.bytes.size());
    const auto old_scales = log(offsets_[k] + old_values.size(), t.scales.bytes.size());
    if (auto s = store_.read_canonical(t.name, mxq::Plane::kValues, old_values); !s) return s;
    return store_.read_canonical(t.name, mxq::Plane::kScales, old_scales);
  }

  Status write_and_verify(size_t k) {
    const TensorDelta& t = delta_.tensors[k];
    const QTensor& live = store_.at(t.name);
    size_t at = offsets_[k];
    const auto t_write = Clock::now();
    if (t.anchor) {
      if (auto s = log_anchor(k); !s) return s;
      if (auto s = store_.apply_tensor(t.name, t.values.bytes, t.scales.bytes); !s) return s;
      steps_.push_back({k, true, Plane::kValues, at, {}});
    } else {
      for (Plane p : {Plane::kValues, Plane::kScales}) {
        const PlaneDelta& d = p == Plane::kValues ? t.values : t.scales;
        if (d.indices.empty()) continue;
        if (auto s = store_.apply_sparse(t.name, store_plane(p), d.indices, entry_bytes(t.format, p), d.bytes,
                                         log(at, d.bytes.size()));
            !s)
          return s;
        steps_.push_back({k, false, p, at, {}});
        at += d.bytes.size();
      }
    }
    // note: host path: an anchor's write includes its checksum (apply_tensor hashes what it wrote)
    if (options_.timings) options_.timings->write += ms_since(t_write);
    if (auto s = hook({ApplyStage::kTensorWritten, k, t.name}); !s) return s;
    // note: apply_tensor refreshed an anchor's checksum already; sparse writes leave it to us.
    // note: a sparse record that changes nothing keeps the checksum the store holds (as on the device path).
    uint64_t sum = live.checksum;
    if (!t.anchor && !(t.values.indices.empty() && t.scales.indices.empty())) {
      const auto t_sum = Clock::now();
      auto r = store_.refresh_checksum(t.name);
      if (!r) return tl::unexpected(r.error());
      sum = *r;
      if (options_.timings) options_.timings->checksum += ms_since(t_sum);
    }
    if (sum != t.checksum)
      return fail("canonical checksum {:016x} after the update, the delta says {:016x} (W-06/W-09)", sum,
                  t.checksum);
    if (auto s = hook({ApplyStage::kChecksumVerified, k, t.name}); !s) return s;
    const auto n = static_cast<int64_t>(delta_.tensors.size());
    if (options_.progress && !options_.progress({"refit", t.name, static_cast<int64_t>(k) + 1, n}))
      return fail("cancelled by the progress callback");
    return {};
  }

  // Restores every saved byte, newest first, then checks that records 0..last_written hash to their old
  // checksums again (one batch).
  Status roll_back(size_t k, size_t last_written, const std::string& why) {
    const std::string reason = fmt::format("delta {} -> {}, tensor {} of {} {}: {}", from(), to(), k + 1,
                                           delta_.tensors.size(), delta_.tensors[k].name, why);
    for (auto step = steps_.rbegin(); step != steps_.rend(); ++step) {
      const auto& t = delta_.tensors[step->record];
      Status fault = hook({ApplyStage::kUndoStep, step->record, t.name});
      for (int attempt = 1; attempt < kUndoAttempts && !fault; ++attempt)
        fault = hook({ApplyStage::kUndoStep, step->record, t.name});
      if (!fault) return give_up(reason, fmt::format("undo of {} failed: {}", t.name, fault.error().message));
      if (auto s = undo(*step); !s) return give_up(reason, s.error().message);
    }
    std::vector<std::string_view> names;
    for (size_t r = 0; r <= last_written; ++r) names.push_back(delta_.tensors[r].name);
    if (auto s = store_.refresh_checksums(names); !s)
      return give_up(reason, fmt::format("the checksums after the undo failed: {}", s.error().message));
    for (size_t r = 0; r <= last_written; ++r) {
      const std::string& name = delta_.tensors[r].name;
      if (store_.at(name).checksum != old_checksums_[r])
        return give_up(reason, fmt::format("{} does not return to its old checksum after the undo", name));
    }
    return fail("{}; every written byte restored, live version stays {}", reason, from());
  }

  // note: a sparse undo writes the saved entries back at the same canonical indices, so the layout sends
  // them to the very native bytes they came from; an anchor's saved planes are canonical and go back whole.
  Status undo(const UndoStep& step) {
    const auto& t = delta_.tensors[step.record];
    if (step.anchor)
      return store_.apply_tensor(t.name, log(step.offset, t.values.bytes.size()),
                                 log(step.offset + t.values.bytes.size(), t.scales.bytes.size()));
    const auto& d = step.plane == Plane::kValues ? t.values : t.scales;
    if (!step.positions.empty())
      return store_.apply_sparse(t.name, store_plane(step.plane), step.positions,
                                 entry_bytes(t.format, step.plane), log(step.offset, d.bytes.size()));
    if constexpr (kDecoded)
      return store_.apply_sparse(t.name, store_plane(step.plane), d.indices,
                                 entry_bytes(t.format, step.plane), log(step.offset, d.bytes.size()));
    return {};
  }

  Status give_up(const std::string& reason, const std::string& undo_error) {
    store_.mark_inconsistent(fmt::format("{}; then {}", reason, undo_error));
    return fail("{}; then {}: the weights are in neither version and the store refuses to serve (W-10)",
                reason, undo_error);
  }

  WeightStore& store_;
  const D& delta_;
  const ApplyOptions& options_;
  const std::vector<size_t> offsets_;
  std::unique_ptr<uint8_t[]> log_;
  uint8_t* device_log_ = nullptr;  // the undo log in the store's memory (device path)
  std::vector<UndoStep> steps_;
  std::vector<uint64_t> old_checksums_;
};

}  // namespace

std::string_view stage_name(ApplyStage stage) {
  switch (stage) {
    case ApplyStage::kValidated:
      return "validated";
    case ApplyStage::kTensorWritten:
      return "tensor written";
    case ApplyStage::kChecksumVerified:
      return "checksum verified";
    case ApplyStage::kUndoStep:
      return "undo step";
  }
  return "?";
}

TensorTable tensor_table(const WeightStore& store) {
  TensorTable table;
  for (const auto& [name, t] : store.tensors()) table.emplace(name, TensorSpec{t.format, t.shape});
  return table;
}

uint64_t undo_log_bytes(const Delta& delta) { return undo_offsets(delta).back(); }

Status apply_delta(WeightStore& store, uint64_t& live_version, const Delta& delta,
                   const ApplyOptions& options) {
  return Applier<Delta>(store, delta, options).run(live_version);
}

// note: a host store, or a plane too large for int32 positions, takes the decoded path (the host decodes
// every index set, then applies as above).
Status apply_delta(WeightStore& store, uint64_t& live_version, const DeltaView& delta,
                   const ApplyOptions& options) {
  if (delta.resident) return Applier<DeltaView>(store, delta, options).run(live_version);
  bool encoded = store.on_device();
  for (const TensorView& t : delta.tensors)
    for (int p = 0; p < 2 && encoded; ++p) encoded = plane_entries(t, p) <= INT32_MAX;
  if (encoded) return Applier<DeltaView>(store, delta, options).run(live_version);
  auto decoded = decode_delta_view(delta);
  if (!decoded) return tl::unexpected(decoded.error());
  return apply_delta(store, live_version, *decoded, options);
}

Status apply_delta_files(WeightStore& store, uint64_t& live_version, std::span<const std::string> paths,
                         const ApplyOptions& options) {
  for (const std::string& path : paths) {
    auto bytes = read_delta_file_bytes(path);
    if (!bytes) return tl::unexpected(bytes.error());
    const std::span<const uint8_t> file(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size());
    auto size = body_size(file);
    if (!size) return fail_in(path, size.error());
    // note: a device store decompresses into its pinned staging, so the body uploads without a copy.
    std::unique_ptr<uint8_t[]> pageable;
    std::span<uint8_t> body;
    if (store.on_device()) body = store.memory().host_staging(static_cast<size_t>(*size));
    if (body.size() < *size) {
      pageable.reset(new (std::nothrow) uint8_t[std::max<size_t>(static_cast<size_t>(*size), 1)]);
      if (!pageable) return fail("{}: cannot allocate {} bytes for the delta body", path, *size);
      body = std::span(pageable.get(), static_cast<size_t>(*size));
    }
    if (auto s = decompress_body(file, body); !s) return fail_in(path, s.error());
    auto view = parse_delta_view(body);
    if (!view) return fail_in(path, view.error());
    if (auto s = apply_delta(store, live_version, *view, options); !s) return fail_in(path, s.error());
  }
  return {};
}

}  // namespace mxq::refit
