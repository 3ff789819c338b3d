// The refit delta wire format (docs/refit-format.md is the normative text): one file takes a model from
// version `base_version` to `new_version`. Per tensor it carries the changed entries of the canonical values
// and scales planes (or both planes in full: an anchor) and the XXH3-64 of the full planes after the update.
// This file holds the in-memory delta, the reader, the writer and the engine-side validator; applying a delta
// to live weights is the applier's job.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "format/formats.h"

namespace mxq::refit {

inline constexpr char kDeltaMagic[8] = {'M', 'X', 'Q', 'D', 'E', 'L', 'T', 'A'};
inline constexpr uint32_t kWireVersion = 1;
// note: magic 8 + wire version 4 + flags 4 + body bytes 8 + body XXH3-64 8.
inline constexpr size_t kFileHeaderBytes = 32;

enum class Plane : uint8_t { kValues, kScales };
using IndexEncodingCode = uint8_t;  // refit::IndexEncoding's wire code

// Changed entries of one canonical plane. An entry is the plane's unit of change: one element for 8/16/32-bit
// values (a packed byte of two elements for MXFP4), one scale (1 byte E8M0, 4 bytes f32) for scales.
struct PlaneDelta {
  std::vector<int64_t> indices;  // entry indices, strictly increasing; empty for an anchor
  std::vector<uint8_t> bytes;    // new bytes: indices.size() entries, or the whole plane for an anchor
};

struct TensorDelta {
  std::string name;            // HF tensor name
  Format format;               // bf16, f16, f32, mxfp8, mxfp4 or fp8-b128
  std::vector<int64_t> shape;  // logical shape; quantized tensors are [..., N, K]
  bool anchor = false;         // both planes in full
  uint64_t checksum = 0;       // XXH3-64 of the full canonical planes after the update
  PlaneDelta values, scales;   // scales stays empty for plain formats
};

struct Delta {
  uint64_t base_version = 0;
  uint64_t new_version = 0;
  std::vector<TensorDelta> tensors;
};

// ---- geometry
// ---------------------------------------------------------------------------------------------- Formats a
// delta may carry; any other is refused by name.
bool delta_format_supported(Format format);
int entry_bytes(Format format, Plane plane);
struct PlaneGeometry {
  int64_t bytes = 0;    // whole plane
  int64_t entries = 0;  // bytes / entry_bytes
};
// Both planes of a tensor (scales {0, 0} for plain formats); a bad shape or format is a named error.
Result<std::array<PlaneGeometry, 2>> tensor_geometry(Format format, const std::vector<int64_t>& shape,
                                                     std::string_view name);

// ---- writer / reader
// --------------------------------------------------------------------------------------- The uncompressed
// body (every multi-byte field little-endian). Refuses new <= base, a duplicated name and any record
// check_tensor_delta() refuses.
Result<std::vector<uint8_t>> encode_delta_body(const Delta& delta);
// note: level 3 is zstd's default; higher levels gain little on near-random fp8 bytes (measured in the doc).
// Header + one zstd frame around an encoded body; level kRawBody: header + the body as it is (flags bit 0,
// docs/refit-format.md §1), for bodies zstd barely shrinks, which then cost no decompression.
inline constexpr int kRawBody = 0;
inline constexpr uint32_t kRawBodyFlag = 1;
Result<std::vector<uint8_t>> wrap_body(std::span<const uint8_t> body, int zstd_level = 3);
Result<std::vector<uint8_t>> write_delta(const Delta& delta, int zstd_level = 3);
Status write_delta_file(const Delta& delta, const std::filesystem::path& path, int zstd_level = 3);

struct ReadLimits {
  uint64_t max_body_bytes = uint64_t{64} << 30;  // refuse larger bodies before allocating
};
Result<Delta> decode_delta_body(std::span<const uint8_t> body);
Result<Delta> read_delta(std::span<const uint8_t> file, const ReadLimits& limits = {});
Result<Delta> read_delta_file(const std::filesystem::path& path, const ReadLimits& limits = {});
// A delta file's bytes, unread past what the checks allow: a regular file (a FIFO, a directory or /dev/zero
// is refused by kind), whose first 8 bytes are the magic (checked before the rest is read), of at most the
// header plus a zstd frame (or a raw body) of limits.max_body_bytes.
Result<std::string> read_delta_file_bytes(const std::filesystem::path& path, const ReadLimits& limits = {});
// The header checks of read_delta and the body decompressed into `body` (which must hold the header's body
// bytes; body_size() says how many). read_delta is decompress_body + decode_delta_body.
Result<uint64_t> body_size(std::span<const uint8_t> file, const ReadLimits& limits = {});
Status decompress_body(std::span<const uint8_t> file, std::span<uint8_t> body);
// A raw-body file's body where it lies in `file` (header checked, and the body hash unless `check_hash` is
// false: the caller then runs check_body_hash before it writes anything); an empty optional for a zstd file
// (decompress_body then).
Result<std::optional<std::span<const uint8_t>>> raw_body(std::span<const uint8_t> file,
                                                         const ReadLimits& limits = {},
                                                         bool check_hash = true);
// The header's body hash (XXH3-64) against `body`.
Status check_body_hash(std::span<const uint8_t> file, std::span<const uint8_t> body);

// ---- undecoded view (the device path: docs/refit-format.md "Device path")
// A delta read up to the index sets, which stay in their wire encoding: every span points into the body,
// which must outlive the view. Parsing checks everything but the contents of the index data and new bytes
// (the structure, counts against the plane and against the bytes present), in O(records).
struct PlaneView {
  IndexEncodingCode encoding = 0;  // wire code: 0 gaps, 1 bitmap, 2 runs (refit/index_codec.h)
  int64_t count = 0;               // changed entries (sparse)
  std::span<const uint8_t> index;  // encoded index set (sparse)
  std::span<const uint8_t> bytes;  // new bytes: count x entry_bytes, or the whole plane (anchor)
};
struct TensorView {
  std::string name;
  Format format;
  std::vector<int64_t> shape;
  bool anchor = false;
  uint64_t checksum = 0;
  PlaneView values, scales;
};
struct DeltaView {
  uint64_t base_version = 0;
  uint64_t new_version = 0;
  std::vector<TensorView> tensors;
  std::span<const uint8_t> body;
  // Every record an anchor whose planes already sit in the store's memory (a full update from a device
  // buffer, refit/tensor_update_cuda.h): apply_delta writes them from there, nothing is uploaded; `body`
  // is unused.
  bool resident = false;
};
Result<DeltaView> parse_delta_view(std::span<const uint8_t> body);
// One record decoded (its index sets through decode_indices) / the whole view: what decode_delta_body reads.
Result<TensorDelta> decode_tensor_view(const TensorView& t);
Result<Delta> decode_delta_view(const DeltaView& view);

// Internal consistency of one tensor record, with no engine knowledge: supported format, shape, index ranges
// and order (W-01/02/04), byte counts (W-03), anchor sizes (W-08) and new-byte policy (W-05).
Status check_tensor_delta(const TensorDelta& t);

// ---- validation against the engine
// ---------------------------------------------------------------------------
struct TensorSpec {
  Format format;
  std::vector<int64_t> shape;
};
// The engine's tensor table: every live tensor, by HF name.
using TensorTable = std::map<std::string, TensorSpec, std::less<>>;

struct CoverageReport {
  std::vector<std::string> unknown;     // in the delta, not in the engine
  std::vector<std::string> missing;     // in the engine, not in the delta
  std::vector<std::string> duplicated;  // more than one record
  bool complete() const { return unknown.empty() && missing.empty() && duplicated.empty(); }
  std::string summary() const;  // one line
};
CoverageReport coverage(const Delta& delta, const TensorTable& table);

// Everything the applier must know before its first write: the chain rule (W-12: base == live version,
// new > base), exact coverage of the table (W-07), each record's format and shape against the table (W-08)
// and check_tensor_delta. The first failure comes back as one line naming the tensor.
Status validate_delta(const Delta& delta, const TensorTable& table, uint64_t live_version);

// validate_delta for a view without the per-entry checks (index contents, new-byte policy), which the
// device path runs on the device: chain (W-12), coverage (W-07), format and shape (W-08). A record whose
// per-entry checks fail is worded by check_tensor_view (decode + check_tensor_delta), as the host path would.
Status validate_delta_view(const DeltaView& view, const TensorTable& table, uint64_t live_version);
Status check_tensor_view(const TensorView& t);

}  // namespace mxq::refit
