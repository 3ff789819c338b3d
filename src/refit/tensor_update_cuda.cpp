#include "refit/tensor_update_cuda.h"

#include <cuda.h>  // note: the driver API's types only; its one function comes through the runtime's entry point
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "cuda/common/check.h"
#include "cuda/quantize/quantize.h"
#include "model/weight_memory_cuda.h"
#include "refit/applier.h"
#include "refit/pending_sums_cuda.h"

namespace mxq::cuda {
namespace {

uint64_t up16(uint64_t n) { return (n + 15) / 16 * 16; }

// Appends the milliseconds since `t` under `name` to `times` (when given) and restarts `t`.
void lap(refit::StageTimes* times, const char* name, std::chrono::steady_clock::time_point& t) {
  const auto now = std::chrono::steady_clock::now();
  if (times) times->emplace_back(name, std::chrono::duration<double, std::milli>(now - t).count());
  t = now;
}

// Frees a scratch span of the store's memory at scope exit.
struct ScratchGuard {
  WeightMemory& mem;
  std::span<uint8_t> bytes;
  ~ScratchGuard() {
    if (!bytes.empty()) mem.free_scratch(bytes);
  }
};

// Restores the memory's checksum mode at scope exit.
struct RereadGuard {
  WeightMemory& mem;
  bool was;
  ~RereadGuard() { set_checksum_from_live(mem, was); }
};

// The allocation range [base, base + size) holding device pointer p (cuMemGetAddressRange through the
// runtime's driver entry point, so the binary links no libcuda).
Result<std::pair<uintptr_t, size_t>> address_range(const void* p) {
  using Fn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess || !fn)
    return fail("the CUDA driver has no cuMemGetAddressRange");
  CUdeviceptr base = 0;
  size_t size = 0;
  if (CUresult r = reinterpret_cast<Fn>(fn)(&base, &size, reinterpret_cast<CUdeviceptr>(p));
      r != CUDA_SUCCESS)
    return fail("cuMemGetAddressRange failed (CUresult {})", static_cast<int>(r));
  return std::pair<uintptr_t, size_t>{static_cast<uintptr_t>(base), size};
}

}  // namespace

