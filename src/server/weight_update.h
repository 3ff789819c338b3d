// Weight updates of a running `mxq serve` (docs/serve.md "Weight updates"): the server's handle on the live
// WeightStore. Every update goes through the refit applier (validate -> write in place -> verify checksums ->
// exact rollback), so it is all-or-nothing; the methods that read or write the store run on the engine
// thread only (EngineLoop::run_task), between two steps.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>

#include "base/error.h"
#include "model/load_model.h"
#include "model/open_checkpoint.h"
#include "model/weight_store.h"
#include "refit/delta_format.h"
#include "refit/tensor_manifest.h"

namespace mxq::server {

// How an update ended. `refused`: the store is exactly as before (validation refused the input, or the
// applier restored every byte); `lost`: the undo could not complete and the store may not serve.
struct UpdateOutcome {
  bool success = false;
  bool lost = false;
  std::string message;         // one line: the applier's reason on failure
  uint64_t version = 0;        // the live version after the call
  uint64_t applied_bytes = 0;  // new value and scale bytes written
  double seconds = 0;          // wall time of the update on the engine thread
  refit::StageTimes stages;    // wall milliseconds per stage ("decompress", "open", ..., "verify")
};

// The device half of /update_weights_from_tensor (the CUDA build's cuda::apply_ipc_manifest): opens the
// manifest's buffer and applies it to the store from `version` to `new_version`.
using DeviceBufferUpdate = std::function<Status(WeightStore& store, uint64_t& version, uint64_t new_version,
                                                const refit::TensorManifest&, refit::StageTimes* times)>;
// The device half of /update_weights_from_disk (cuda::apply_checkpoint_on_device): true when it applied the
// checkpoint, false when it does not take it (the host path then), an error when the update failed.
using DeviceCheckpointUpdate =
    std::function<Result<bool>(WeightStore& store, uint64_t& version, uint64_t new_version,
                               const ModelCheckpoint& ckpt, refit::StageTimes* times)>;

class WeightUpdater {
 public:
  // `store` must outlive the updater. `load` are the startup LoadOptions (quantization, threads); their
  // target and progress are not used: checkpoints of /update_weights_from_disk load to host memory.
  WeightUpdater(WeightStore& store, const LoadOptions& load, size_t max_update_bytes);

  // The tensor table (name -> format, shape): fixed at load, safe from any thread.
  const refit::TensorTable& table() const { return table_; }
  size_t max_update_bytes() const { return max_update_bytes_; }

  // Engine thread only. A delta file's bytes (header + zstd body, docs/refit-format.md), through the device
  // path (parse_delta_view): its base must be `version`, which advances on success.
  UpdateOutcome apply_delta_file(std::span<const uint8_t> file, uint64_t& version);
  // Engine thread only. A checkpoint directory of the same tensors (names, formats, shapes): bf16/f16/f32,
  // quantized as at startup, or pre-quantized in the engine's scheme. Applied as one delta of anchors from
  // `version` to `new_version` (default version + 1).
  UpdateOutcome apply_checkpoint(const std::string& dir, std::optional<uint64_t> new_version,
                                 uint64_t& version);
  // Engine thread only. A full update from a CUDA buffer (refit/tensor_manifest.h), through the device half
  // set by set_device_update; refused by name without one (a CPU engine). From `version` to `new_version`
  // (default version + 1).
  UpdateOutcome apply_tensor_manifest(const refit::TensorManifest& m, std::optional<uint64_t> new_version,
                                      uint64_t& version);
  void set_device_update(DeviceBufferUpdate update) { device_update_ = std::move(update); }
  // A checkpoint update on the device (refit/tensor_update_cuda.h apply_checkpoint_on_device): false when it
  // does not take this checkpoint, which apply_checkpoint then quantizes on the host.
  void set_device_checkpoint(DeviceCheckpointUpdate update) { device_checkpoint_ = std::move(update); }
  // Engine thread only: every live tensor's canonical checksum.
  std::map<std::string, uint64_t> checksums() const;

 private:
  UpdateOutcome finish(Status applied, uint64_t version, uint64_t bytes, double seconds) const;

  WeightStore* store_;
  LoadOptions load_;
  size_t max_update_bytes_;
  refit::TensorTable table_;
  DeviceBufferUpdate device_update_;
  DeviceCheckpointUpdate device_checkpoint_;
};

// The delta file at `path` (absolute), read whole; refused by name when it is not a regular file or is larger
// than `max_bytes`. Any thread (touches no weights).
Result<std::vector<uint8_t>> read_update_file(const std::string& path, size_t max_bytes);

// A weights version as SGLang's string fields carry it: a decimal unsigned 64-bit integer ("0", "17").
Result<uint64_t> parse_version(std::string_view field, std::string_view text);

}  // namespace mxq::server
