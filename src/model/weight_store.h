// The weight store: HF tensor name -> live QTensor. Buffers are allocated once and never move (CUDA graphs and
// refit hold their addresses). apply_tensor() is the only function that writes weight bytes: the checkpoint
// loader, online quantization, full updates and sparse deltas all go through it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "format/formats.h"

namespace mxq {

struct QTensor {
  std::string name;            // HF name of the logical weight ("model.layers.0.mlp.up_proj.weight")
  Format format;               // plain (BF16/F16/F32) or quantized (MXFP8/MXFP4/FP8-B128)
  std::vector<int64_t> shape;  // logical shape; quantized weights are [.., N, K]
  std::span<uint8_t> values;   // live bytes; on the CPU backend the native layout is the canonical one
  std::span<uint8_t> scales;   // empty for plain formats
  uint64_t checksum = 0;       // XXH3-64 of the canonical values plane then the scales plane
};

// Canonical plane sizes of a tensor: values then scales (a leading batch of stacked experts multiplies both).
struct PlaneBytes {
  int64_t values = 0, scales = 0;
};
Result<PlaneBytes> plane_bytes(Format format, const std::vector<int64_t>& shape, std::string_view name);

// XXH3-64 over the canonical values bytes followed by the canonical scales bytes.
uint64_t canonical_checksum(std::span<const uint8_t> values, std::span<const uint8_t> scales);

class WeightStore {
 public:
  // Reserves the tensor's buffers (zeroed). Adding a name twice is an error.
  Status add(std::string name, Format format, std::vector<int64_t> shape);
  // Writes full canonical planes; sizes must match exactly (W-08: no implicit cast or reshape).
  Status apply_tensor(std::string_view name, std::span<const uint8_t> values, std::span<const uint8_t> scales);

  const QTensor* find(std::string_view name) const;
  const QTensor& at(std::string_view name) const;  // the name must exist (programmer error otherwise)
  const std::map<std::string, QTensor, std::less<>>& tensors() const { return tensors_; }
  int64_t total_bytes() const { return total_bytes_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::map<std::string, QTensor, std::less<>> tensors_;
  std::vector<std::unique_ptr<uint8_t, Free>> buffers_;
  int64_t total_bytes_ = 0;
};

}  // namespace mxq