Status apply_device_buffer(WeightStore& store, uint64_t& live_version, uint64_t new_version,
                           const refit::TensorManifest& m, const uint8_t* buffer, refit::StageTimes* times) {
  auto t = std::chrono::steady_clock::now();
  if (!store.on_device())
    return fail("a device buffer updates a CUDA store only ({} memory)", store.memory().name());
  auto plan = refit::plan_manifest(m, refit::tensor_table(store));
  if (!plan) return tl::unexpected(plan.error());
  WeightMemory& mem = store.memory();
  const cudaStream_t stream = weight_memory_stream(mem);
  // Scratch for the planes the engine quantizes, each 16-byte aligned.
  uint64_t scratch_bytes = 0;
  for (const refit::ManifestStep& s : *plan)
    if (s.quantize)
      scratch_bytes +=
          up16(static_cast<uint64_t>(s.planes[0].bytes)) + up16(static_cast<uint64_t>(s.planes[1].bytes));
  std::span<uint8_t> scratch;
  if (scratch_bytes > 0) {
    auto got = mem.allocate_scratch(static_cast<size_t>(scratch_bytes));
    if (!got)
      return fail(
          "{} bytes for the quantized planes could not be had in {} memory ({}); nothing written (W-26)",
          scratch_bytes, mem.name(), got.error().message);
    scratch = *got;
  }
  ScratchGuard scratch_guard{mem, scratch};
  // Each tensor's canonical planes on the device: quantized into scratch, or where they sit in the buffer.
  refit::DeltaView view;
  view.base_version = live_version;
  view.new_version = new_version;
  view.resident = true;
  uint64_t at = 0;
  for (const refit::ManifestStep& s : *plan) {
    const refit::ManifestTensor& t = *s.source;
    refit::TensorView& v = view.tensors.emplace_back();
    v.name = t.name;
    v.format = s.live;
    v.shape = t.shape;
    v.anchor = true;
    const auto vb = static_cast<size_t>(s.planes[0].bytes), sb = static_cast<size_t>(s.planes[1].bytes);
    if (!s.quantize) {
      v.values.bytes = {buffer + t.offset, vb};
      if (sb > 0) v.scales.bytes = {buffer + t.scales_offset, sb};
      continue;
    }
    uint8_t* values = scratch.data() + at;
    uint8_t* scales = values + up16(vb);
    at += up16(vb) + up16(sb);
    // note: stacked experts [E, N, K] quantize matrix by matrix, as the loader does (quantize_tensor).
    const int64_t rows = t.shape[t.shape.size() - 2], cols = t.shape.back();
    const int64_t mats = static_cast<int64_t>(vb) / std::max<int64_t>(values_bytes(s.live, rows, cols), 1);
    const int64_t src_mat = rows * cols * (traits(t.dtype).element_bits / 8);
    for (int64_t e = 0; e < mats; ++e)
      if (auto q = quantize(s.live, default_scale_rule(s.live), t.dtype, buffer + t.offset + e * src_mat,
                            rows, cols, values + e * values_bytes(s.live, rows, cols),
                            scales + e * scales_bytes(s.live, rows, cols), t.name, stream);
          !q)
        return fail("{}; nothing written", q.error().message);
    v.values.bytes = {values, vb};
    v.scales.bytes = {scales, sb};
  }
  // The planes' checksums where they are, on a stream of their own behind the quantize
  // (refit/pending_sums_cuda.h): what the live tensors must hash to after the write. The undo log, the write
  // and the re-read of the live planes run beside them on the memory's stream: the two sequential XXH3 chains
  // (an embedding's is ~25 ms on the H200) overlap instead of adding up.
  std::vector<CanonicalSumJob> sums;
  for (refit::TensorView& v : view.tensors) sums.push_back({v.values.bytes, v.scales.bytes, &v.checksum});
  auto pending = PendingSums::start(sums, stream);
  if (!pending) return fail("checksums of the new planes: {}; nothing written", pending.error().message);
  lap(times, "queue", t);  // quantize and hash launched, nothing awaited
  // note: the live planes are hashed by re-reading them through their layouts, so the comparison checks the
  // write itself (hashing the bytes on their way in would compare the planes with themselves).
  RereadGuard reread{mem, checksum_from_live(mem)};
  set_checksum_from_live(mem, true);
  refit::ApplyTimings applier;
  refit::ApplyOptions options;
  options.timings = times ? &applier : nullptr;
  double await_ms = 0;
  options.await_checksums = [&]() -> Status {
    const auto t0 = std::chrono::steady_clock::now();
    if (auto s = pending->wait(); !s) return fail("checksums of the new planes: {}", s.error().message);
    await_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // note: a manifest checksum is the trainer's word for its planes; a mismatch means the buffer is not
    // what it meant (W-06), found after the write and undone like any failed verify.
    for (size_t k = 0; k < view.tensors.size(); ++k)
      if (const auto& want = (*plan)[k].source->checksum; want && *want != view.tensors[k].checksum)
        return fail("{}: its planes hash to {:016x}, the manifest says {:016x} (W-06)", view.tensors[k].name,
                    view.tensors[k].checksum, *want);
    return {};
  };
  Status s = refit::apply_delta(store, live_version, view, options);
  if (times) {
    times->emplace_back("validate", applier.validate);
    times->emplace_back("write", applier.write);  // W-05 check, undo log, batched write, re-read sums
    times->emplace_back("await sums", await_ms);  // what the trainer planes' chains outlasted the write by
    times->emplace_back("verify", applier.checksum);
  }
  return s;
}

