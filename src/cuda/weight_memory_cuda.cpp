#include "cuda/weight_memory_cuda.h"

#include <fmt/format.h>

#include <map>
#include <string>
#include <vector>

#include "cuda/check.h"
#include "cuda/refit_launch.h"

namespace mxq::cuda {
namespace {

// note: the largest R in {16, 8, 4, 2} such that every run of R canonical bytes of a row starting at a
// multiple of R lands contiguous and R-aligned; the kernels then move R bytes per load / store.
int run_of(const PlaneLayout& l) {
  if (l.kind == PlaneKind::kIdentity) return 16;
  const int64_t w = l.canonical.row_bytes;
  for (int r : {16, 8, 4, 2}) {
    bool ok = w % r == 0;
    for (size_t i = 0; ok && i < l.row_off.size(); ++i) ok = l.row_off[i] % r == 0;
    for (int64_t c = 0; ok && c < w; c += r) {
      ok = l.col_off[static_cast<size_t>(c)] % r == 0;
      for (int t = 1; ok && t < r; ++t)
        ok = l.col_off[static_cast<size_t>(c + t)] == l.col_off[static_cast<size_t>(c)] + t;
    }
    if (ok) return r;
  }
  return 1;
}

bool is_device(const void* p) {
  if (!p) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // note: older drivers flag plain host pointers; clear it
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

class CudaWeightMemory final : public WeightMemory {
 public:
  explicit CudaWeightMemory(const CudaMemoryOptions& o) : stream_(o.stream), limit_(o.scratch_limit) {}
  ~CudaWeightMemory() override {
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
    MXQ_CUDA_CHECK(cudaMemsetAsync(status_.as(), 0xFF, sizeof(unsigned long long), stream_));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return {};
  }

  cudaStream_t stream() const { return stream_; }
  std::string_view name() const override { return "cuda"; }
  bool on_device() const override { return true; }

  Result<std::span<uint8_t>> allocate_plane(const PlaneLayout& l) override {
    const auto bytes = static_cast<size_t>(l.native_bytes);
    if (bytes == 0) return std::span<uint8_t>{};
    auto buf = DeviceBuffer::alloc(bytes);
    if (!buf) return tl::unexpected(buf.error());
    MXQ_CUDA_CHECK(cudaMemsetAsync(buf->as(), 0, bytes, stream_));
    Plane p;
    p.run = run_of(l);
    if (l.kind == PlaneKind::kSeparable) {
      auto rows = upload_table(l.row_off), cols = upload_table(l.col_off);
      if (!rows) return tl::unexpected(rows.error());
      if (!cols) return tl::unexpected(cols.error());
      p.row_off = std::move(*rows), p.col_off = std::move(*cols);
    }
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    auto* ptr = buf->as<uint8_t>();
    p.buffer = std::move(*buf);
    planes_.emplace(ptr, std::move(p));
    return std::span<uint8_t>{ptr, bytes};
  }
  void free_plane(std::span<uint8_t> native) override { planes_.erase(native.data()); }

  Result<std::span<uint8_t>> allocate_scratch(size_t bytes) override {
    if (bytes > limit_ || scratch_used_ > limit_ - bytes)
      return fail("device scratch of {} bytes refused: {} of the {} allowed are in use", bytes, scratch_used_,
                  limit_);
    if (bytes == 0) return std::span<uint8_t>{};
    auto buf = DeviceBuffer::alloc(bytes);
    if (!buf) return fail("device scratch of {} bytes: {}", bytes, buf.error().message);
    auto* ptr = buf->as<uint8_t>();
    scratch_used_ += bytes;
    scratch_.emplace(ptr, std::move(*buf));
    return std::span<uint8_t>{ptr, bytes};
  }
  void free_scratch(std::span<uint8_t> s) override {
    auto it = scratch_.find(s.data());
    if (it == scratch_.end()) return;
    cudaStreamSynchronize(stream_);  // note: queued kernels may still read it
    scratch_used_ -= it->second.bytes();
    scratch_.erase(it);
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
    if (l.kind == PlaneKind::kIdentity) {
      MXQ_CUDA_CHECK(cudaMemcpyAsync(native.data(), canonical.data(), canonical.size(), cudaMemcpyDefault,
                                     stream_));
      return {};
    }
    const uint8_t* src = canonical.data();
    if (!is_device(src)) {
      auto st = stage(canonical.size());
      if (!st) return tl::unexpected(st.error());
      MXQ_CUDA_CHECK(cudaMemcpyAsync(*st, src, canonical.size(), cudaMemcpyDefault, stream_));
      src = *st;
    }
    if (native.size() > canonical.size()) MXQ_CUDA_CHECK(cudaMemsetAsync(native.data(), 0, native.size(), stream_));
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
      MXQ_CUDA_CHECK(cudaMemcpyAsync(canonical.data(), native.data(), canonical.size(), cudaMemcpyDefault,
                                     stream_));
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
        MXQ_CUDA_CHECK(cudaMemcpyAsync(canonical.data(), dst, canonical.size(), cudaMemcpyDeviceToHost, stream_));
    }
    if (!to_device) MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return {};
  }

  Status scatter(const PlaneLayout& l, std::span<const int64_t> indices, int entry_bytes,
                 std::span<const uint8_t> bytes, std::span<uint8_t> undo, std::span<uint8_t> native,
                 std::string_view what) override {
    if (indices.empty()) return {};
    auto p = device_plane(l, native);
    if (!p) return tl::unexpected(p.error());
    // note: host spans go through one staging buffer [indices | bytes | undo], each part 16-byte aligned.
    const size_t ib = indices.size_bytes(), bb = bytes.size(), ub = undo.size();
    const bool host_idx = !is_device(indices.data()), host_bytes = !is_device(bytes.data()),
               host_undo = !undo.empty() && !is_device(undo.data());
    const auto up16 = [](size_t n) { return (n + 15) / 16 * 16; };
    const size_t staged = (host_idx ? up16(ib) : 0) + (host_bytes ? up16(bb) : 0) + (host_undo ? up16(ub) : 0);
    const int64_t* d_idx = indices.data();
    const uint8_t* d_bytes = bytes.data();
    uint8_t* d_undo = undo.empty() ? nullptr : undo.data();
    if (staged > 0) {
      auto st = stage(staged);
      if (!st) return tl::unexpected(st.error());
      uint8_t* at = *st;
      if (host_idx) {
        MXQ_CUDA_CHECK(cudaMemcpyAsync(at, indices.data(), ib, cudaMemcpyHostToDevice, stream_));
        d_idx = reinterpret_cast<const int64_t*>(at), at += up16(ib);
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
    MXQ_CUDA_CHECK(launch_sparse_check(d_idx, count, entries, call, status, stream_));
    MXQ_CUDA_CHECK(launch_sparse_scatter(*p, d_idx, count, entry_bytes, d_bytes, d_undo, status, stream_));
    if (host_undo) MXQ_CUDA_CHECK(cudaMemcpyAsync(undo.data(), d_undo, ub, cudaMemcpyDeviceToHost, stream_));
    // note: a call that staged host spans is synchronous, and reports its own refusal.
    if (staged > 0) return sync();
    return {};
  }

  Status checksums(std::span<const ChecksumJob> jobs) override {
    if (jobs.empty()) return sync();
    std::vector<ChecksumJobDevice> dev;
    uint64_t blocks = 0;
    for (const ChecksumJob& j : jobs) {
      ChecksumJobDevice d;
      auto v = device_plane(*j.values_layout, j.values), s = device_plane(*j.scales_layout, j.scales);
      if (!v) return tl::unexpected(v.error());
      if (!s) return tl::unexpected(s.error());
      d.values = *v, d.scales = *s;
      d.len = static_cast<uint64_t>(d.values.bytes() + d.scales.bytes());
      d.first_block = blocks;
      blocks += xxh3_job_blocks(d.len);
      dev.push_back(d);
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
    for (size_t k = 0; k < jobs.size(); ++k) *jobs[k].out = out[k];
    return {};
  }

  Status sync() override {
    unsigned long long status = 0;
    MXQ_CUDA_CHECK(cudaMemcpyAsync(&status, status_.as(), sizeof status, cudaMemcpyDeviceToHost, stream_));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<std::string> calls = std::move(calls_);
    calls_.clear();
    if (status == ~0ull) return {};
    MXQ_CUDA_CHECK(cudaMemsetAsync(status_.as(), 0xFF, sizeof status, stream_));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const size_t call = static_cast<size_t>(status >> 32);
    return fail("{}: entry at position {} is outside the plane or does not follow its predecessor (expected "
                "strictly increasing indices); nothing of this call or later ones was written",
                call < calls.size() ? calls[call] : std::string("sparse write"), status & 0xFFFFFFFFull);
  }

 private:
  struct Plane {
    DeviceBuffer buffer, row_off, col_off;
    int run = 16;
  };

  Result<DeviceBuffer> upload_table(const std::vector<int64_t>& t) {
    auto buf = DeviceBuffer::alloc(t.size() * sizeof(int64_t));
    if (!buf) return tl::unexpected(buf.error());
    if (!t.empty())
      MXQ_CUDA_CHECK(cudaMemcpyAsync(buf->as(), t.data(), t.size() * sizeof(int64_t), cudaMemcpyHostToDevice,
                                     stream_));
    return buf;
  }

  Status check_sizes(const PlaneLayout& l, size_t canonical, size_t native) const {
    if (static_cast<uint64_t>(l.canonical.bytes()) != canonical)
      return fail("canonical plane is {} bytes (expected {})", canonical, l.canonical.bytes());
    if (static_cast<uint64_t>(l.native_bytes) != native)
      return fail("native plane is {} bytes (expected {})", native, l.native_bytes);
    return {};
  }

  Result<DevicePlane> device_plane(const PlaneLayout& l, std::span<const uint8_t> native) const {
    DevicePlane p;
    p.rows = l.canonical.rows, p.row_bytes = l.canonical.row_bytes;
    if (native.empty()) return p;
    auto it = planes_.find(native.data());
    if (it == planes_.end()) return fail("a plane at {} that this CUDA memory did not allocate", fmt::ptr(native.data()));
    p.native = const_cast<uint8_t*>(native.data());
    p.run = it->second.run;
    if (l.kind == PlaneKind::kSeparable) {
      p.row_off = it->second.row_off.as<int64_t>();
      p.col_off = it->second.col_off.as<int64_t>();
    } else {
      // note: identity offsets are the canonical index, whatever split of rows the layout records.
      p.rows = 1, p.row_bytes = l.canonical.bytes();
    }
    return p;
  }

  // One staging buffer, grown on demand; stream order keeps a later use from overtaking an earlier one.
  Result<uint8_t*> stage(size_t bytes) {
    if (staging_.bytes() < bytes) {
      MXQ_CUDA_CHECK(cudaStreamSynchronize(stream_));
      staging_ = DeviceBuffer();
      auto b = DeviceBuffer::alloc(bytes + bytes / 4);
      if (!b) return fail("staging buffer of {} bytes: {}", bytes, b.error().message);
      staging_ = std::move(*b);
    }
    return staging_.as<uint8_t>();
  }

  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false;
  size_t limit_ = SIZE_MAX, scratch_used_ = 0;
  std::map<const uint8_t*, Plane> planes_;
  std::map<const uint8_t*, DeviceBuffer> scratch_;
  DeviceBuffer status_, staging_;
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

}  // namespace mxq::cuda
