// A full update of a CUDA WeightStore from one flat device buffer of tensors (`POST
// /update_weights_from_tensor`: a colocated trainer's CUDA IPC export; docs/serve.md "Update from a CUDA
// buffer"). Order of work: plan the manifest on the host (refit::plan_manifest: nothing read yet) -> quantize
// the source weights that need it into scratch on the device (the startup rule: the bytes a load with
// --quantization writes; a NaN or Inf block refused by name) -> hash every tensor's canonical planes where
// they are, on a stream of their own (refit/pending_sums_cuda.h), while refit's resident anchors run on the
// memory's stream: W-05 check on the device, undo log, one batched write, every live tensor re-read through
// its layout and hashed -> the new planes' hashes awaited, compared with the manifest's checksums (W-06) and
// with the live ones. All or nothing: any failure after the first write restores every byte.
#pragma once

#include <cstdint>
#include <optional>

#include "base/error.h"
#include "model/open_checkpoint.h"
#include "model/weight_store.h"
#include "refit/tensor_manifest.h"

namespace mxq::cuda {

// `buffer`: m.size bytes of device memory (this process's, or an IPC mapping) that stay unchanged for the
// call. `live_version` advances to new_version on success only.
// `times` (optional) gets each stage's wall milliseconds (each stage waits for its device work).
Status apply_device_buffer(WeightStore& store, uint64_t& live_version, uint64_t new_version,
                           const refit::TensorManifest& m, const uint8_t* buffer,
                           refit::StageTimes* times = nullptr);

// apply_device_buffer on the buffer of m.ipc_handle + m.ipc_offset (cudaIpcOpenMemHandle; another process's
// allocation on this device), closed before returning. A handle that does not open is refused by name.
Status apply_ipc_manifest(WeightStore& store, uint64_t& live_version, uint64_t new_version,
                          const refit::TensorManifest& m, refit::StageTimes* times = nullptr);

// POST /update_weights_from_disk on a CUDA store, on the device: a plain checkpoint (bf16/f16/f32, no
// quantization scheme) that holds every live tensor under its own name and shape, with a live plain tensor's
// own dtype, is copied to device scratch tensor by tensor and applied as apply_device_buffer applies a
// trainer's buffer (the engine's quantizers on the device: the bytes of the host path). false, having read no
// tensor: another checkpoint (pre-quantized, stacked experts the store keeps under other names) or scratch
// that cannot be had; the caller then takes the host path. An error: the update failed, every byte restored.
Result<bool> apply_checkpoint_on_device(WeightStore& store, uint64_t& live_version, uint64_t new_version,
                                        const ModelCheckpoint& ckpt, refit::StageTimes* times);

}  // namespace mxq::cuda
