// Writes safetensors files that the reference library writes byte for byte from the same tensors.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "io/safetensors.h"

namespace mxq {

struct TensorToWrite {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;  // exactly shape x dtype bytes, row-major
};

// File layout, as the reference writer (safetensors' Rust `prepare`) makes it:
// - tensors in descending Dtype order (U64 ... BOOL: larger elements first, so every tensor starts at a
//   multiple of its element size), ties by name (bytewise); header keys follow the same order;
// - header: compact JSON, "__metadata__" first (omitted when empty, its keys sorted: the reference takes them
//   from a hash map, so only files with at most one metadata key can match it exactly), then per tensor
//   {"dtype", "shape", "data_offsets"}; padded with spaces to a multiple of 8 bytes.
// Same input, same bytes. Written to a temporary file in the same directory, fsync'ed, then renamed over
// `path`, so readers never see a partial file. Refused by name: empty, duplicate or "__metadata__" names,
// NUL or invalid UTF-8, byte count != shape x dtype, rank > kMaxRank.
Status write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                         const std::map<std::string, std::string>& metadata);

}  // namespace mxq