Status apply_ipc_manifest(WeightStore& store, uint64_t& live_version, uint64_t new_version,
                          const refit::TensorManifest& m, refit::StageTimes* times) {
  auto t = std::chrono::steady_clock::now();
  cudaIpcMemHandle_t handle;
  static_assert(sizeof handle == sizeof m.ipc_handle);
  std::memcpy(&handle, m.ipc_handle.data(), sizeof handle);
  void* base = nullptr;
  if (cudaError_t e = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
    (void)cudaGetLastError();  // note: a refused handle is not sticky; clear it so later calls see no error
    return fail(
        "ipc_handle: cudaIpcOpenMemHandle refused it ({}: {}); a handle of another process's "
        "allocation on this GPU is expected",
        cudaGetErrorName(e), cudaGetErrorString(e));
  }
  struct Close {
    void* p;
    ~Close() { (void)cudaIpcCloseMemHandle(p); }
  } close{base};
  // note: the mapping's extent bounds the manifest: reading past it would fault the device, and with it the
  // engine, rather than refuse.
  auto range = address_range(base);
  if (!range) return fail("ipc_handle: {}", range.error().message);
  const uint64_t avail = range->second - (reinterpret_cast<uintptr_t>(base) - range->first);
  if (m.ipc_offset > avail || m.size > avail - m.ipc_offset)
    return fail("ipc_offset {} + size {} run past the shared allocation's {} bytes", m.ipc_offset, m.size,
                avail);
  lap(times, "open", t);
  return apply_device_buffer(store, live_version, new_version, m,
                             static_cast<const uint8_t*>(base) + m.ipc_offset, times);
}

Result<bool> apply_checkpoint_on_device(WeightStore& store, uint64_t& live_version, uint64_t new_version,
                                        const ModelCheckpoint& ckpt, refit::StageTimes* times) {
  auto t = std::chrono::steady_clock::now();
  if (!store.on_device() || ckpt.scheme.kind != SchemeKind::kNone) return false;
  // note: a tensor the store does not hold (an extra projection, a tied lm_head) is left to the host path, which
  // refuses or ignores it as a load does
  for (const auto& [name, meta] : ckpt.files.meta())
    if (!store.find(name)) return false;
  refit::TensorManifest m;
  for (const auto& [name, live] : store.tensors()) {
    const TensorEntry* e = ckpt.files.find(name);
    if (!e) return false;
    const auto dtype = plain_format(e->dtype, name);
    if (!dtype || e->shape != live.shape || (!is_quantized(live.format) && *dtype != live.format))
      return false;
    m.tensors.push_back({name, *dtype, live.shape, up16(m.size), 0, std::nullopt});
    m.size = up16(m.size) + e->nbytes();
  }
  WeightMemory& mem = store.memory();
  auto buffer = mem.allocate_scratch(static_cast<size_t>(m.size));
  if (!buffer) {
    spdlog::warn(
        "mxq serve: {} bytes of device scratch for the checkpoint could not be had ({}); it is "
        "quantized on the host instead",
        m.size, buffer.error().message);
    return false;
  }
  ScratchGuard guard{mem, *buffer};
  // note: tensor by tensor through one reused host buffer (the guarded read path, L-19), each copy awaited
  // before the buffer is refilled
  std::vector<uint8_t> host;
  const cudaStream_t stream = weight_memory_stream(mem);
  for (const refit::ManifestTensor& mt : m.tensors) {
    const TensorEntry* e = ckpt.files.find(mt.name);
    host.resize(static_cast<size_t>(e->nbytes()));
    if (auto s = ckpt.files.read(mt.name, host); !s)
      return fail("{}; nothing written", s.error().message);
    MXQ_CUDA_CHECK(cudaMemcpyAsync(buffer->data() + mt.offset, host.data(), host.size(),
                                   cudaMemcpyHostToDevice, stream));
    MXQ_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  lap(times, "read", t);
  if (auto s = apply_device_buffer(store, live_version, new_version, m, buffer->data(), times); !s)
    return tl::unexpected(s.error());
  return true;
}

}  // namespace mxq::cuda
