// The manifest of a full update from one flat buffer of tensors (`POST /update_weights_from_tensor`, a
// colocated trainer's CUDA IPC export; docs/serve.md "Update from a CUDA buffer"): where each live tensor's
// bytes sit in the buffer, as source weights (bf16/f16/f32, quantized by the engine with the startup rule) or
// as canonical planes in the live format (docs/refit-format.md). plan_manifest checks a manifest against the
// engine's tensor table on the host, before the buffer is read: names, coverage, dtypes, shapes, ranges.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "format/formats.h"
#include "refit/delta_format.h"

namespace mxq::refit {

// Wall milliseconds of an update's stages, in order ("open", "quantize", ...), as the server reports them.
using StageTimes = std::vector<std::pair<std::string, double>>;

// Offsets inside the buffer are multiples of this (the device quantizers and the write kernels load 16 B).
inline constexpr uint64_t kManifestAlign = 16;

struct ManifestTensor {
  std::string name;
  Format dtype = Format::kBF16;  // bf16/f16/f32: source weights; mxfp8/mxfp4/fp8-b128: canonical planes
  std::vector<int64_t> shape;    // logical shape
  uint64_t offset = 0;           // source tensor, or the values plane
  uint64_t scales_offset = 0;    // the scales plane (quantized dtypes only)
  std::optional<uint64_t> checksum;  // XXH3-64 of the canonical planes the update must produce
};

struct TensorManifest {
  std::array<uint8_t, 64> ipc_handle{};  // cudaIpcMemHandle_t of the allocation holding the buffer
  uint64_t ipc_offset = 0;               // the buffer's first byte inside that allocation
  uint64_t size = 0;                     // bytes of the buffer
  std::vector<ManifestTensor> tensors;
};

// One tensor of a checked manifest: what the engine does with its bytes.
struct ManifestStep {
  const ManifestTensor* source = nullptr;
  Format live = Format::kBF16;  // the live tensor's format
  bool quantize = false;        // source weights into a quantized live format (else copied as they are)
  uint64_t source_bytes = 0;    // bytes read at source->offset (the values plane when !quantize)
  std::array<PlaneGeometry, 2> planes;  // the live tensor's canonical planes
};

// Refused by name before anything is read: a tensor unknown, missing or listed twice (W-07); a dtype that is
// neither the live format nor a source the live format is quantized from, or another shape (W-08); an
// offset not a multiple of kManifestAlign, or bytes outside [0, size) (W-03). Steps come in manifest order.
Result<std::vector<ManifestStep>> plan_manifest(const TensorManifest& m, const TensorTable& table);

// The manifest dtype's name as JSON carries it: mxq's format names ("bf16", "mxfp8", "fp8-b128") or torch's
// dtype names ("bfloat16", "float16", "float32").
Result<Format> parse_manifest_dtype(std::string_view name);

}  // namespace mxq::refit
