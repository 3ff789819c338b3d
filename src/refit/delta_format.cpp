#include "refit/delta_format.h"

#include <fmt/ranges.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <set>
#include <thread>
#include <vector>

#include "base/regular_file.h"
#include "base/xxh3.h"
#include "format/codec.h"
#include "io/utf8_text.h"
#include "model/weight_store.h"
#include "refit/index_codec.h"

namespace mxq::refit {
namespace {

// note: limits on the self-describing fields; real HF names are < 200 bytes and weights rank <= 3.
constexpr size_t kMaxNameBytes = 4096;
constexpr int kMaxRank = 8;
constexpr uint8_t kKindSparse = 0, kKindAnchor = 1;
constexpr int64_t kMaxExtent = int64_t{1} << 48;

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}
void put_bytes(std::vector<uint8_t>& out, std::span<const uint8_t> bytes) {
  out.insert(out.end(), bytes.begin(), bytes.end());
}

// Bounds-checked little-endian cursor over the body; every read names its field on failure.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> data) : data_(data) {}
  size_t left() const { return data_.size() - pos_; }
  size_t pos() const { return pos_; }

  template <class T>
  Result<T> get(std::string_view field) {
    if (left() < sizeof(T)) return fail("{} cut off at body byte {}", field, pos_);
    T v;
    std::memcpy(&v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  Result<std::span<const uint8_t>> take(uint64_t n, std::string_view field) {
    if (n > left()) return fail("{} of {} bytes cut off at body byte {} ({} left)", field, n, pos_, left());
    auto s = data_.subspan(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }

 private:
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
};

#define MXQ_TRY_ASSIGN(var, expr)                       \
  auto var##_r = (expr);                                \
  if (!var##_r) return tl::unexpected(var##_r.error()); \
  auto var = *var##_r

// note: names are echoed in one-line errors and logs, so control bytes (newline, NUL, ESC) are refused
// (L-17).
bool printable_name(std::string_view s) {
  if (s.empty()) return false;
  for (unsigned char ch : s)
    if (ch < 0x20 || ch == 0x7F) return false;
  return true;
}

std::string_view plane_name(Plane p) { return p == Plane::kValues ? "values" : "scales"; }

// W-05 policy on one new entry (docs/refit-format.md section 6); `e` points at entry_bytes(format, plane)
// bytes.
Status check_entry(Format format, Plane plane, const uint8_t* e, int64_t index) {
  const FormatTraits& t = traits(format);
  if (plane == Plane::kScales) {
    if (t.scale == ScaleKind::kE8M0) {
      // note: 0x00 is 2^-127, a legal scale the quantizers emit for all-zero blocks (formats.md, Q-07).
      if (e[0] == 0xFF) return fail("scale entry {} is 0xFF, the E8M0 NaN (W-05)", index);
      return {};
    }
    float f;
    std::memcpy(&f, e, 4);
    if (!std::isfinite(f) || !(f > 0.0f))
      return fail("scale entry {} is {}, expected finite > 0 (W-05)", index, f);
    return {};
  }
  switch (format) {
    case Format::kMXFP8:
    case Format::kFP8_B128:
      if ((e[0] & 0x7F) == 0x7F)
        return fail("value entry {} is 0x{:02X}, an E4M3 NaN code (W-05)", index, e[0]);
      return {};
    case Format::kBF16:
    case Format::kF16:
    case Format::kF32: {
      uint16_t h;
      std::memcpy(&h, e, 2);
      float f;
      if (format == Format::kF32) std::memcpy(&f, e, 4);
      const float x = format == Format::kBF16 ? bf16_to_f32(h) : format == Format::kF16 ? f16_to_f32(h) : f;
      if (!std::isfinite(x)) return fail("value entry {} is {} (W-05: NaN/Inf refused)", index, x);
      return {};
    }
    default:
      return {};  // E2M1 has no NaN or Inf code
  }
}

// note: fast scans for the per-entry checks (they dominate validation of a large delta): branch-free
// passes over blocks of entries that only say whether a block holds a refused entry; check_entry /
// check_indices then find and word the first one, so errors are exactly those of the plain loops.
constexpr size_t kScanBlock = 4096;

// First entry index from which check_entry must run (count when every entry passes). Byte-coded policies
// (E4M3 values, E8M0 scales) are scanned; other formats start at 0.
size_t entries_scan(Format format, Plane plane, const uint8_t* e, size_t count) {
  const bool e8m0 = plane == Plane::kScales && traits(format).scale == ScaleKind::kE8M0;
  const bool e4m3 = plane == Plane::kValues && (format == Format::kMXFP8 || format == Format::kFP8_B128);
  const bool no_nan = plane == Plane::kValues && format == Format::kMXFP4;
  if (no_nan) return count;
  if (!e8m0 && !e4m3) return 0;
  for (size_t b = 0; b < count; b += kScanBlock) {
    const size_t end = std::min(count, b + kScanBlock);
    unsigned bad = 0;
    if (e8m0)
      for (size_t k = b; k < end; ++k) bad |= e[k] == 0xFF;
    else
      for (size_t k = b; k < end; ++k) bad |= (e[k] & 0x7F) == 0x7F;
    if (bad) return b;
  }
  return count;
}

// First block start from which check_indices must run (indices.size() when all are in range and strictly
// increasing).
size_t indices_scan(std::span<const int64_t> idx, int64_t entries) {
  for (size_t b = 0; b < idx.size(); b += kScanBlock) {
    const size_t end = std::min(idx.size(), b + kScanBlock);
    int64_t prev = b == 0 ? -1 : idx[b - 1];
    unsigned bad = 0;
    for (size_t k = b; k < end; ++k) {
      bad |= static_cast<unsigned>(idx[k] <= prev) | static_cast<unsigned>(idx[k] >= entries);
      prev = idx[k];
    }
    if (bad) return b;
  }
  return idx.size();
}

// One plane of a record: `indices` (empty for an anchor) and its new bytes.
struct PlaneSpans {
  std::span<const int64_t> indices;
  std::span<const uint8_t> bytes;
};

// note: the anchor check reads spans, so an undecoded view's anchors are checked in place (no copy).
Status check_anchor_plane(Format format, const std::vector<int64_t>& shape, Plane plane, PlaneSpans p,
                          const PlaneGeometry& g) {
  const int w = entry_bytes(format, plane);
  if (!p.indices.empty())
    return fail("anchor {} carry {} indices, expected none", plane_name(plane), p.indices.size());
  if (static_cast<int64_t>(p.bytes.size()) != g.bytes)
    return fail("anchor {} plane of {} bytes, expected {} for {} [{}] (W-08)", plane_name(plane),
                p.bytes.size(), g.bytes, traits(format).name, fmt::join(shape, ", "));
  for (auto i = static_cast<int64_t>(entries_scan(format, plane, p.bytes.data(), p.bytes.size()));
       i < g.entries; ++i)
    if (auto s = check_entry(format, plane, p.bytes.data() + i * w, i); !s) return s;
  return {};
}

Status check_plane(const TensorDelta& t, Plane plane, const PlaneGeometry& g) {
  const PlaneDelta& p = plane == Plane::kValues ? t.values : t.scales;
  const int w = entry_bytes(t.format, plane);
  if (t.anchor) return check_anchor_plane(t.format, t.shape, plane, {p.indices, p.bytes}, g);
  if (indices_scan(p.indices, g.entries) < p.indices.size())
    if (auto s = check_indices(p.indices, g.entries); !s)
      return fail("{}: {}", plane_name(plane), s.error().message);
  if (static_cast<int64_t>(p.bytes.size()) != static_cast<int64_t>(p.indices.size()) * w)
    return fail("{}: {} indices but {} new bytes, expected {} ({} per entry) (W-03)", plane_name(plane),
                p.indices.size(), p.bytes.size(), p.indices.size() * w, w);
  for (size_t k = w == 1 ? entries_scan(t.format, plane, p.bytes.data(), p.bytes.size()) : 0;
       k < p.indices.size(); ++k)
    if (auto s = check_entry(t.format, plane, p.bytes.data() + k * w, p.indices[k]); !s) return s;
  return {};
}

}  // namespace

bool delta_format_supported(Format format) {
  switch (format) {
    case Format::kBF16:
    case Format::kF16:
    case Format::kF32:
    case Format::kMXFP8:
    case Format::kMXFP4:
    case Format::kFP8_B128:
      return true;
    default:
      return false;
  }
}

int entry_bytes(Format format, Plane plane) {
  const FormatTraits& t = traits(format);
  if (plane == Plane::kScales) return t.scale_bytes;
  return t.element_bits < 8 ? 1 : t.element_bits / 8;
}

Result<std::array<PlaneGeometry, 2>> tensor_geometry(Format format, const std::vector<int64_t>& shape,
                                                     std::string_view name) {
  if (!delta_format_supported(format))
    return fail("{}: format {} cannot be carried by a delta (bf16, f16, f32, mxfp8, mxfp4, fp8-b128)", name,
                traits(format).name);
  if (shape.size() > kMaxRank) return fail("{}: rank {} exceeds {}", name, shape.size(), kMaxRank);
  // note: plane_bytes bounds the element count, but a zero dimension would let the others grow until the
  // [N, K] plane arithmetic overflows, so the product of the non-zero dimensions is bounded here (L-15).
  int64_t extent = 1;
  for (int64_t d : shape) {
    if (d < 0) return fail("{}: negative dimension {} in the shape", name, d);
    if (d > 0 && extent > kMaxExtent / d)
      return fail("{}: shape [{}] exceeds 2^48 elements", name, fmt::join(shape, ", "));
    if (d > 0) extent *= d;
  }
  MXQ_TRY_ASSIGN(pb, plane_bytes(format, shape, name));
  std::array<PlaneGeometry, 2> g{PlaneGeometry{pb.values, pb.values / entry_bytes(format, Plane::kValues)},
                                 PlaneGeometry{pb.scales, 0}};
  if (is_quantized(format)) g[1].entries = pb.scales / entry_bytes(format, Plane::kScales);
  return g;
}

Status check_tensor_delta(const TensorDelta& t) {
  MXQ_TRY_ASSIGN(g, tensor_geometry(t.format, t.shape, t.name));
  if (auto s = check_plane(t, Plane::kValues, g[0]); !s) return fail_in(t.name, s.error());
  if (!is_quantized(t.format)) {
    if (!t.scales.indices.empty() || !t.scales.bytes.empty())
      return fail("{}: plain {} tensor carries scale bytes", t.name, traits(t.format).name);
    return {};
  }
  if (auto s = check_plane(t, Plane::kScales, g[1]); !s) return fail_in(t.name, s.error());
  return {};
}

// ---- writer
// ---------------------------------------------------------------------------------------------------
// Record layout (docs/refit-format.md section 2): name, format name, rank + dims, kind, checksum, then the
// values plane record and, for quantized formats, the scales plane record.
Result<std::vector<uint8_t>> encode_delta_body(const Delta& delta) {
  if (delta.new_version <= delta.base_version)
    return fail("delta new version {} must exceed its base version {} (W-12)", delta.new_version,
                delta.base_version);
  std::set<std::string_view> names;
  std::vector<uint8_t> out;
  put<uint64_t>(out, delta.base_version);
  put<uint64_t>(out, delta.new_version);
  put<uint32_t>(out, static_cast<uint32_t>(delta.tensors.size()));
  for (const TensorDelta& t : delta.tensors) {
    if (t.name.size() > kMaxNameBytes || !printable_name(t.name) || !utf8::is_valid(t.name))
      return fail("tensor name of {} bytes: expected 1..{} bytes of UTF-8 without control bytes",
                  t.name.size(), kMaxNameBytes);
    if (!names.insert(t.name).second) return fail("{}: two records for one tensor (W-07)", t.name);
    if (auto s = check_tensor_delta(t); !s) return tl::unexpected(s.error());
    put<uint16_t>(out, static_cast<uint16_t>(t.name.size()));
    put_bytes(out, {reinterpret_cast<const uint8_t*>(t.name.data()), t.name.size()});
    const std::string_view fmt_name = traits(t.format).name;
    put<uint8_t>(out, static_cast<uint8_t>(fmt_name.size()));
    put_bytes(out, {reinterpret_cast<const uint8_t*>(fmt_name.data()), fmt_name.size()});
    put<uint8_t>(out, static_cast<uint8_t>(t.shape.size()));
    for (int64_t d : t.shape) put<int64_t>(out, d);
    put<uint8_t>(out, t.anchor ? kKindAnchor : kKindSparse);
    put<uint64_t>(out, t.checksum);
    MXQ_TRY_ASSIGN(g, tensor_geometry(t.format, t.shape, t.name));
    for (Plane plane : {Plane::kValues, Plane::kScales}) {
      if (plane == Plane::kScales && !is_quantized(t.format)) break;
      const PlaneDelta& p = plane == Plane::kValues ? t.values : t.scales;
      // note: the encoding is recomputed from the indices, never taken from the caller, so two writers given
      // the same planes write the same bytes.
      if (!t.anchor) {
        const int64_t entries = g[plane == Plane::kValues ? 0 : 1].entries;
        const IndexEncoding enc = choose_encoding(p.indices, entries);
        put<uint8_t>(out, static_cast<uint8_t>(enc));
        put<uint64_t>(out, p.indices.size());
        put<uint64_t>(out, static_cast<uint64_t>(encoded_size(enc, p.indices, entries)));
        encode_indices(enc, p.indices, entries, out);
      }
      put_bytes(out, p.bytes);
    }
  }
  return out;
}

Result<std::vector<uint8_t>> write_delta(const Delta& delta, int zstd_level) {
  MXQ_TRY_ASSIGN(body, encode_delta_body(delta));
  return wrap_body(body, zstd_level);
}

Result<std::vector<uint8_t>> wrap_body(std::span<const uint8_t> body, int zstd_level) {
  const bool raw = zstd_level == kRawBody;
  std::vector<uint8_t> out(kFileHeaderBytes + (raw ? body.size() : ZSTD_compressBound(body.size())));
  std::memcpy(out.data(), kDeltaMagic, 8);
  const uint32_t version = kWireVersion, flags = raw ? kRawBodyFlag : 0;
  const uint64_t body_bytes = body.size(), body_hash = XXH3_64bits(body.data(), body.size());
  std::memcpy(out.data() + 8, &version, 4);
  std::memcpy(out.data() + 12, &flags, 4);
  std::memcpy(out.data() + 16, &body_bytes, 8);
  std::memcpy(out.data() + 24, &body_hash, 8);
  if (raw) {
    if (!body.empty()) std::memcpy(out.data() + kFileHeaderBytes, body.data(), body.size());
    return out;
  }
  const size_t z = ZSTD_compress(out.data() + kFileHeaderBytes, out.size() - kFileHeaderBytes, body.data(),
                                 body.size(), zstd_level);
  if (ZSTD_isError(z)) return fail("zstd compression failed: {}", ZSTD_getErrorName(z));
  out.resize(kFileHeaderBytes + z);
  return out;
}

Status write_delta_file(const Delta& delta, const std::filesystem::path& path, int zstd_level) {
  MXQ_TRY_ASSIGN(bytes, write_delta(delta, zstd_level));
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f.good()) return fail("{}: cannot write {} bytes", path.string(), bytes.size());
  return {};
}

// ---- reader
// ---------------------------------------------------------------------------------------------------
namespace {

// note: the view keeps the index set encoded; the new bytes must be present before anything is decoded,
// which bounds every later allocation by the body.
Result<PlaneView> read_plane_view(Cursor& c, const TensorView& t, Plane plane, const PlaneGeometry& g) {
  PlaneView p;
  if (t.anchor) {
    MXQ_TRY_ASSIGN(bytes, c.take(static_cast<uint64_t>(g.bytes), "anchor plane"));
    p.bytes = bytes;
    return p;
  }
  MXQ_TRY_ASSIGN(enc, c.get<uint8_t>("index encoding"));
  if (enc >= kIndexEncodingCount)
    return fail("index encoding {} is not one of 0 gaps, 1 bitmap, 2 runs", enc);
  MXQ_TRY_ASSIGN(count, c.get<uint64_t>("changed count"));
  MXQ_TRY_ASSIGN(index_bytes, c.get<uint64_t>("index byte count"));
  MXQ_TRY_ASSIGN(index_data, c.take(index_bytes, "index data"));
  const uint64_t w = static_cast<uint64_t>(entry_bytes(t.format, plane));
  if (count > static_cast<uint64_t>(g.entries) || count * w > c.left())
    return fail("{} changed entries of {} bytes: the plane has {} entries and {} body bytes are left (W-03)",
                count, w, g.entries, c.left());
  p.encoding = enc;
  p.count = static_cast<int64_t>(count);
  p.index = index_data;
  MXQ_TRY_ASSIGN(bytes, c.take(count * w, "new bytes"));
  p.bytes = bytes;
  return p;
}

Result<PlaneDelta> decode_plane_view(const PlaneView& v, bool anchor, int64_t entries) {
  PlaneDelta p;
  if (!anchor) {
    MXQ_TRY_ASSIGN(indices,
                   decode_indices(static_cast<IndexEncoding>(v.encoding), v.index, v.count, entries));
    p.indices = std::move(indices);
  }
  p.bytes.assign(v.bytes.begin(), v.bytes.end());
  return p;
}

Result<TensorView> read_tensor_view(Cursor& c) {
  TensorView t;
  MXQ_TRY_ASSIGN(name_len, c.get<uint16_t>("name length"));
  MXQ_TRY_ASSIGN(name, c.take(name_len, "name"));
  t.name.assign(name.begin(), name.end());
  if (!printable_name(t.name))
    return fail("tensor name of {} bytes at body byte {} is empty or holds control bytes", t.name.size(),
                c.pos() - name_len);
  // note: names go into JSON (delta inspect --json, the server's answers), which takes UTF-8 only, and are
  // HF tensor names: at most kMaxNameBytes as the writer enforces (issue 22: the reader took 65,535 and
  // non-UTF-8 bytes, and `delta inspect --json` aborted on them).
  if (t.name.size() > kMaxNameBytes)
    return fail("tensor name of {} bytes at body byte {}: expected at most {}", t.name.size(),
                c.pos() - name_len, kMaxNameBytes);
  if (!utf8::is_valid(t.name))
    return fail("tensor name of {} bytes at body byte {} is not UTF-8", t.name.size(), c.pos() - name_len);
  MXQ_TRY_ASSIGN(fmt_len, c.get<uint8_t>("format length"));
  MXQ_TRY_ASSIGN(fmt_bytes, c.take(fmt_len, "format"));
  const std::string_view fmt_name(reinterpret_cast<const char*>(fmt_bytes.data()), fmt_bytes.size());
  if (!printable_name(fmt_name))
    return fail("{}: format name of {} bytes holds control bytes", t.name, fmt_len);
  auto format = parse_format(fmt_name);
  if (!format) return fail_in(t.name, format.error());
  t.format = *format;
  MXQ_TRY_ASSIGN(rank, c.get<uint8_t>("rank"));
  if (rank > kMaxRank) return fail("{}: rank {} exceeds {}", t.name, rank, kMaxRank);
  for (int i = 0; i < rank; ++i) {
    MXQ_TRY_ASSIGN(d, c.get<int64_t>("dimension"));
    t.shape.push_back(d);
  }
  MXQ_TRY_ASSIGN(g, tensor_geometry(t.format, t.shape, t.name));
  MXQ_TRY_ASSIGN(kind, c.get<uint8_t>("record kind"));
  if (kind != kKindSparse && kind != kKindAnchor)
    return fail("{}: record kind {}, expected 0 or 1", t.name, kind);
  t.anchor = kind == kKindAnchor;
  MXQ_TRY_ASSIGN(checksum, c.get<uint64_t>("checksum"));
  t.checksum = checksum;
  auto values = read_plane_view(c, t, Plane::kValues, g[0]);
  if (!values) return fail_in(t.name + " values", values.error());
  t.values = *values;
  if (is_quantized(t.format)) {
    auto scales = read_plane_view(c, t, Plane::kScales, g[1]);
    if (!scales) return fail_in(t.name + " scales", scales.error());
    t.scales = *scales;
  }
  return t;
}

}  // namespace

Result<TensorDelta> decode_tensor_view(const TensorView& v) {
  MXQ_TRY_ASSIGN(g, tensor_geometry(v.format, v.shape, v.name));
  TensorDelta t{v.name, v.format, v.shape, v.anchor, v.checksum, {}, {}};
  auto values = decode_plane_view(v.values, v.anchor, g[0].entries);
  if (!values) return fail_in(v.name + " values", values.error());
  t.values = std::move(*values);
  if (!is_quantized(v.format)) return t;
  auto scales = decode_plane_view(v.scales, v.anchor, g[1].entries);
  if (!scales) return fail_in(v.name + " scales", scales.error());
  t.scales = std::move(*scales);
  return t;
}

// The body's header into d, then each record read and turned into d's element by `take`, then the check for
// trailing bytes. note: a record is taken as soon as it is read, so the first refusal in body order is the
// one reported.
template <class D, class Take>
Result<D> read_body(std::span<const uint8_t> body, D d, Take take) {
  Cursor c(body);
  MXQ_TRY_ASSIGN(base, c.get<uint64_t>("base version"));
  MXQ_TRY_ASSIGN(next, c.get<uint64_t>("new version"));
  MXQ_TRY_ASSIGN(count, c.get<uint32_t>("tensor count"));
  d.base_version = base;
  d.new_version = next;
  for (uint32_t i = 0; i < count; ++i) {
    auto v = read_tensor_view(c);
    if (!v) return fail("record {} of {}: {}", i, count, v.error().message);
    auto t = take(std::move(*v));
    if (!t) return fail("record {} of {}: {}", i, count, t.error().message);
    d.tensors.push_back(std::move(*t));
  }
  if (c.left()) return fail("{} bytes after the last of {} records", c.left(), count);
  return d;
}

Result<Delta> decode_delta_body(std::span<const uint8_t> body) {
  return read_body(body, Delta{}, [](const TensorView& v) { return decode_tensor_view(v); });
}

Result<DeltaView> parse_delta_view(std::span<const uint8_t> body) {
  DeltaView d;
  d.body = body;
  return read_body(body, std::move(d), [](TensorView&& v) -> Result<TensorView> { return std::move(v); });
}

Result<Delta> decode_delta_view(const DeltaView& view) {
  Delta d{view.base_version, view.new_version, {}};
  for (size_t i = 0; i < view.tensors.size(); ++i) {
    auto t = decode_tensor_view(view.tensors[i]);
    if (!t) return fail("record {} of {}: {}", i, view.tensors.size(), t.error().message);
    d.tensors.push_back(std::move(*t));
  }
  return d;
}

constexpr uint64_t kMaxZstdRatio = 32768;  // content bytes per frame byte, at most (see body_size)

Result<uint64_t> body_size(std::span<const uint8_t> file, const ReadLimits& limits) {
  if (file.size() < kFileHeaderBytes)
    return fail("{} bytes, shorter than the {}-byte delta header", file.size(), kFileHeaderBytes);
  if (std::memcmp(file.data(), kDeltaMagic, 8) != 0) return fail("not an mxq delta (bad magic)");
  uint32_t version, flags;
  uint64_t body_bytes;
  std::memcpy(&version, file.data() + 8, 4);
  std::memcpy(&flags, file.data() + 12, 4);
  std::memcpy(&body_bytes, file.data() + 16, 8);
  if (version != kWireVersion) return fail("wire version {}, this reader speaks {}", version, kWireVersion);
  if ((flags & ~kRawBodyFlag) != 0) return fail("flags 0x{:08X}, expected 0 or 1 (raw body)", flags);
  if (body_bytes > limits.max_body_bytes)
    return fail("body of {} bytes exceeds the limit of {}", body_bytes, limits.max_body_bytes);
  const auto frame = file.subspan(kFileHeaderBytes);
  if (flags & kRawBodyFlag) {
    if (frame.size() != body_bytes)
      return fail("a raw body of {} bytes after the header, the header says {}", frame.size(), body_bytes);
    return body_bytes;
  }
  const size_t frame_bytes = ZSTD_findFrameCompressedSize(frame.data(), frame.size());
  if (ZSTD_isError(frame_bytes) || frame_bytes != frame.size())
    return fail("expected one zstd frame of {} bytes after the header", frame.size());
  const unsigned long long content = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (content != body_bytes)
    return fail("zstd frame declares {} content bytes, header says {}", content, body_bytes);
  // note: a zstd block regenerates at most 128 KiB and takes at least 4 bytes (an RLE block: 3 header bytes
  // and its byte), so no frame holds more than 32768 content bytes per frame byte: a 48-byte file that
  // declares 60 GiB is refused here, before anything is allocated (it aborted with std::bad_alloc).
  if (body_bytes / kMaxZstdRatio > frame.size())
    return fail("a zstd frame of {} bytes cannot hold the {} content bytes it declares", frame.size(),
                body_bytes);
  return body_bytes;
}

namespace {

bool raw_flag(std::span<const uint8_t> file) {
  uint32_t flags;
  std::memcpy(&flags, file.data() + 12, 4);
  return (flags & kRawBodyFlag) != 0;
}

}  // namespace

Status check_body_hash(std::span<const uint8_t> file, std::span<const uint8_t> body) {
  uint64_t body_hash;
  std::memcpy(&body_hash, file.data() + 24, 8);
  if (XXH3_64bits(body.data(), body.size()) != body_hash) return fail("body XXH3-64 differs from the header");
  return {};
}

Result<std::optional<std::span<const uint8_t>>> raw_body(std::span<const uint8_t> file,
                                                         const ReadLimits& limits, bool check_hash) {
  MXQ_TRY_ASSIGN(body_bytes, body_size(file, limits));
  if (!raw_flag(file)) return std::optional<std::span<const uint8_t>>();
  const auto body = file.subspan(kFileHeaderBytes, static_cast<size_t>(body_bytes));
  if (check_hash)
    if (auto s = check_body_hash(file, body); !s) return tl::unexpected(s.error());
  return std::optional(body);
}

Status decompress_body(std::span<const uint8_t> file, std::span<uint8_t> body) {
  MXQ_TRY_ASSIGN(body_bytes, body_size(file));
  if (body.size() != body_bytes)
    return fail("body buffer of {} bytes for a body of {}", body.size(), body_bytes);
  const auto frame = file.subspan(kFileHeaderBytes);
  if (raw_flag(file)) {
    if (!body.empty()) std::memcpy(body.data(), frame.data(), body.size());
  } else if (const size_t got = ZSTD_decompress(body.data(), body.size(), frame.data(), frame.size());
             ZSTD_isError(got) || got != body.size()) {
    return fail("zstd body does not decompress to {} bytes", body_bytes);
  }
  return check_body_hash(file, body);
}

// The header is checked before the frame is touched, and the frame's declared content size against the header
// before the body is allocated: a forged size costs nothing beyond `limits.max_body_bytes`.
Result<Delta> read_delta(std::span<const uint8_t> file, const ReadLimits& limits) {
  MXQ_TRY_ASSIGN(body_bytes, body_size(file, limits));
  // note: not a std::vector: its zero fill would touch every page of a body the frame has not proven yet,
  // and its allocation failure throws.
  const size_t n = static_cast<size_t>(body_bytes);
  std::unique_ptr<uint8_t[]> body(new (std::nothrow) uint8_t[std::max<size_t>(n, 1)]);
  if (!body) return fail("cannot allocate {} bytes for the delta body", n);
  if (auto s = decompress_body(file, std::span(body.get(), n)); !s) return tl::unexpected(s.error());
  return decode_delta_body(std::span<const uint8_t>(body.get(), n));
}

Result<std::string> read_delta_file_bytes(const std::filesystem::path& path, const ReadLimits& limits) {
  auto head = read_regular_file_head(path.string(), sizeof kDeltaMagic);
  if (!head) return tl::unexpected(head.error());
  if (head->size() < sizeof kDeltaMagic || std::memcmp(head->data(), kDeltaMagic, sizeof kDeltaMagic) != 0)
    return fail("{}: not an mxq delta (the file does not start with the magic MXQDELTA)", path.string());
  const uint64_t cap = kFileHeaderBytes + ZSTD_compressBound(static_cast<size_t>(limits.max_body_bytes));
  auto file = read_regular_file(path.string(), cap);
  if (!file) return tl::unexpected(file.error());
  if (!*file) return fail("{}: no such file", path.string());
  return std::move(**file);
}

Result<Delta> read_delta_file(const std::filesystem::path& path, const ReadLimits& limits) {
  auto file = read_delta_file_bytes(path, limits);
  if (!file) return tl::unexpected(file.error());
  auto d = read_delta(std::span(reinterpret_cast<const uint8_t*>(file->data()), file->size()), limits);
  if (!d) return fail_in(path.string(), d.error());
  return d;
}

// ---- validation
// -----------------------------------------------------------------------------------------------
std::string CoverageReport::summary() const {
  auto list = [](const std::vector<std::string>& names) {
    // note: five names are enough to act on; the count says how many more.
    std::vector<std::string_view> shown(names.begin(), names.begin() + std::min<size_t>(names.size(), 5));
    std::string s = fmt::format("{}", fmt::join(shown, ", "));
    if (names.size() > shown.size()) s += fmt::format(", +{} more", names.size() - shown.size());
    return s;
  };
  return fmt::format("{} unknown [{}], {} missing [{}], {} duplicated [{}]", unknown.size(), list(unknown),
                     missing.size(), list(missing), duplicated.size(), list(duplicated));
}

namespace {

template <class D>
CoverageReport coverage_of(const D& delta, const TensorTable& table) {
  CoverageReport r;
  std::map<std::string_view, int> seen;
  for (const auto& t : delta.tensors)
    if (++seen[t.name] == 2) r.duplicated.push_back(t.name);
  for (const auto& [name, n] : seen)
    if (!table.count(name)) r.unknown.emplace_back(name);
  for (const auto& [name, spec] : table)
    if (!seen.count(name)) r.missing.push_back(name);
  return r;
}

// note: the chain rule goes first: a delta for another version is reported as such, not as the coverage or
// type mismatches that a model from another version would also show.
template <class D>
Status validate_records(const D& delta, const TensorTable& table, uint64_t live_version) {
  if (delta.new_version == live_version && delta.base_version != live_version)
    return fail("delta {} -> {} is already applied: live version is {} (W-12)", delta.base_version,
                delta.new_version, live_version);
  if (delta.base_version != live_version)
    return fail("delta {} -> {} applies on version {}, live version is {} (W-12)", delta.base_version,
                delta.new_version, delta.base_version, live_version);
  if (delta.new_version <= delta.base_version)
    return fail("delta new version {} does not exceed its base version {} (W-12)", delta.new_version,
                delta.base_version);
  if (CoverageReport r = coverage_of(delta, table); !r.complete())
    return fail("delta {} -> {} does not cover the model's {} tensors exactly: {} (W-07)", delta.base_version,
                delta.new_version, table.size(), r.summary());
  for (const auto& t : delta.tensors) {
    const TensorSpec& spec = table.find(t.name)->second;
    if (t.format != spec.format || t.shape != spec.shape)
      return fail("{}: delta record is {} [{}], the live tensor is {} [{}] (W-08)", t.name,
                  traits(t.format).name, fmt::join(t.shape, ", "), traits(spec.format).name,
                  fmt::join(spec.shape, ", "));
  }
  return {};
}

}  // namespace

CoverageReport coverage(const Delta& delta, const TensorTable& table) { return coverage_of(delta, table); }

Status validate_delta(const Delta& delta, const TensorTable& table, uint64_t live_version) {
  if (auto s = validate_records(delta, table, live_version); !s) return s;
  // note: the per-entry checks (index order and range, the new-byte policy) dominate for large deltas and
  // are independent per record: all host cores take records in turn; the first failing record in delta
  // order is reported, as a serial scan would.
  const size_t n = delta.tensors.size();
  std::vector<Status> results(n);
  size_t entries = 0;
  for (const TensorDelta& t : delta.tensors) entries += t.values.bytes.size() + t.scales.bytes.size();
  const size_t threads =
      std::min<size_t>({n, std::max(1u, std::thread::hardware_concurrency()), entries / (1 << 16) + 1});
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k = next++; k < n; k = next++) results[k] = check_tensor_delta(delta.tensors[k]);
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& th : pool) th.join();
  for (Status& s : results)
    if (!s) return s;
  return {};
}

// note: the parser already checked every count against its plane and the bytes present (W-03 included:
// the new bytes are count x entry_bytes by construction); a plain tensor has no scales plane to carry.
Status validate_delta_view(const DeltaView& view, const TensorTable& table, uint64_t live_version) {
  return validate_records(view, table, live_version);
}

Status check_tensor_view(const TensorView& t) {
  if (t.anchor) {
    MXQ_TRY_ASSIGN(g, tensor_geometry(t.format, t.shape, t.name));
    if (auto s = check_anchor_plane(t.format, t.shape, Plane::kValues, {{}, t.values.bytes}, g[0]); !s)
      return fail_in(t.name, s.error());
    if (!is_quantized(t.format)) return {};
    if (auto s = check_anchor_plane(t.format, t.shape, Plane::kScales, {{}, t.scales.bytes}, g[1]); !s)
      return fail_in(t.name, s.error());
    return {};
  }
  MXQ_TRY_ASSIGN(d, decode_tensor_view(t));
  return check_tensor_delta(d);
}

#undef MXQ_TRY_ASSIGN

}  // namespace mxq::refit
