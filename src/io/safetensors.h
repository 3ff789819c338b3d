// safetensors files: strict validation of header and offsets at open; tensor bytes come out as bytes.
//
// File layout: u64 little-endian N | N bytes of UTF-8 JSON header | data section. The header maps each tensor
// name to {dtype, shape, data_offsets: [begin, end)} relative to the data section, plus an optional
// "__metadata__" object of string values. mxq accepts a file only if the tensors tile the data section
// exactly (sorted by offset: no hole, no overlap, no trailing byte) and every byte range equals shape x
// dtype. Stricter than the reference reader: duplicate keys, unknown fields in a tensor entry, NUL in names,
// names over kMaxNameBytes and rank > kMaxRank are refused. Like the reference: JSON whitespace (space, tab,
// CR, LF) before and after the header object is accepted (since safetensors#686; our writer pads with
// spaces); a raw NUL or a leading BOM is refused.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "io/mapped_file.h"

namespace mxq {

// note: enumerators follow the reference crate's Dtype order (minus F6_*, C64); its writer sorts tensors by
// descending dtype in that order, and write_safetensors() does the same to reproduce its files byte for byte.
enum class Dtype : uint8_t {
  kBool,
  kF4,  // float4_e2m1fn_x2 storage: two E2M1 codes per byte, shape counts elements
  kU8,
  kI8,
  kF8_E5M2,
  kF8_E4M3,
  kF8_E8M0,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
  kCount,
};

// "F8_E4M3" -> Dtype; any other name (F6_E2M3, C64, F8_E4M3FNUZ, "f32", ...) is refused by name.
Result<Dtype> parse_dtype(std::string_view name);
std::string_view dtype_name(Dtype dtype);
int dtype_bits(Dtype dtype);

// note: limits. 100,000,000 header bytes is the reference's MAX_HEADER_SIZE. HF tensors have rank <= 5 and
// names under 300 bytes; 16 and 4096 leave room while bounding what one header entry can make us hold.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
inline constexpr size_t kMaxRank = 16;
inline constexpr size_t kMaxNameBytes = 4096;
inline constexpr std::string_view kMetadataKey = "__metadata__";

struct TensorEntry {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<int64_t> shape;  // row-major, outermost first; empty = rank 0 (one element)
  uint64_t begin = 0;          // [begin, end) relative to the data section
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

// Bytes a tensor of this dtype and shape occupies, with checked multiplies; refuses a negative dimension and
// a sub-byte dtype whose elements do not fill whole bytes. `what` names the tensor in the error.
Result<uint64_t> tensor_nbytes(Dtype dtype, std::span<const int64_t> shape, std::string_view what);

// What a validated header says. Tensors are in data order (ascending offsets); zero-size tensors may share an
// offset with their neighbour.
struct SafetensorsHeader {
  uint64_t header_bytes = 0;  // N
  uint64_t data_offset = 0;   // 8 + N: where the data section starts in the file
  std::vector<TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
};

// Validates a whole file image (header and offsets; tensor bytes are never read). `label` names the file in
// errors: "<label>: <tensor>: <what>, expected X, got Y". The fuzz harness drives this directly.
Result<SafetensorsHeader> parse_safetensors(std::span<const uint8_t> image, std::string_view label);

// Text safe for a one-line log: bytes outside printable ASCII become \xHH, backslash doubles; at most 200
// bytes of the input shown. Every tensor or shard name in an error goes through this.
std::string printable(std::string_view text);

class SafetensorsFile {  // move-only, owns the mapping
 public:
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return map_.path(); }
  const std::vector<TensorEntry>& tensors() const { return header_.tensors; }
  const TensorEntry* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  uint64_t data_offset() const { return header_.data_offset; }

  // The one guarded copy path: checks that dst has exactly the tensor's bytes and that the file has not
  // shrunk, then copies under the SIGBUS guard (L-19). `entry` must be one of tensors().
  Status read(const TensorEntry& entry, std::span<uint8_t> dst) const;
  // Raw view into the mapping for hot paths. Unaligned in general (L-18): read it with memcpy, never through
  // a typed pointer. A file truncated after open makes touching this view raise SIGBUS.
  std::span<const uint8_t> bytes(const TensorEntry& entry) const;

 private:
  SafetensorsFile(MappedFile map, SafetensorsHeader header);

  MappedFile map_;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in header_.tensors
};

}  // namespace mxq
