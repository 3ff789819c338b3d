#include "cuda/refit/sparse_job_table.h"

#include <climits>
#include <cstring>
#include <vector>

#include "cuda/refit/refit_launch.h"

namespace mxq::cuda {
namespace {
size_t up16(size_t n) { return (n + 15) / 16 * 16; }
}  // namespace

Result<SparseJobTable> upload_sparse_jobs(std::span<const SparsePlaneJob> jobs,
                                          std::span<const uint8_t> positions, KeptSums* kept,
                                          const PlaneLookup& plane, DeviceBuffer& table,
                                          cudaStream_t stream) {
  std::vector<SparseJobDevice> dev;
  std::vector<uint64_t> first_entry{0}, first_chunk{0};
  SparseJobTable t;
  for (const SparsePlaneJob& j : jobs) {
    auto p = plane(*j.layout, j.native);
    if (!p) return fail_in(j.what, p.error());
    if (j.entries > INT32_MAX) return fail("{}: {} entries need int64 positions", j.what, j.entries);
    const uint64_t eb = static_cast<uint64_t>(j.entry_bytes);
    if (j.bytes.size() != static_cast<uint64_t>(j.count) * eb ||
        (!j.undo.empty() && j.undo.size() != j.bytes.size()))
      return fail("{}: {} entries of {} bytes with {} new and {} undo bytes", j.what, j.count, j.entry_bytes,
                  j.bytes.size(), j.undo.size());
    SparseJobDevice d;
    d.plane = *p;
    d.index = j.index.data(), d.index_bytes = j.index.size();
    d.bytes = j.bytes.data(), d.undo = j.undo.empty() ? nullptr : j.undo.data();
    d.count = j.count, d.entries = j.entries, d.entry_bytes = j.entry_bytes;
    d.encoding = j.encoding, d.policy = static_cast<uint8_t>(j.policy);
    uint64_t stream_off = 0;
    if (SumRecord* rec = kept && j.count > 0 ? kept->record_of(j.native.data(), stream_off) : nullptr;
        rec && rec->valid) {
      // note: without the old bytes the kept sums cannot follow: the next checksum re-reads the tensor.
      if (d.undo) {
        d.sums = rec->sums.as<uint64_t>(), d.stream_off = stream_off, d.blocks = xxh3_job_blocks(rec->len);
      } else {
        rec->valid = false;
      }
    }
    dev.push_back(d);
    first_entry.push_back(first_entry.back() + static_cast<uint64_t>(j.count));
    const uint64_t chunks =
        j.encoding == 2 ? 0 : (j.index.size() + kDecodeChunkBytes - 1) / kDecodeChunkBytes;
    first_chunk.push_back(first_chunk.back() + chunks);
  }
  t.entries = first_entry.back(), t.chunks = first_chunk.back();
  if (positions.size() < t.entries * 4)
    return fail("{} bytes of positions for {} entries", positions.size(), t.entries);
  const size_t job_bytes = up16(dev.size() * sizeof(SparseJobDevice)),
               prefix_bytes = up16(first_entry.size() * 8);
  const size_t need = job_bytes + 2 * prefix_bytes;
  if (auto g = grow_buffer(table, need, stream, "sparse job table"); !g) return tl::unexpected(g.error());
  // note: a copy from pageable memory returns once the driver holds the bytes, so the host table may go;
  // stream order keeps the new table from overwriting one a queued kernel still reads.
  std::vector<uint8_t> host(need);
  std::memcpy(host.data(), dev.data(), dev.size() * sizeof(SparseJobDevice));
  std::memcpy(host.data() + job_bytes, first_entry.data(), first_entry.size() * 8);
  std::memcpy(host.data() + job_bytes + prefix_bytes, first_chunk.data(), first_chunk.size() * 8);
  MXQ_CUDA_CHECK(cudaMemcpyAsync(table.as(), host.data(), need, cudaMemcpyHostToDevice, stream));
  auto* base = table.as<uint8_t>();
  t.jobs = reinterpret_cast<const SparseJobDevice*>(base);
  t.first_entry = reinterpret_cast<const uint64_t*>(base + job_bytes);
  t.first_chunk = reinterpret_cast<const uint64_t*>(base + job_bytes + prefix_bytes);
  return t;
}

}  // namespace mxq::cuda
