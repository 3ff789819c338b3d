#include "model/weight_memory_cuda.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/common/check.h"
#include "cuda/refit/check_planes_launch.h"
#include "cuda/refit/device_ranges.h"
#include "cuda/refit/kept_sums.h"
#include "cuda/refit/plane_tables.h"
#include "cuda/refit/refit_launch.h"
#include "cuda/refit/sparse_decode_launch.h"
#include "cuda/refit/sparse_job_table.h"

namespace mxq::cuda {
namespace {

class CudaWeightMemory final : public WeightMemory {
 public:
  explicit CudaWeightMemory(const CudaMemoryOptions& o)
      : stream_(o.stream),
        limit_(o.scratch_limit),
        reread_(o.checksum_from_live),
        incremental_(o.incremental_checksums && o.batched_kernels),
        batched_(o.batched_kernels),
        staged_(o.staged_full_write),
        warp_(o.warp_full_write),
        stage_cap_(o.host_stage_bytes),
        keep_(o.scratch_keep_bytes) {}
  ~CudaWeightMemory() override {
    if (stream_) cudaStreamSynchronize(stream_);
    for (const auto& [ptr, bytes] : scratch_) cudaFreeAsync(ptr, stream_);
    if (stream_) cudaStreamSynchronize(stream_);
    if (pool_) cudaMemPoolDestroy(pool_);
    warp_chain_streams_destroy(side_);
    if (own_stream_) cudaStreamDestroy(stream_);
  }

  Status init() {
    if (!stream_) {
      MXQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      own_stream_ = true;
    }
    auto st = DeviceBuffer::alloc(sizeof(unsigned long long));
    if (!st) return tl::unexpected(st.error());
    status_ = std::move(*st);
    status_host_ = reinterpret_cast<unsigned long long*>(status_pinned_.get(sizeof(unsigned long long)));
    if (!status_host_) return fail("pinned host memory of 8 bytes for the status word");
    MXQ_CUDA_CHECK(cudaMemsetAsync(status_.as(), 0xFF, sizeof(unsigned long long), stream_));
    auto de = DeviceBuffer::alloc(sizeof(unsigned long long));
    if (!de) return tl::unexpected(de.error());
    decode_error_ = std::move(*de);
    MXQ_CUDA_CHECK(cudaMemsetAsync(decode_error_.as(), 0xFF, sizeof(unsigned long long), stream_));
    // note: scratch comes from a stream-ordered pool of its own (cudaMallocFromPoolAsync / cudaFreeAsync on
    // stream_): a freed scratch is reused by the next apply without a cudaMalloc, a cudaFree or a device
    // sync; up to keep_ bytes of it stay reserved across syncs, the rest goes back to the driver.
    int device = 0;
    MXQ_CUDA_CHECK(cudaGetDevice(&device));
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    MXQ_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
    uint64_t keep = keep_;
    MXQ_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return {};
  }

  cudaStream_t stream() const { return stream_; }
  void set_reread(bool r) { reread_ = r, last_write_.reset(); }
  bool reread() const { return reread_; }
  void set_staged(bool on) { staged_ = on, last_write_.reset(); }
  void set_warp(bool on) { warp_ = on, last_write_.reset(); }
  void set_incremental(bool on) {
    last_write_.reset();
    incremental_ = on && batched_;
    if (!on) kept_.forget_all(stream_);
  }
  std::string_view name() const override { return "cuda"; }
  bool on_device() const override { return true; }

  Result<std::span<uint8_t>> allocate_plane(const PlaneLayout& l) override {
    const auto bytes = static_cast<size_t>(l.native_bytes);
    if (bytes == 0) return std::span<uint8_t>{};
    last_write_.reset();
    auto buf = DeviceBuffer::alloc(bytes);
    if (!buf) {
      // note: the scratch pool may hold freed memory up to keep_ bytes: hand it back and try once more.
      cudaGetLastError();
      trim_pool();
      buf = DeviceBuffer::alloc(bytes);
    }
    if (!buf) return tl::unexpected(buf.error());
    MXQ_CUDA_CHECK(cudaMemsetAsync(buf->as(), 0, bytes, stream_));
    Plane p;
    p.run = plane_run(l);
    if (l.kind == PlaneKind::kSeparable) {
      auto rows = upload_table(l.row_off), cols = upload_table(l.col_off);
      if (!rows) return tl::unexpected(rows.error());
      if (!cols) return tl::unexpected(cols.error());
      p.row_off = std::move(*rows), p.col_off = std::move(*cols);
      std::vector<int32_t> runs;
      if (plane_run_table(l, p.run, runs)) {
        auto t = DeviceBuffer::alloc(runs.size() * sizeof(int32_t));
        if (!t) return tl::unexpected(t.error());
        MXQ_CUDA_CHECK(cudaMemcpyAsync(t->as(), runs.data(), runs.size() * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream_));
        p.cols = std::move(*t);
        p.transpose4 = plane_is_transpose4(l, p.run);
        p.rows_contiguous = plane_rows_contiguous(l);
        p.row0 = l.row_off.empty() ? 0 : l.row_off[0];
      }
    }
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    auto* ptr = buf->as<uint8_t>();
    p.buffer = std::move(*buf);
    planes_.emplace(ptr, std::move(p));
    return std::span<uint8_t>{ptr, bytes};
  }
  void free_plane(std::span<uint8_t> native) override {
    last_write_.reset();
    uint64_t off = 0;
    if (SumRecord* r = kept_.record_of(native.data(), off)) kept_.forget(r->values, stream_);
    planes_.erase(native.data());
  }

