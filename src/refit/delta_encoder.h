// Trainer side of refit: diffs the canonical planes of a tensor before and after an optimizer step and builds
// its delta record. The planes come from the engine's own quantizer (same bytes as a load), so the engine's
// live bytes plus this record equal a fresh load of the new weights.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "format/formats.h"
#include "refit/delta_format.h"

namespace mxq::refit {

struct CanonicalPlanes {
  std::span<const uint8_t> values;
  std::span<const uint8_t> scales;  // empty for plain formats
};

// Indices of the entries (`entry_bytes` wide) that differ between two planes of equal size.
std::vector<int64_t> changed_entries(std::span<const uint8_t> old_plane, std::span<const uint8_t> new_plane,
                                     int entry_bytes);

// Bytes a sparse record's planes take in the body (encoding byte, two counts, the chosen index encoding and
// the new bytes, per plane); the writer makes a record an anchor when this is >= the planes' full size.
int64_t sparse_record_bytes(const TensorDelta& t, const std::array<PlaneGeometry, 2>& geometry);

// The record that takes `old_planes` to `new_planes` (sizes must match the format and shape). With no old
// planes (a new tensor) or `force_anchor` the record is an anchor; otherwise it is the sparse diff, or an
// anchor when that is no larger (the rule docs/refit-format.md fixes, which the Python client follows).
Result<TensorDelta> diff_tensor(std::string_view name, Format format, const std::vector<int64_t>& shape,
                                const CanonicalPlanes* old_planes, const CanonicalPlanes& new_planes,
                                bool force_anchor = false);

}  // namespace mxq::refit
