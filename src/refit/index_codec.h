// Index encodings of a refit delta plane: which entries of a canonical plane changed, as a strictly
// increasing list of entry indices in [0, entries). Three encodings; docs/refit-format.md fixes their bytes
// and when each is chosen. Decoders bound every count against the bytes present before allocating.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/error.h"

namespace mxq::refit {

// note: the numeric values are wire codes (one byte in the plane record); never renumber.
enum class IndexEncoding : uint8_t {
  kGaps = 0,    // LEB128 varints: first index, then each difference to the previous (>= 1)
  kBitmap = 1,  // one bit per entry, LSB first, ceil(entries / 8) bytes
  kRuns = 2,    // LEB128 pairs (skip, length) of maximal runs of changed entries
};
inline constexpr int kIndexEncodingCount = 3;

std::string_view encoding_name(IndexEncoding encoding);

// W-01 / W-02 / W-04: every index in [0, entries), strictly increasing. The message names the first offender.
Status check_indices(std::span<const int64_t> indices, int64_t entries);

// Bytes the encoding takes for `indices` (which must pass check_indices).
int64_t encoded_size(IndexEncoding encoding, std::span<const int64_t> indices, int64_t entries);

// The smallest encoding; ties go to the lower wire code, and an empty set is always kGaps (zero bytes), so
// the choice is a pure function of (indices, entries) that the Python client reproduces.
IndexEncoding choose_encoding(std::span<const int64_t> indices, int64_t entries);

// Appends the encoding of `indices` (which must pass check_indices) to `out`.
void encode_indices(IndexEncoding encoding, std::span<const int64_t> indices, int64_t entries,
                    std::vector<uint8_t>& out);

// Decodes exactly `data` into `count` indices, refusing anything the encoder cannot produce: an index out of
// range, a zero gap (duplicate), a zero-length or touching run, set pad bits, a count that disagrees with the
// data, an over-long varint, or bytes left over.
Result<std::vector<int64_t>> decode_indices(IndexEncoding encoding, std::span<const uint8_t> data,
                                            int64_t count, int64_t entries);

// A runs-encoded set as a run table, O(runs): per run, int32 (first entry, its position in the list),
// refusing what decode_indices refuses. Planes of < 2^31 entries (the device path's int32 positions).
Result<std::vector<int32_t>> decode_run_table(std::span<const uint8_t> data, int64_t count, int64_t entries);

}  // namespace mxq::refit