  Result<std::span<uint8_t>> allocate_scratch(size_t bytes) override {
    if (bytes > limit_ || scratch_used_ > limit_ - bytes)
      return fail("device scratch of {} bytes refused: {} of the {} allowed are in use", bytes, scratch_used_,
                  limit_);
    if (bytes == 0) return std::span<uint8_t>{};
    void* ptr = nullptr;
    cudaError_t e = cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream_);
    if (e == cudaErrorMemoryAllocation) {
      // note: memory this pool keeps is its own to reuse; only memory held elsewhere can make this fail, so
      // one retry after handing back what it keeps (and what other pools keep, via the sync) is all there is.
      cudaGetLastError();
      trim_pool();
      e = cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream_);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      return fail("device scratch of {} bytes: cudaMallocFromPoolAsync failed: {}", bytes,
                  cudaGetErrorName(e));
    }
    scratch_used_ += bytes;
    scratch_.emplace(static_cast<uint8_t*>(ptr), bytes);
    return std::span<uint8_t>{static_cast<uint8_t*>(ptr), bytes};
  }
  void free_scratch(std::span<uint8_t> s) override {
    auto it = scratch_.find(s.data());
    if (it == scratch_.end()) return;
    // note: stream-ordered: kernels queued before on stream_ still read it; a later allocation on stream_
    // reuses it only after them. No sync.
    cudaFreeAsync(it->first, stream_);
    scratch_used_ -= it->second;
    scratch_.erase(it);
  }
  // Bytes of scratch in use, and bytes the pool holds reserved (in use or kept for reuse); tests.
  size_t scratch_in_use() const { return scratch_used_; }
  size_t scratch_reserved() const {
    uint64_t v = 0;
    if (pool_) cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &v);
    return static_cast<size_t>(v);
  }
  void trim_pool() {
    if (!pool_) return;
    cudaStreamSynchronize(stream_);
    cudaMemPoolTrimTo(pool_, 0);
  }
  Status upload(std::span<const uint8_t> host, std::span<uint8_t> dst) override {
    if (host.size() != dst.size()) return fail("upload of {} bytes into {}", host.size(), dst.size());
    if (!host.empty())
      MXQ_CUDA_CHECK(cudaMemcpyAsync(dst.data(), host.data(), host.size(), cudaMemcpyDefault, stream_));
    return {};
  }

  Status write_plane(const PlaneLayout& l, std::span<const uint8_t> canonical,
                     std::span<uint8_t> native) override {
    if (auto s = check_sizes(l, canonical.size(), native.size()); !s) return s;
    if (canonical.empty()) return {};
    kept_.invalidate(native.data());
    if (l.kind == PlaneKind::kIdentity) {
      MXQ_CUDA_CHECK(
          cudaMemcpyAsync(native.data(), canonical.data(), canonical.size(), cudaMemcpyDefault, stream_));
      return {};
    }
    const uint8_t* src = canonical.data();
    if (!is_device(src)) {
      auto st = stage(canonical.size());
      if (!st) return tl::unexpected(st.error());
      MXQ_CUDA_CHECK(cudaMemcpyAsync(*st, src, canonical.size(), cudaMemcpyDefault, stream_));
      src = *st;
    }
    if (native.size() > canonical.size())
      MXQ_CUDA_CHECK(cudaMemsetAsync(native.data(), 0, native.size(), stream_));
    auto p = device_plane(l, native);
    if (!p) return tl::unexpected(p.error());
    MXQ_CUDA_CHECK(launch_plane_write(*p, src, stream_));
    return {};
  }

  Status read_plane(const PlaneLayout& l, std::span<const uint8_t> native,
                    std::span<uint8_t> canonical) override {
    if (auto s = check_sizes(l, canonical.size(), native.size()); !s) return s;
    if (canonical.empty()) return {};
    const bool to_device = is_device(canonical.data());
    if (l.kind == PlaneKind::kIdentity) {
      MXQ_CUDA_CHECK(
          cudaMemcpyAsync(canonical.data(), native.data(), canonical.size(), cudaMemcpyDefault, stream_));
    } else {
      auto p = device_plane(l, native);
      if (!p) return tl::unexpected(p.error());
      uint8_t* dst = canonical.data();
      if (!to_device) {
        auto st = stage(canonical.size());
        if (!st) return tl::unexpected(st.error());
        dst = *st;
      }
      MXQ_CUDA_CHECK(launch_plane_read(*p, dst, stream_));
      if (!to_device)
        MXQ_CUDA_CHECK(
            cudaMemcpyAsync(canonical.data(), dst, canonical.size(), cudaMemcpyDeviceToHost, stream_));
    }
    if (!to_device) MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return {};
  }

  Status scatter(const PlaneLayout& l, std::span<const int64_t> indices, int entry_bytes,
                 std::span<const uint8_t> bytes, std::span<uint8_t> undo, std::span<uint8_t> native,
                 std::string_view what) override {
    return scatter_any(l, indices, entry_bytes, bytes, undo, native, what);
  }
  Status scatter32(const PlaneLayout& l, std::span<const int32_t> indices, int entry_bytes,
                   std::span<const uint8_t> bytes, std::span<uint8_t> undo, std::span<uint8_t> native,
                   std::string_view what) override {
    return scatter_any(l, indices, entry_bytes, bytes, undo, native, what);
  }

  std::span<uint8_t> host_staging(size_t bytes) override {
    // note: a queued upload may still read the buffer that growing frees
    if (pinned_.capacity() < bytes) cudaStreamSynchronize(stream_);
    uint8_t* p = pinned_.get(bytes);
    return p ? std::span<uint8_t>{p, bytes} : std::span<uint8_t>{};
  }

  Result<std::optional<SparseRefusal>> decode_sparse(std::span<const SparsePlaneJob> jobs,
                                                     std::span<uint8_t> positions) override {
    auto table = upload_sparse_jobs(jobs, positions, nullptr, lookup_plane(), job_table_, stream_);
    if (!table) return tl::unexpected(table.error());
    if (jobs.empty()) return std::optional<SparseRefusal>{};
    const size_t scan_bytes = 2 * (table->chunks + 1) * sizeof(uint64_t);
    if (auto g = grow_buffer(decode_scan_, scan_bytes, stream_, "sparse decode scratch"); !g)
      return tl::unexpected(g.error());
    auto* error = decode_error_.as<unsigned long long>();
    const bool runs = std::any_of(jobs.begin(), jobs.end(),
                                  [](const SparsePlaneJob& j) { return j.encoding == 2 && j.count > 0; });
    MXQ_CUDA_CHECK(launch_sparse_decode(table->jobs, table->first_entry, table->first_chunk,
                                        static_cast<int>(jobs.size()), table->chunks, table->entries, runs,
                                        decode_scan_.as<uint64_t>(),
                                        reinterpret_cast<int32_t*>(positions.data()), error, stream_));
    // note: the one device-to-host read of the decode: the error word (then reset for the scatters).
    unsigned long long key = 0;
    MXQ_CUDA_CHECK(cudaMemcpyAsync(&key, error, sizeof key, cudaMemcpyDeviceToHost, stream_));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (key == ~0ull) return std::optional<SparseRefusal>{};
    MXQ_CUDA_CHECK(cudaMemsetAsync(error, 0xFF, sizeof key, stream_));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return std::optional<SparseRefusal>{
        SparseRefusal{static_cast<size_t>(key >> 32), static_cast<int64_t>(key & 0xFFFFFFFFull)}};
  }

  Status scatter_sparse(std::span<const SparsePlaneJob> jobs, std::span<const uint8_t> positions) override {
    auto table = upload_sparse_jobs(jobs, positions, incremental_ ? &kept_ : nullptr, lookup_plane(),
                                    job_table_, stream_);
    if (!table) return tl::unexpected(table.error());
    if (jobs.empty()) return {};
    const auto* pos = reinterpret_cast<const int32_t*>(positions.data());
    const int n = static_cast<int>(jobs.size());
    // note: one pass: scatter, undo capture and the kept sums' update (refit_scatter.cu).
    MXQ_CUDA_CHECK(
        launch_sparse_scatter_batch(table->jobs, table->first_entry, n, table->entries, pos, stream_));
    return {};
  }

  Result<std::optional<SparseRefusal>> check_planes(std::span<const PlaneCheckJob> jobs) override {
    std::vector<PlaneCheckDevice> dev;
    std::vector<size_t> job_index;
    uint64_t chunks = 0;
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (jobs[j].policy == NewBytePolicy::kNone || jobs[j].bytes.empty()) continue;
      if (!is_device(jobs[j].bytes.data()))
        return fail("check_planes: job {} is not in device memory", j);
      dev.push_back({jobs[j].bytes.data(), jobs[j].bytes.size(), chunks, static_cast<uint8_t>(jobs[j].policy)});
      job_index.push_back(j);
      chunks += (jobs[j].bytes.size() + 15) / 16;
    }
    if (dev.empty()) return std::optional<SparseRefusal>{};
    const size_t table_bytes = dev.size() * sizeof(PlaneCheckDevice);
    auto st = stage(table_bytes);
    if (!st) return tl::unexpected(st.error());
    MXQ_CUDA_CHECK(cudaMemcpyAsync(*st, dev.data(), table_bytes, cudaMemcpyHostToDevice, stream_));
    auto* error = decode_error_.as<unsigned long long>();
    MXQ_CUDA_CHECK(launch_check_planes(reinterpret_cast<const PlaneCheckDevice*>(*st),
                                       static_cast<int>(dev.size()), chunks, error, stream_));
    unsigned long long key = 0;
    MXQ_CUDA_CHECK(cudaMemcpyAsync(&key, error, sizeof key, cudaMemcpyDeviceToHost, stream_));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (key == ~0ull) return std::optional<SparseRefusal>{};
    MXQ_CUDA_CHECK(cudaMemsetAsync(error, 0xFF, sizeof key, stream_));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const uint64_t mask = (uint64_t{1} << kCheckPositionBits) - 1;
    return std::optional<SparseRefusal>{SparseRefusal{job_index[static_cast<size_t>(key >> kCheckPositionBits)],
                                                      static_cast<int64_t>(key & mask)}};
  }

  // XXH3-64 of canonical planes in device memory this memory did not allocate (cuda::canonical_checksums).
  Status canonical_sums(std::span<const CanonicalSumJob> jobs) {
    std::vector<ChecksumJobDevice> dev;
    for (const CanonicalSumJob& j : jobs) {
      for (auto span : {j.values, j.scales})
        if (!span.empty() && !is_device(span.data()))
          return fail("canonical_checksums: a plane at {} is not device memory", fmt::ptr(span.data()));
      ChecksumJobDevice d;
      d.values.native = const_cast<uint8_t*>(j.values.data());
      d.values.rows = 1, d.values.row_bytes = static_cast<int64_t>(j.values.size()), d.values.run = 16;
      d.scales.native = const_cast<uint8_t*>(j.scales.data());
      d.scales.rows = 1, d.scales.row_bytes = static_cast<int64_t>(j.scales.size()), d.scales.run = 16;
      dev.push_back(d);
    }
    std::vector<uint64_t*> outs;
    for (const CanonicalSumJob& j : jobs) outs.push_back(j.out);
    return run_two_pass(dev, outs);
  }

  bool host_pinned(std::span<const uint8_t> bytes) const override {
    if (bytes.empty()) return false;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, bytes.data()) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    // note: the whole span must be one page-locked allocation; the last byte is checked too.
    cudaPointerAttributes b{};
    if (cudaPointerGetAttributes(&b, bytes.data() + bytes.size() - 1) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeHost && b.type == cudaMemoryTypeHost;
  }

  template <class I>
  Status scatter_any(const PlaneLayout& l, std::span<const I> indices, int entry_bytes,
                     std::span<const uint8_t> bytes, std::span<uint8_t> undo, std::span<uint8_t> native,
                     std::string_view what) {
    if (indices.empty()) return {};
    auto p = device_plane(l, native);
    if (!p) return tl::unexpected(p.error());
    // note: host spans go through one staging buffer [indices | bytes | undo], each part 16-byte aligned.
    const size_t ib = indices.size_bytes(), bb = bytes.size(), ub = undo.size();
    const bool host_idx = !is_device(indices.data()), host_bytes = !is_device(bytes.data()),
               host_undo = !undo.empty() && !is_device(undo.data());
    const size_t staged =
        (host_idx ? up16(ib) : 0) + (host_bytes ? up16(bb) : 0) + (host_undo ? up16(ub) : 0);
    const I* d_idx = indices.data();
    const uint8_t* d_bytes = bytes.data();
    uint8_t* d_undo = undo.empty() ? nullptr : undo.data();
    if (staged > 0) {
      auto st = stage(staged);
      if (!st) return tl::unexpected(st.error());
      uint8_t* at = *st;
      if (host_idx) {
        MXQ_CUDA_CHECK(cudaMemcpyAsync(at, indices.data(), ib, cudaMemcpyHostToDevice, stream_));
        d_idx = reinterpret_cast<const I*>(at), at += up16(ib);
      }
      if (host_bytes) {
        MXQ_CUDA_CHECK(cudaMemcpyAsync(at, bytes.data(), bb, cudaMemcpyHostToDevice, stream_));
        d_bytes = at, at += up16(bb);
      }
      if (host_undo) d_undo = at;
    }
    const auto call = static_cast<uint32_t>(calls_.size());
    calls_.emplace_back(what);
    const int64_t entries = l.canonical.bytes() / entry_bytes;
    auto* status = status_.as<unsigned long long>();
    const auto count = static_cast<int64_t>(indices.size());
    constexpr int kWidth = sizeof(I);
    MXQ_CUDA_CHECK(launch_sparse_check(d_idx, kWidth, count, entries, call, status, stream_));
    MXQ_CUDA_CHECK(
        launch_sparse_scatter(*p, d_idx, kWidth, count, entry_bytes, d_bytes, d_undo, status, stream_));
    uint64_t stream_off = 0;
    if (SumRecord* rec = incremental_ ? kept_.record_of(native.data(), stream_off) : nullptr;
        rec && rec->valid) {
      // note: without the old bytes the kept sums cannot follow: the next checksum re-reads the tensor.
      if (d_undo)
        MXQ_CUDA_CHECK(launch_sum_delta(*p, d_idx, kWidth, count, entry_bytes, d_undo, stream_off, rec->len,
                                        rec->sums.as<uint64_t>(), status, stream_));
      else
        rec->valid = false;
    }
    if (host_undo) MXQ_CUDA_CHECK(cudaMemcpyAsync(undo.data(), d_undo, ub, cudaMemcpyDeviceToHost, stream_));
    // note: a call that staged host spans is synchronous, and reports its own refusal.
    if (staged > 0) return sync();
    return {};
  }

  Status checksums(std::span<const ChecksumJob> jobs) override {
    if (jobs.empty()) return sync();
    if (!batched_) return checksums_two_pass(jobs);
    // note: tensors the batched kernel takes are hashed there (one pass, chains hidden); the rest (short,
    // ragged or odd layouts) by the two-kernel path below.
    std::vector<BatchItem> batch, chains;
    std::vector<ChecksumJob> rest;
    for (const ChecksumJob& j : jobs) {
      auto v = device_plane(*j.values_layout, j.values), s = device_plane(*j.scales_layout, j.scales);
      if (!v) return tl::unexpected(v.error());
      if (!s) return tl::unexpected(s.error());
      uint64_t off = 0;
      SumRecord* rec = incremental_ && !reread_ && v->native ? kept_.record_of(v->native, off) : nullptr;
      if (batch_eligible(*v, *s) && rec && rec->valid && rec->scales == s->native &&
          rec->len == static_cast<uint64_t>(v->bytes() + s->bytes()))
        chains.push_back({*v, *s, nullptr, nullptr, j.out});
      else if (batch_eligible(*v, *s))
        batch.push_back({*v, *s, nullptr, nullptr, j.out});
      else
        rest.push_back(j);
    }
    if (auto s = run_batch(Mode::kChains, chains); !s) return s;
    if (auto s = run_batch(Mode::kHash, batch); !s) return s;
    return checksums_two_pass(rest);
  }

  Status write_tensors(std::span<const TensorWriteJob> jobs) override {
    if (!batched_) return WeightMemory::write_tensors(jobs);
    // note: the same jobs as the last full write (layouts, live planes, sources, results: an RL trainer
    // refits from the same receive buffers every step) run its batch again: the descriptors and the tile map
    // are still on the device, so only the kernels are launched (no per-tensor host work).
    std::vector<uintptr_t> key;
    key.reserve(jobs.size() * 11);
    for (const TensorWriteJob& j : jobs)
      for (uintptr_t w :
           {reinterpret_cast<uintptr_t>(j.values_layout), reinterpret_cast<uintptr_t>(j.values_src.data()),
            uintptr_t{j.values_src.size()}, reinterpret_cast<uintptr_t>(j.values.data()),
            uintptr_t{j.values.size()}, reinterpret_cast<uintptr_t>(j.scales_layout),
            reinterpret_cast<uintptr_t>(j.scales_src.data()), uintptr_t{j.scales_src.size()},
            reinterpret_cast<uintptr_t>(j.scales.data()), uintptr_t{j.scales.size()},
            reinterpret_cast<uintptr_t>(j.out)})
        key.push_back(w);
    DeviceRanges ranges;
    // note: the sources must still be device memory (a freed buffer's addresses may since hold host memory).
    auto on_device = [&](std::span<const uint8_t> b) { return b.empty() || ranges.is_device(b.data()); };
    if (last_write_ && key == last_key_ &&
        std::all_of(jobs.begin(), jobs.end(), [&](const TensorWriteJob& j) {
          return on_device(j.values_src) && on_device(j.scales_src);
        }))
      return launch_batch(*last_write_);
    last_write_.reset();
    std::vector<BatchItem> direct;                                    // device sources, batched
    std::vector<std::pair<BatchItem, const TensorWriteJob*>> staged;  // host sources, batched via staging
    std::vector<TensorWriteJob> rest;
    for (const TensorWriteJob& j : jobs) {
      if (auto s = check_sizes(*j.values_layout, j.values_src.size(), j.values.size()); !s)
        return fail_in(j.name, s.error());
      if (auto s = check_sizes(*j.scales_layout, j.scales_src.size(), j.scales.size()); !s)
        return fail_in(j.name, s.error());
      auto v = device_plane(*j.values_layout, j.values), s = device_plane(*j.scales_layout, j.scales);
      if (!v) return fail_in(j.name, v.error());
      if (!s) return fail_in(j.name, s.error());
      // note: native padding is zero from allocation and no write touches it, so no memset is needed here.
      const bool padded = j.values.size() > j.values_src.size() || j.scales.size() > j.scales_src.size();
      if (!batch_eligible(*v, *s) || padded) {
        rest.push_back(j);
        continue;
      }
      // note: an empty plane is neither host nor device memory.
      const int on_dev = (!j.values_src.empty() && ranges.is_device(j.values_src.data())) +
                         (!j.scales_src.empty() && ranges.is_device(j.scales_src.data()));
      const int on_host = !j.values_src.empty() + !j.scales_src.empty() - on_dev;
      const bool aligned = reinterpret_cast<uintptr_t>(j.values_src.data()) % 16 == 0 &&
                           reinterpret_cast<uintptr_t>(j.scales_src.data()) % 16 == 0;
      BatchItem item{*v, *s, j.values_src.data(), j.scales_src.data(), j.out};
      if (on_host == 0 && aligned)
        direct.push_back(item);
      else if (on_dev == 0)
        staged.push_back({item, &j});
      else
        rest.push_back(j);
    }
    if (!direct.empty() && direct.size() == jobs.size() && !reread_) {
      auto b = prepare_batch(Mode::kWrite, direct);
      if (!b) return tl::unexpected(b.error());
      if (auto s = launch_batch(*b); !s) return s;
      last_write_ = std::move(*b), last_key_ = std::move(key);
      return {};
    }
    if (auto s = run_batch(Mode::kWrite, direct); !s) return s;
    // Host sources: groups of at most stage_cap_ bytes (or one tensor) copied into the staging buffer, then
    // one batch each; one stream keeps a group's copy behind the previous group's kernel.
    auto staged_bytes = [&](size_t k) {
      return up16(staged[k].second->values_src.size()) + up16(staged[k].second->scales_src.size());
    };
    size_t cap = stage_cap_;
    for (size_t k = 0; k < staged.size(); ++k) cap = std::max(cap, staged_bytes(k));
    for (size_t g = 0; g < staged.size();) {
      size_t bytes = 0, end = g;
      while (end < staged.size() && (end == g || bytes + staged_bytes(end) <= cap))
        bytes += staged_bytes(end++);
      auto st = stage(bytes);
      if (!st) return tl::unexpected(st.error());
      std::vector<BatchItem> group;
      uint8_t* at = *st;
      for (size_t k = g; k < end; ++k) {
        BatchItem item = staged[k].first;
        const TensorWriteJob& j = *staged[k].second;
        for (auto [src, dst] :
             {std::pair{j.values_src, &item.values_src}, std::pair{j.scales_src, &item.scales_src}}) {
          if (!src.empty())
            MXQ_CUDA_CHECK(cudaMemcpyAsync(at, src.data(), src.size(), cudaMemcpyHostToDevice, stream_));
          *dst = at;
          at += up16(src.size());
        }
        group.push_back(item);
      }
      if (auto s = run_batch(Mode::kWrite, group); !s) return s;
      g = end;
    }
    if (!rest.empty())
      if (auto s = WeightMemory::write_tensors(rest); !s) return s;
    if (reread_) {
      // note: the checksum_from_live option: the fused sums are replaced by a re-read of the live planes.
      std::vector<ChecksumJob> live;
      for (const TensorWriteJob& j : jobs)
        live.push_back({j.values_layout, j.values, j.scales_layout, j.scales, j.out});
      return checksums(live);
    }
    return sync();
  }

  Status checksums_two_pass(std::span<const ChecksumJob> jobs) {
    if (jobs.empty()) return sync();
    std::vector<ChecksumJobDevice> dev;
    for (const ChecksumJob& j : jobs) {
      ChecksumJobDevice d;
      auto v = device_plane(*j.values_layout, j.values), s = device_plane(*j.scales_layout, j.scales);
      if (!v) return tl::unexpected(v.error());
      if (!s) return tl::unexpected(s.error());
      d.values = *v, d.scales = *s;
      dev.push_back(d);
    }
    std::vector<uint64_t*> outs;
    for (const ChecksumJob& j : jobs) outs.push_back(j.out);
    return run_two_pass(dev, outs);
  }

  // The two-kernel hash of jobs whose planes are described for the device (block sums, then the finish);
  // each job's stream length and first block are set here.
  Status run_two_pass(std::vector<ChecksumJobDevice>& dev, std::span<uint64_t* const> outs) {
    if (dev.empty()) return sync();
    uint64_t blocks = 0;
    for (ChecksumJobDevice& d : dev) {
      d.len = static_cast<uint64_t>(d.values.bytes() + d.scales.bytes());
      d.first_block = blocks;
      blocks += xxh3_job_blocks(d.len);
    }
    const size_t job_bytes = dev.size() * sizeof(ChecksumJobDevice), out_bytes = dev.size() * 8;
    const size_t sum_bytes = static_cast<size_t>(blocks) * 64;
    auto st = stage(sum_bytes + job_bytes + out_bytes + 32);
    if (!st) return tl::unexpected(st.error());
    auto* sums = reinterpret_cast<uint64_t*>(*st);
    auto* d_jobs = reinterpret_cast<ChecksumJobDevice*>(*st + sum_bytes);
    auto* d_out = reinterpret_cast<uint64_t*>(*st + (sum_bytes + job_bytes + 15) / 16 * 16);
    MXQ_CUDA_CHECK(cudaMemcpyAsync(d_jobs, dev.data(), job_bytes, cudaMemcpyHostToDevice, stream_));
    MXQ_CUDA_CHECK(launch_xxh3_block_sums(d_jobs, static_cast<int>(dev.size()), blocks, sums, stream_));
    MXQ_CUDA_CHECK(launch_xxh3_finish(d_jobs, static_cast<int>(dev.size()), sums, d_out, stream_));
    std::vector<uint64_t> out(dev.size());
    MXQ_CUDA_CHECK(cudaMemcpyAsync(out.data(), d_out, out_bytes, cudaMemcpyDeviceToHost, stream_));
    if (auto s = sync(); !s) return s;
    for (size_t k = 0; k < outs.size(); ++k) *outs[k] = out[k];
    return {};
  }

  Status sync() override {
    // note: into pinned memory, so the copy queues behind the stream's work and one synchronize waits for
    // both (a pageable destination makes the copy itself wait for the stream: two round trips).
    MXQ_CUDA_CHECK(
        cudaMemcpyAsync(status_host_, status_.as(), sizeof *status_host_, cudaMemcpyDeviceToHost, stream_));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const unsigned long long status = *status_host_;
    // note: the pool's release threshold acts at syncs too; trimming here makes "at most keep_ bytes kept
    // after a sync" hold whatever the driver's heuristics (no work when less is reserved).
    if (scratch_reserved() > keep_) MXQ_CUDA_CHECK(cudaMemPoolTrimTo(pool_, keep_));
    std::vector<std::string> calls = std::move(calls_);
    calls_.clear();
    if (status == ~0ull) return {};
    MXQ_CUDA_CHECK(cudaMemsetAsync(status_.as(), 0xFF, sizeof status, stream_));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const size_t call = static_cast<size_t>(status >> 32);
    return fail(
        "{}: entry at position {} is outside the plane or does not follow its predecessor (expected "
        "strictly increasing indices); nothing of this call or later ones was written",
        call < calls.size() ? calls[call] : std::string("sparse write"), status & 0xFFFFFFFFull);
  }

 private:
  struct Plane {
    DeviceBuffer buffer, row_off, col_off, cols;
    int run = 16;
    bool transpose4 = false, rows_contiguous = false;
    int64_t row0 = 0;
  };

  struct BatchItem {
    DevicePlane values, scales;
    const uint8_t *values_src = nullptr, *scales_src = nullptr;
    uint64_t* out = nullptr;
  };
  static size_t up16(size_t n) { return (n + 15) / 16 * 16; }

  // One launch of the batched kernel over `items` (write: from their sources; chains: the chains alone over
  // kept block sums), results into *out.
  // note: tensors go largest first, so the longest scramble chains start early and overlap the rest.
  enum class Mode { kWrite, kHash, kChains };
  // A batch on the device: its descriptors (and tile map) in meta_, what launch_batch needs to run it.
  struct Batch {
    Mode mode = Mode::kWrite;
    bool by_warps = false;
    uint32_t tiles = 0;
    BatchTensorDevice* d_tensors = nullptr;
    uint32_t* d_map = nullptr;
    unsigned* d_counters = nullptr;
    uint64_t* d_out = nullptr;
    std::vector<BatchTensorDevice> dev;  // the descriptors (host copy)
    std::vector<uint64_t*> outs;         // per tensor: where its checksum goes
    std::vector<SumRecord*> kept;        // per tensor: its kept sums (incremental checksums), or null
  };
  Status run_batch(Mode mode, std::vector<BatchItem>& items) {
    if (items.empty()) return {};
    auto b = prepare_batch(mode, items);
    if (!b) return tl::unexpected(b.error());
    return launch_batch(*b);
  }
  // Sorts the items, builds their descriptors and uploads them into meta_ (the last full write's cached
  // batch, which also lives there, is dropped).
  Result<Batch> prepare_batch(Mode mode, std::vector<BatchItem>& items) {
    last_write_.reset();
    std::stable_sort(items.begin(), items.end(), [](const BatchItem& a, const BatchItem& b) {
      return a.values.bytes() + a.scales.bytes() > b.values.bytes() + b.scales.bytes();
    });
    std::vector<BatchTensorDevice> dev;
    std::vector<SumRecord*> kept;  // per item: its kept sums (incremental checksums), or null
    std::vector<uint64_t> first_block;
    uint64_t blocks = 0, tiles = 0;
    for (const BatchItem& it : items) {
      BatchTensorDevice d;
      d.values = it.values, d.scales = it.scales;
      d.values_src = it.values_src, d.scales_src = it.scales_src;
      d.len = static_cast<uint64_t>(it.values.bytes() + it.scales.bytes());
      d.first_tile = static_cast<uint32_t>(tiles);
      d.values_tiles = batch_tiles(it.values.bytes());
      d.tiles = d.values_tiles + batch_tiles(it.scales.bytes());
      SumRecord* rec = incremental_
                           ? kept_.record_for(it.values.native, it.scales.native,
                                              static_cast<uint64_t>(it.values.bytes()), d.len, stream_)
                           : nullptr;
      kept.push_back(rec);
      first_block.push_back(blocks);
      if (!rec) blocks += xxh3_job_blocks(d.len);
      tiles += d.tiles;
      dev.push_back(d);
    }
    if (tiles > 0xFFFFFFFFull) return fail("a checksum batch of {} tiles (at most 2^32 - 1)", tiles);
    Batch b;
    b.mode = mode, b.tiles = static_cast<uint32_t>(tiles), b.kept = std::move(kept);
    const size_t n = dev.size();
    const size_t tensor_bytes = up16(n * sizeof(BatchTensorDevice)), map_bytes = up16(tiles * 4),
                 counter_bytes = up16(n * 4), out_bytes = up16(n * 8), sum_bytes = blocks * 64;
    const size_t need = tensor_bytes + map_bytes + counter_bytes + out_bytes + sum_bytes;
    if (auto g = grow_buffer(meta_, need, stream_, "refit batch scratch"); !g)
      return tl::unexpected(g.error());
    uint8_t* base = meta_.as<uint8_t>();
    auto* d_tensors = reinterpret_cast<BatchTensorDevice*>(base);
    auto* d_map = reinterpret_cast<uint32_t*>(base + tensor_bytes);
    auto* d_counters = reinterpret_cast<unsigned*>(base + tensor_bytes + map_bytes);
    auto* d_out = reinterpret_cast<uint64_t*>(base + tensor_bytes + map_bytes + counter_bytes);
    auto* d_sums = reinterpret_cast<uint64_t*>(base + tensor_bytes + map_bytes + counter_bytes + out_bytes);
    for (size_t k = 0; k < n; ++k)
      dev[k].sums = b.kept[k] ? b.kept[k]->sums.as<uint64_t>() : d_sums + first_block[k] * 8;
    // note: the descriptors go through pinned memory (a pageable copy waits for the stream and stages).
    uint8_t* host = table_.get(tensor_bytes);
    if (!host) return fail("pinned host memory of {} bytes for a refit batch", tensor_bytes);
    std::memcpy(host, dev.data(), n * sizeof(BatchTensorDevice));
    MXQ_CUDA_CHECK(
        cudaMemcpyAsync(d_tensors, host, n * sizeof(BatchTensorDevice), cudaMemcpyHostToDevice, stream_));
    // note: the warp write takes identity and GEMV transpose4 planes; a batch with another layout (or past
    // its tile cap) takes refit_batch.cu's kernels.
    b.by_warps = mode == Mode::kWrite && warp_ && tiles <= kMaxWarpTiles &&
                 std::all_of(dev.begin(), dev.end(), [](const BatchTensorDevice& d) {
                   return batch_warp_plane_ok(d.values) && batch_warp_plane_ok(d.scales);
                 });
    b.d_tensors = d_tensors, b.d_map = d_map, b.d_counters = d_counters, b.d_out = d_out;
    b.dev = std::move(dev);
    for (const BatchItem& it : items) b.outs.push_back(it.out);
    return b;
  }
  // Runs a prepared batch, results into its outs.
  Status launch_batch(const Batch& b) {
    const int n = static_cast<int>(b.dev.size());
    if (b.mode == Mode::kChains)
      MXQ_CUDA_CHECK(launch_refit_chains(b.d_tensors, n, b.d_out, stream_));
    else if (b.by_warps) {
      if (!side_) MXQ_CUDA_CHECK(warp_chain_streams_create(&side_));
      MXQ_CUDA_CHECK(
          launch_refit_warp(b.d_tensors, b.dev.data(), n, b.tiles, b.d_map, b.d_out, side_, stream_));
    } else
      MXQ_CUDA_CHECK(launch_refit_batch(b.mode == Mode::kWrite, staged_, b.d_tensors, n, b.tiles, b.d_map,
                                        b.d_counters, b.d_out, stream_));
    auto* out = reinterpret_cast<uint64_t*>(results_.get(static_cast<size_t>(n) * 8));
    if (!out) return fail("pinned host memory of {} bytes for a refit batch's checksums", n * 8);
    MXQ_CUDA_CHECK(
        cudaMemcpyAsync(out, b.d_out, static_cast<size_t>(n) * 8, cudaMemcpyDeviceToHost, stream_));
    if (auto s = sync(); !s) return s;
    for (int k = 0; k < n; ++k) {
      *b.outs[k] = out[k];
      if (b.kept[k]) b.kept[k]->valid = true;
    }
    return {};
  }

  Result<DeviceBuffer> upload_table(const std::vector<int64_t>& t) {
    auto buf = DeviceBuffer::alloc(t.size() * sizeof(int64_t));
    if (!buf) return tl::unexpected(buf.error());
    if (!t.empty())
      MXQ_CUDA_CHECK(
          cudaMemcpyAsync(buf->as(), t.data(), t.size() * sizeof(int64_t), cudaMemcpyHostToDevice, stream_));
    return buf;
  }

  Status check_sizes(const PlaneLayout& l, size_t canonical, size_t native) const {
    if (static_cast<uint64_t>(l.canonical.bytes()) != canonical)
      return fail("canonical plane is {} bytes (expected {})", canonical, l.canonical.bytes());
    if (static_cast<uint64_t>(l.native_bytes) != native)
      return fail("native plane is {} bytes (expected {})", native, l.native_bytes);
    return {};
  }

  PlaneLookup lookup_plane() const {
    return [this](const PlaneLayout& l, std::span<const uint8_t> native) { return device_plane(l, native); };
  }
  Result<DevicePlane> device_plane(const PlaneLayout& l, std::span<const uint8_t> native) const {
    DevicePlane p;
    p.rows = l.canonical.rows, p.row_bytes = l.canonical.row_bytes;
    if (native.empty()) return p;
    auto it = planes_.find(native.data());
    if (it == planes_.end())
      return fail("a plane at {} that this CUDA memory did not allocate", fmt::ptr(native.data()));
    p.native = const_cast<uint8_t*>(native.data());
    p.run = it->second.run;
    if (l.kind == PlaneKind::kSeparable) {
      p.row_off = it->second.row_off.as<int64_t>();
      p.col_off = it->second.col_off.as<int64_t>();
      p.cols = it->second.cols.bytes() ? it->second.cols.as<int32_t>() : nullptr;
      p.transpose4 = it->second.transpose4;
      p.rows_contiguous = it->second.rows_contiguous;
      p.row0 = it->second.row0;
    } else {
      // note: identity offsets are the canonical index, whatever split of rows the layout records.
      p.rows = 1, p.row_bytes = l.canonical.bytes();
    }
    return p;
  }

  // One staging buffer, grown on demand; stream order keeps a later use from overtaking an earlier one.
  Result<uint8_t*> stage(size_t bytes) {
    if (auto g = grow_buffer(staging_, bytes, stream_, "staging buffer"); !g)
      return tl::unexpected(g.error());
    return staging_.as<uint8_t>();
  }

  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false;
  size_t limit_ = SIZE_MAX, scratch_used_ = 0;
  bool reread_ = false, incremental_ = false, batched_ = true, staged_ = true, warp_ = true;
  KeptSums kept_;  // incremental checksums
  size_t stage_cap_ = 0;
  DeviceBuffer meta_;
  PinnedHost table_, results_;       // a batch's descriptors and its checksums (pinned), between syncs
  std::optional<Batch> last_write_;  // the last full write's batch while meta_ still holds it
  std::vector<uintptr_t> last_key_;  // and its jobs (write_tensors)
  PinnedHost status_pinned_;
  unsigned long long* status_host_ = nullptr;  // sync()'s copy of status_, in status_pinned_
  WarpChainStreams* side_ = nullptr;           // launch_refit_warp's, made at its first use
  PinnedHost pinned_;                          // host_staging
  std::unordered_map<const uint8_t*, Plane> planes_;
  std::map<uint8_t*, size_t> scratch_;  // scratch handed out from pool_: bytes
  cudaMemPool_t pool_ = nullptr;
  size_t keep_ = 0;  // CudaMemoryOptions::scratch_keep_bytes
  DeviceBuffer status_, staging_;
  DeviceBuffer job_table_, decode_scan_, decode_error_;  // encoded sparse planes: table, prefix sums, error
  std::vector<std::string> calls_;  // names of the sparse calls since the last sync (status' call field)
};

}  // namespace

