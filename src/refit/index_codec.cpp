#include "refit/index_codec.h"

#include <bit>
#include <cassert>
#include <climits>

namespace mxq::refit {
namespace {

// note: LEB128 byte count = ceil(bit length / 7), with 1 for zero.
int varint_size(uint64_t v) { return v < 128 ? 1 : 1 + (63 - std::countl_zero(v)) / 7; }

void put_varint(uint64_t v, std::vector<uint8_t>& out) {
  while (v >= 0x80) {
    out.push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
}

// Reads one minimal LEB128 varint of at most 63 bits (indices and lengths are int64 >= 0): nine bytes of
// seven bits each, so a tenth byte is refused.
class VarintReader {
 public:
  explicit VarintReader(std::span<const uint8_t> data) : data_(data) {}
  bool done() const { return pos_ == data_.size(); }
  size_t pos() const { return pos_; }

  Result<int64_t> next() {
    uint64_t v = 0;
    for (int shift = 0; shift < 63; shift += 7) {
      if (pos_ == data_.size()) return fail("varint cut off at byte {}", pos_);
      const uint8_t b = data_[pos_++];
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) {
        // note: a final 0x00 after a continuation byte is a second spelling of a shorter varint.
        if (b == 0 && shift > 0) return fail("non-minimal varint ending at byte {}", pos_ - 1);
        return static_cast<int64_t>(v);
      }
    }
    return fail("varint at byte {} exceeds 2^63 - 1", pos_);
  }

 private:
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
};

// Calls fn(start, length) for each maximal run of consecutive indices.
template <class Fn>
void for_each_run(std::span<const int64_t> indices, Fn fn) {
  size_t i = 0;
  while (i < indices.size()) {
    size_t j = i + 1;
    while (j < indices.size() && indices[j] == indices[j - 1] + 1) ++j;
    fn(indices[i], static_cast<int64_t>(j - i));
    i = j;
  }
}

}  // namespace

std::string_view encoding_name(IndexEncoding encoding) {
  switch (encoding) {
    case IndexEncoding::kGaps:
      return "gaps";
    case IndexEncoding::kBitmap:
      return "bitmap";
    case IndexEncoding::kRuns:
      return "runs";
  }
  return "?";
}

Status check_indices(std::span<const int64_t> indices, int64_t entries) {
  for (size_t k = 0; k < indices.size(); ++k) {
    const int64_t i = indices[k];
    if (i < 0 || i >= entries)
      return fail("index {} at position {} is outside [0, {}) (W-01)", i, k, entries);
    if (k > 0 && i == indices[k - 1]) return fail("index {} repeats at position {} (W-02)", i, k);
    if (k > 0 && i < indices[k - 1])
      return fail("index {} at position {} follows {}: indices must increase (W-04)", i, k, indices[k - 1]);
  }
  return {};
}

int64_t encoded_size(IndexEncoding encoding, std::span<const int64_t> indices, int64_t entries) {
  int64_t bytes = 0;
  switch (encoding) {
    case IndexEncoding::kGaps:
      for (size_t k = 0; k < indices.size(); ++k)
        bytes += varint_size(static_cast<uint64_t>(k ? indices[k] - indices[k - 1] : indices[0]));
      return bytes;
    case IndexEncoding::kBitmap:
      return (entries + 7) / 8;  // independent of the set: a full bit per entry
    case IndexEncoding::kRuns: {
      int64_t end = 0;
      for_each_run(indices, [&](int64_t start, int64_t length) {
        bytes += varint_size(static_cast<uint64_t>(start - end)) + varint_size(static_cast<uint64_t>(length));
        end = start + length;
      });
      return bytes;
    }
  }
  return bytes;
}

IndexEncoding choose_encoding(std::span<const int64_t> indices, int64_t entries) {
  if (indices.empty()) return IndexEncoding::kGaps;
  IndexEncoding best = IndexEncoding::kGaps;
  int64_t best_size = encoded_size(best, indices, entries);
  for (int e = 1; e < kIndexEncodingCount; ++e) {
    const int64_t size = encoded_size(static_cast<IndexEncoding>(e), indices, entries);
    if (size < best_size) best = static_cast<IndexEncoding>(e), best_size = size;
  }
  return best;
}

void encode_indices(IndexEncoding encoding, std::span<const int64_t> indices, int64_t entries,
                    std::vector<uint8_t>& out) {
  assert(check_indices(indices, entries).has_value());
  switch (encoding) {
    case IndexEncoding::kGaps:
      for (size_t k = 0; k < indices.size(); ++k)
        put_varint(static_cast<uint64_t>(k ? indices[k] - indices[k - 1] : indices[0]), out);
      return;
    case IndexEncoding::kBitmap: {
      const size_t base = out.size();
      out.resize(base + static_cast<size_t>((entries + 7) / 8), 0);
      for (int64_t i : indices) out[base + static_cast<size_t>(i / 8)] |= static_cast<uint8_t>(1u << (i % 8));
      return;
    }
    case IndexEncoding::kRuns: {
      int64_t end = 0;
      for_each_run(indices, [&](int64_t start, int64_t length) {
        put_varint(static_cast<uint64_t>(start - end), out);
        put_varint(static_cast<uint64_t>(length), out);
        end = start + length;
      });
      return;
    }
  }
}

namespace {

Result<std::vector<int64_t>> decode_gaps(std::span<const uint8_t> data, int64_t count, int64_t entries) {
  // note: every varint takes at least one byte, so count <= data.size() bounds the allocation.
  if (count > static_cast<int64_t>(data.size()))
    return fail("{} indices cannot fit in {} gap bytes", count, data.size());
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(count));
  VarintReader r(data);
  int64_t prev = 0;
  for (int64_t k = 0; k < count; ++k) {
    auto v = r.next();
    if (!v) return tl::unexpected(v.error());
    if (k > 0 && *v == 0) return fail("index {} repeats at position {} (W-02)", prev, k);
    if (*v > entries - 1 - (k ? prev : 0))
      return fail("index at position {} is outside [0, {}) (W-01)", k, entries);
    prev = k ? prev + *v : *v;
    out.push_back(prev);
  }
  if (!r.done()) return fail("{} bytes left after {} gap-coded indices", data.size() - r.pos(), count);
  return out;
}

// note: the bits are counted before the output is allocated, so a forged count never sizes an allocation.
Result<std::vector<int64_t>> decode_bitmap(std::span<const uint8_t> data, int64_t count, int64_t entries) {
  if (static_cast<int64_t>(data.size()) != (entries + 7) / 8)
    return fail("bitmap of {} bytes for {} entries, expected {}", data.size(), entries, (entries + 7) / 8);
  int64_t set = 0;
  for (uint8_t b : data) set += std::popcount(b);
  if (entries % 8 && (data.back() >> (entries % 8)))
    return fail("bitmap sets bits past entry {} (W-01)", entries - 1);
  if (set != count) return fail("bitmap sets {} bits, the record says {} changed (W-03)", set, count);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(count));
  for (size_t byte = 0; byte < data.size(); ++byte)
    for (unsigned bits = data[byte]; bits; bits &= bits - 1)
      out.push_back(static_cast<int64_t>(byte) * 8 + std::countr_zero(bits));
  return out;
}

