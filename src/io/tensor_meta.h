// What a checkpoint says about one tensor before any byte is read: its safetensors dtype string and shape.
// Scheme detection and `mxq inspect` work from these alone.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mxq {

struct TensorMeta {
  std::string dtype;           // safetensors dtype name: "BF16", "F8_E4M3", "U8", "F32", ...
  std::vector<int64_t> shape;  // row-major, outermost first
};

// HF tensor name -> meta, ordered by name (so listings and outputs are deterministic).
using TensorMetaMap = std::map<std::string, TensorMeta>;

}  // namespace mxq
