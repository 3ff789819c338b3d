// The jobs a WeightMemory runs over live planes (model/weight_memory.h): hash, full write, check of new
// bytes, sparse decode and scatter. Plain descriptions of spans and layouts, so the device code that runs
// them (cuda/refit/) needs nothing above layout/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "layout/layout.h"

namespace mxq {

// One tensor to hash: XXH3-64 of its canonical values plane then its canonical scales plane, read through
// the layouts out of the live bytes, written to *out.
struct ChecksumJob {
  const PlaneLayout* values_layout = nullptr;
  std::span<const uint8_t> values;
  const PlaneLayout* scales_layout = nullptr;
  std::span<const uint8_t> scales;
  uint64_t* out = nullptr;  // host memory
};

// One tensor's full update for write_tensors: canonical planes in (host or this memory's spans), the live
// planes written, the checksum of the updated tensor into *out (host memory).
struct TensorWriteJob {
  std::string_view name;  // for errors
  const PlaneLayout* values_layout = nullptr;
  std::span<const uint8_t> values_src;
  std::span<uint8_t> values;
  const PlaneLayout* scales_layout = nullptr;
  std::span<const uint8_t> scales_src;
  std::span<uint8_t> scales;
  uint64_t* out = nullptr;
};

// The W-05 rule for a plane's new entries (docs/refit-format.md section 6), as the device checks it.
enum class NewBytePolicy : uint8_t {
  kNone,      // E2M1 (mxfp4 values): no NaN or Inf code
  kE4M3,      // 1 byte; 0x7F / 0xFF refused
  kE8M0,      // 1 byte; 0xFF refused
  kF32Scale,  // 4 bytes; finite and > 0
  kBF16,      // 2 bytes; NaN / Inf refused
  kF16,
  kF32,
};

// Whether one entry's bytes break `policy` (host; the CUDA kernels' twin,
// cuda/refit/new_byte_policy.cuh).
bool new_entry_refused(NewBytePolicy policy, const uint8_t* entry);

// A whole new plane (an anchor written from this memory's spans) for check_planes.
struct PlaneCheckJob {
  std::span<const uint8_t> bytes;
  int entry_bytes = 1;
  NewBytePolicy policy = NewBytePolicy::kNone;
};

// One sparse plane of a refit delta with its index set still in the wire encoding (refit's device path,
// docs/refit-format.md "Device path"). `index` and `bytes` are this memory's spans (uploaded); `undo` is
// scratch of bytes.size(). `encoding` is the wire code: 0 gaps (LEB128 varints), 1 bitmap; 2 runs, given
// decoded into `index` as int32 pairs (a run's first entry, its position in the list), one per run.
struct SparsePlaneJob {
  std::string_view what;  // "NAME values", for errors
  const PlaneLayout* layout = nullptr;
  std::span<uint8_t> native;
  uint8_t encoding = 0;
  std::span<const uint8_t> index;
  int64_t count = 0;    // changed entries
  int64_t entries = 0;  // of the plane (< 2^31)
  int entry_bytes = 1;
  NewBytePolicy policy = NewBytePolicy::kNone;
  std::span<const uint8_t> bytes;
  std::span<uint8_t> undo;
};
// The first job a decode refused and the entry position (in that job's list) where it noticed.
struct SparseRefusal {
  size_t job = 0;
  int64_t position = 0;
};

}  // namespace mxq