// note: runs can describe many entries in few bytes, so the output grows only while it stays within `count`
// (which the caller bounded by the new bytes present in the body).
Result<std::vector<int64_t>> decode_runs(std::span<const uint8_t> data, int64_t count, int64_t entries) {
  if (count > entries) return fail("{} changed entries in a plane of {}", count, entries);
  std::vector<int64_t> out;
  VarintReader r(data);
  int64_t end = 0;
  while (!r.done()) {
    auto skip = r.next();
    if (!skip) return tl::unexpected(skip.error());
    auto length = r.next();
    if (!length) return tl::unexpected(length.error());
    // note: runs are maximal, so after the first one a zero skip would be two spellings of one run.
    if (!out.empty() && *skip == 0) return fail("run at entry {} touches the previous run", end);
    if (*length == 0) return fail("empty run after entry {}", end);
    if (*skip > entries - end || *length > entries - end - *skip)
      return fail("run of {} after skip {} from entry {} passes the plane end {} (W-01)", *length, *skip, end,
                  entries);
    if (*length > count - static_cast<int64_t>(out.size()))
      return fail("runs cover more than the {} changed entries the record says (W-03)", count);
    const int64_t start = end + *skip;
    for (int64_t i = start; i < start + *length; ++i) out.push_back(i);
    end = start + *length;
  }
  if (static_cast<int64_t>(out.size()) != count)
    return fail("runs cover {} entries, the record says {} changed (W-03)", out.size(), count);
  return out;
}

}  // namespace

// note: the same checks and messages as decode_runs, without materializing the entries.
Result<std::vector<int32_t>> decode_run_table(std::span<const uint8_t> data, int64_t count, int64_t entries) {
  if (count < 0 || count > entries) return fail("{} changed entries in a plane of {}", count, entries);
  if (entries > INT32_MAX) return fail("run table of a plane of {} entries (at most 2^31 - 1)", entries);
  std::vector<int32_t> out;
  VarintReader r(data);
  int64_t end = 0, covered = 0;
  while (!r.done()) {
    auto skip = r.next();
    if (!skip) return tl::unexpected(skip.error());
    auto length = r.next();
    if (!length) return tl::unexpected(length.error());
    if (covered > 0 && *skip == 0) return fail("run at entry {} touches the previous run", end);
    if (*length == 0) return fail("empty run after entry {}", end);
    if (*skip > entries - end || *length > entries - end - *skip)
      return fail("run of {} after skip {} from entry {} passes the plane end {} (W-01)", *length, *skip, end,
                  entries);
    if (*length > count - covered)
      return fail("runs cover more than the {} changed entries the record says (W-03)", count);
    out.push_back(static_cast<int32_t>(end + *skip));
    out.push_back(static_cast<int32_t>(covered));
    end += *skip + *length;
    covered += *length;
  }
  if (covered != count)
    return fail("runs cover {} entries, the record says {} changed (W-03)", covered, count);
  return out;
}

Result<std::vector<int64_t>> decode_indices(IndexEncoding encoding, std::span<const uint8_t> data,
                                            int64_t count, int64_t entries) {
  if (count < 0 || count > entries) return fail("{} changed entries in a plane of {}", count, entries);
  switch (encoding) {
    case IndexEncoding::kGaps:
      return decode_gaps(data, count, entries);
    case IndexEncoding::kBitmap:
      return decode_bitmap(data, count, entries);
    case IndexEncoding::kRuns:
      return decode_runs(data, count, entries);
  }
  return fail("unknown index encoding {}", static_cast<int>(encoding));
}

}  // namespace mxq::refit
