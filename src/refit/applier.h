// Engine side of refit: takes the live weights of a WeightStore from a delta's base version to its new
// version in place, or leaves them exactly as they were (DESIGN.md "Refit contract"). Order of work:
//   validate the whole delta -> allocate the undo log -> per tensor: write (anchors through apply_tensor,
//   sparse planes through apply_sparse, every overwritten byte saved) and verify the canonical checksum ->
//   advance the version. Any refusal before the first write leaves the store untouched; any failure after it
//   restores every saved byte in reverse order and reports which tensor failed and why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "base/error.h"
#include "base/progress.h"
#include "model/weight_store.h"
#include "refit/delta_format.h"

namespace mxq::refit {

// Points of apply_delta at which the fault hook runs (W-10).
enum class ApplyStage : uint8_t {
  kValidated,         // delta validated and undo log allocated; nothing written yet
  kTensorWritten,     // record `tensor` written, checksum not yet verified
  kChecksumVerified,  // record `tensor` verified
  kUndoStep,          // about to restore one plane or anchor of record `tensor`
};
std::string_view stage_name(ApplyStage stage);

struct StagePoint {
  ApplyStage stage;
  size_t tensor = 0;      // index of the record in the delta (0 after validation)
  std::string_view name;  // its tensor name (empty after validation)
};

// Returning an error at a forward stage aborts the update (and restores); at kUndoStep it is a transient
// fault: the step is retried, and after kUndoAttempts failures the store is marked inconsistent.
using FaultHook = std::function<Status(const StagePoint&)>;
// Returns nullptr when `bytes` cannot be allocated (W-26).
using UndoAllocator = std::function<std::unique_ptr<uint8_t[]>(size_t bytes)>;

// note: three tries per undo step: a fault that persists through them is not transient, and the store then
// refuses to serve rather than guess.
inline constexpr int kUndoAttempts = 3;

// Wall-clock milliseconds of apply_delta's stages, filled when ApplyOptions::timings is set (a device store
// then waits for each stage's device work before the next, so the stages add up to the whole call).
struct ApplyTimings {
  double validate = 0;  // validate_delta (host, all cores)
  double stage = 0;     // device path: packing indices (int32 where they fit) and new bytes, one upload
                        // (encoded path: run tables and the pack into pinned staging, when needed)
  double upload = 0;    // encoded path: the host-to-device copy of the body or the packed bytes
  double decode = 0;    // encoded path: device decode + checks of every index set and new entry
  double write = 0;     // undo capture, anchor writes, sparse scatters
  double checksum = 0;  // every touched tensor's checksum (device path: one batch) and the comparison
};

struct ApplyOptions {
  FaultHook fault;              // test hook; empty = no faults
  UndoAllocator allocate_undo;  // empty = operator new (nothrow)
  // One report per verified tensor (stage "refit"); returning false cancels: every byte is restored.
  ProgressFn progress;
  ApplyTimings* timings = nullptr;  // bench hook; null = no timing
  // Resident deltas (DeltaView::resident) whose expected checksums are still being computed beside the write
  // (refit/tensor_update_cuda.cpp: on another stream): called after the write, before the checksums are
  // compared; it fills the view's TensorView::checksum fields. A failure restores every byte.
  std::function<Status()> await_checksums;
  // Called once, after every check and before the first write (stage kValidated, after the undo log and on
  // the device path the upload and decode): work that ran beside the checks (the server's body hash) says
  // here whether the delta may be written. A failure refuses the delta with nothing written.
  std::function<Status()> before_write;
};

// The engine's tensor table (name -> format, shape) that validate_delta checks a delta against.
TensorTable tensor_table(const WeightStore& store);

// Bytes of undo log the delta needs: the old planes of every anchor, the old entries of every sparse plane.
uint64_t undo_log_bytes(const Delta& delta);

// Applies `delta` to `store`; `live_version` advances to delta.new_version only on success. Refused before
// any write: a store marked inconsistent, everything validate_delta refuses (W-01..W-05, W-07, W-08, W-12),
// an undo log that cannot be allocated (W-26). After the first write a checksum mismatch (W-06, W-09) or a
// fault restores every byte and reports "tensor k of n NAME: why".
Status apply_delta(WeightStore& store, uint64_t& live_version, const Delta& delta,
                   const ApplyOptions& options = {});

// The same for a delta read up to its encoded index sets (parse_delta_view): a device store decodes and
// checks them on the device (docs/refit-format.md "Device path"), a host store decodes them first.
// Refusals are those of apply_delta on decode_delta_view(delta), worded the same way, before any write.
Status apply_delta(WeightStore& store, uint64_t& live_version, const DeltaView& delta,
                   const ApplyOptions& options = {});

// `mxq generate --apply-delta`: reads and applies each delta file in order; the first failure stops the
// chain and names its file (the deltas before it stay applied, each one whole).
Status apply_delta_files(WeightStore& store, uint64_t& live_version, std::span<const std::string> paths,
                         const ApplyOptions& options = {});

}  // namespace mxq::refit