Result<std::unique_ptr<WeightMemory>> cuda_weight_memory(const CudaMemoryOptions& options) {
  auto m = std::make_unique<CudaWeightMemory>(options);
  if (auto s = m->init(); !s) return fail("CUDA weight memory: {}", s.error().message);
  return std::unique_ptr<WeightMemory>(std::move(m));
}

cudaStream_t weight_memory_stream(const WeightMemory& memory) {
  const auto* m = dynamic_cast<const CudaWeightMemory*>(&memory);
  return m ? m->stream() : nullptr;
}

Status canonical_checksums(WeightMemory& memory, std::span<const CanonicalSumJob> jobs) {
  auto* m = dynamic_cast<CudaWeightMemory*>(&memory);
  if (!m) return fail("canonical_checksums: {} memory is not a CUDA weight memory", memory.name());
  return m->canonical_sums(jobs);
}

void set_checksum_from_live(WeightMemory& memory, bool reread) {
  if (auto* m = dynamic_cast<CudaWeightMemory*>(&memory)) m->set_reread(reread);
}

bool checksum_from_live(const WeightMemory& memory) {
  const auto* m = dynamic_cast<const CudaWeightMemory*>(&memory);
  return m && m->reread();
}

void set_incremental_checksums(WeightMemory& memory, bool on) {
  if (auto* m = dynamic_cast<CudaWeightMemory*>(&memory)) m->set_incremental(on);
}

void set_staged_full_write(WeightMemory& memory, bool on) {
  if (auto* m = dynamic_cast<CudaWeightMemory*>(&memory)) m->set_staged(on);
}

void set_warp_full_write(WeightMemory& memory, bool on) {
  if (auto* m = dynamic_cast<CudaWeightMemory*>(&memory)) m->set_warp(on);
}

size_t scratch_in_use(const WeightMemory& memory) {
  const auto* m = dynamic_cast<const CudaWeightMemory*>(&memory);
  return m ? m->scratch_in_use() : 0;
}

size_t scratch_reserved(const WeightMemory& memory) {
  const auto* m = dynamic_cast<const CudaWeightMemory*>(&memory);
  return m ? m->scratch_reserved() : 0;
}

}  // namespace mxq::cuda
