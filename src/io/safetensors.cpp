#include "io/safetensors.h"

#include <fmt/format.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

namespace mxq {

static_assert(std::endian::native == std::endian::little, "the header length is read as host u64");

namespace {

struct DtypeRow {
  Dtype dtype;
  std::string_view name;
  int bits;
};

constexpr DtypeRow kDtypes[] = {
    {Dtype::kBool, "BOOL", 8},       {Dtype::kF4, "F4", 4},           {Dtype::kU8, "U8", 8},
    {Dtype::kI8, "I8", 8},           {Dtype::kF8_E5M2, "F8_E5M2", 8}, {Dtype::kF8_E4M3, "F8_E4M3", 8},
    {Dtype::kF8_E8M0, "F8_E8M0", 8}, {Dtype::kI16, "I16", 16},        {Dtype::kU16, "U16", 16},
    {Dtype::kF16, "F16", 16},        {Dtype::kBF16, "BF16", 16},      {Dtype::kI32, "I32", 32},
    {Dtype::kU32, "U32", 32},        {Dtype::kF32, "F32", 32},        {Dtype::kF64, "F64", 64},
    {Dtype::kI64, "I64", 64},        {Dtype::kU64, "U64", 64},
};
static_assert(std::size(kDtypes) == static_cast<size_t>(Dtype::kCount), "one row per Dtype");
constexpr bool dtype_rows_in_order() {
  for (size_t i = 0; i < std::size(kDtypes); ++i)
    if (static_cast<size_t>(kDtypes[i].dtype) != i) return false;
  return true;
}
static_assert(dtype_rows_in_order(), "kDtypes rows must follow the enum order");

constexpr uint64_t kMaxOffset = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// Builds the header straight from nlohmann's SAX events, enforcing the schema as it goes:
//   { "__metadata__": {str: str, ...}, name: {"dtype": str, "shape": [u, ...], "data_offsets": [u, u]}, ... }
// note: the schema has depth 3, and any object or array where the schema has none is refused at its first
// event, so nesting never goes deeper than 3 (L-05). nlohmann's own parser is iterative, not recursive.
class HeaderSax {
 public:
  using json = nlohmann::json;

  explicit HeaderSax(std::string_view label) : label_(label) {}

  bool null() { return unexpected("null"); }
  bool boolean(bool) { return unexpected("a boolean"); }
  bool binary(json::binary_t&) { return unexpected("binary"); }
  bool number_integer(json::number_integer_t v) {
    if (where_ == Where::kShape || where_ == Where::kOffsets) {
      return error("{}: {}, expected an integer in [0, 2^63), got {}", tensor_label(), field_name(), v);
    }
    return unexpected(fmt::format("the number {}", v));
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (where_ == Where::kShape) {
      if (v > kMaxOffset)
        return error("{}: shape, expected an integer in [0, 2^63), got {}", tensor_label(), v);
      if (cur_.shape.size() == kMaxRank) {
        return error("{}: shape, expected rank <= {}, got more dimensions", tensor_label(), kMaxRank);
      }
      cur_.shape.push_back(static_cast<int64_t>(v));
      return true;
    }
    if (where_ == Where::kOffsets) {
      if (v > kMaxOffset) {
        return error("{}: data_offsets, expected an integer in [0, 2^63), got {}", tensor_label(), v);
      }
      if (n_offsets_ == 2) return error("{}: data_offsets, expected 2 values, got more", tensor_label());
      (n_offsets_ == 0 ? cur_.begin : cur_.end) = v;
      ++n_offsets_;
      return true;
    }
    return unexpected(fmt::format("the number {}", v));
  }
  bool number_float(json::number_float_t, const json::string_t& text) {
    if (where_ == Where::kShape || where_ == Where::kOffsets) {
      return error("{}: {}, expected an integer in [0, 2^63), got {}", tensor_label(), field_name(),
                   printable(text));
    }
    return unexpected(fmt::format("the number {}", printable(text)));
  }
  bool string(json::string_t& v) {
    if (where_ == Where::kMetadata) {
      metadata_.insert_or_assign(std::move(pending_key_), std::move(v));
      return true;
    }
    if (where_ == Where::kTensor && field_ == Field::kDtype) {
      Result<Dtype> d = parse_dtype(v);
      if (!d) return error("{}: {}", tensor_label(), d.error().message);
      cur_.dtype = *d;
      return true;
    }
    return unexpected("a string");
  }
  bool start_object(size_t) {
    switch (where_) {
      case Where::kTop:
        where_ = Where::kRoot;
        return true;
      case Where::kRoot:
        if (in_metadata_key_) {
          where_ = Where::kMetadata;
        } else {
          where_ = Where::kTensor;
          seen_fields_ = 0;
          n_offsets_ = 0;
        }
        return true;
      default:
        return unexpected("an object");
    }
  }
  bool key(json::string_t& k) {
    if (where_ == Where::kRoot) {
      if (k.find('\0') != std::string::npos) {
        return error("{}: tensor {}: name contains NUL, expected none", label_, printable(k));
      }
      if (k.size() > kMaxNameBytes) {
        return error("{}: tensor {}: name too long, expected at most {} bytes, got {}", label_, printable(k),
                     kMaxNameBytes, k.size());
      }
      if (!root_keys_.insert(k).second) {
        return error("{}: duplicate key {} in the header, expected each name once", label_, printable(k));
      }
      in_metadata_key_ = k == kMetadataKey;
      cur_ = TensorEntry{};
      cur_.name = std::move(k);
      return true;
    }
    if (where_ == Where::kMetadata) {
      if (metadata_.count(k) != 0) {
        return error("{}: {}: duplicate key {}, expected each key once", label_, kMetadataKey, printable(k));
      }
      pending_key_ = std::move(k);
      return true;
    }
    assert(where_ == Where::kTensor);  // keys only occur inside objects, and objects only at the above
    static constexpr std::array<std::string_view, 3> kFieldNames = {"dtype", "shape", "data_offsets"};
    const auto it = std::find(kFieldNames.begin(), kFieldNames.end(), k);
    if (it == kFieldNames.end()) {
      return error("{}: unknown field {}, expected dtype, shape or data_offsets", tensor_label(),
                   printable(k));
    }
    field_ = static_cast<Field>(it - kFieldNames.begin());
    const unsigned bit = 1u << static_cast<unsigned>(field_);
    if (seen_fields_ & bit) return error("{}: duplicate field {}, expected it once", tensor_label(), *it);
    seen_fields_ |= bit;
    return true;
  }
  bool end_object() {
    switch (where_) {
      case Where::kRoot:
        where_ = Where::kDone;
        return true;
      case Where::kMetadata:
        where_ = Where::kRoot;
        return true;
      case Where::kTensor:
        if (seen_fields_ != 0b111) {
          return error("{}: missing field, expected dtype, shape and data_offsets", tensor_label());
        }
        tensors_.push_back(std::move(cur_));
        where_ = Where::kRoot;
        return true;
      default:
        assert(false && "end_object outside an object");
        return false;
    }
  }
  bool start_array(size_t) {
    if (where_ == Where::kTensor && field_ == Field::kShape) {
      where_ = Where::kShape;
      return true;
    }
    if (where_ == Where::kTensor && field_ == Field::kOffsets) {
      where_ = Where::kOffsets;
      return true;
    }
    return unexpected("an array");
  }
  bool end_array() {
    if (where_ == Where::kOffsets && n_offsets_ != 2) {
      return error("{}: data_offsets, expected 2 values, got {}", tensor_label(), n_offsets_);
    }
    assert(where_ == Where::kShape || where_ == Where::kOffsets);
    where_ = Where::kTensor;
    return true;
  }
  bool parse_error(size_t position, const std::string& token, const nlohmann::detail::exception& e) {
    // note: nlohmann's message quotes the raw token; only the byte position and a printable token go out.
    std::string_view what = e.what();
    const size_t dash = what.rfind(" - ");
    const size_t semi = what.rfind("; last read");
    std::string_view reason = dash != std::string_view::npos
                                  ? what.substr(dash + 3, semi > dash ? semi - dash - 3 : what.npos)
                                  : std::string_view("syntax error");
    return error("{}: header is not valid JSON at byte {}: {} (last read '{}')", label_, position,
                 printable(reason), printable(token));
  }

  const std::string& message() const { return message_; }
  std::vector<TensorEntry> take_tensors() { return std::move(tensors_); }
  std::map<std::string, std::string> take_metadata() { return std::move(metadata_); }

 private:
  enum class Where { kTop, kRoot, kMetadata, kTensor, kShape, kOffsets, kDone };
  enum class Field : unsigned { kDtype, kShape, kOffsets };

  template <class... Args>
  bool error(fmt::format_string<Args...> f, Args&&... args) {
    if (message_.empty()) message_ = fmt::format(f, std::forward<Args>(args)...);
    return false;
  }
  std::string tensor_label() const { return fmt::format("{}: {}", label_, printable(cur_.name)); }
  std::string_view field_name() const { return where_ == Where::kShape ? "shape" : "data_offsets"; }

  // A value of the wrong kind for where it stands; says what the schema wanted there.
  bool unexpected(std::string_view got) {
    switch (where_) {
      case Where::kTop:
        return error("{}: header, expected a JSON object, got {}", label_, got);
      case Where::kRoot:
        if (in_metadata_key_)
          return error("{}: {}, expected an object of strings, got {}", label_, kMetadataKey, got);
        return error("{}: expected an object with dtype, shape and data_offsets, got {}", tensor_label(),
                     got);
      case Where::kMetadata:
        return error("{}: {}: value of {}, expected a string, got {}", label_, kMetadataKey,
                     printable(pending_key_), got);
      case Where::kTensor: {
        static constexpr std::array<std::string_view, 3> kWant = {
            "dtype, expected a string", "shape, expected an array of integers",
            "data_offsets, expected an array of 2 integers"};
        return error("{}: {}, got {}", tensor_label(), kWant[static_cast<unsigned>(field_)], got);
      }
      case Where::kShape:
      case Where::kOffsets:
        return error("{}: {}, expected an integer in [0, 2^63), got {}", tensor_label(), field_name(), got);
      case Where::kDone:
        break;
    }
    return error("{}: unexpected {} after the header object", label_, got);
  }

  std::string_view label_;
  Where where_ = Where::kTop;
  Field field_ = Field::kDtype;
  bool in_metadata_key_ = false;
  unsigned seen_fields_ = 0;
  int n_offsets_ = 0;
  TensorEntry cur_;
  std::string pending_key_;
  std::set<std::string, std::less<>> root_keys_;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
  std::string message_;
};

// L-04: the header must be UTF-8 as a whole (ICU's well-formedness rules: no overlongs, surrogates or
// code points past U+10FFFF).
Status check_utf8(std::string_view text, std::string_view label) {
  assert(text.size() <= kMaxHeaderBytes);  // fits int32_t, as ICU's macros want
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const auto n = static_cast<int32_t>(text.size());
  for (int32_t i = 0; i < n;) {
    const int32_t at = i;
    UChar32 c = 0;
    U8_NEXT(s, i, n, c);
    if (c < 0) return fail("{}: header is not valid UTF-8 at byte {}, got 0x{:02x}", label, 8 + at, s[at]);
  }
  return {};
}

// The first 8 bytes: N, the header length. `prefix` holds min(8, file_size) bytes.
Result<uint64_t> header_length(std::span<const uint8_t> prefix, uint64_t file_size, std::string_view label) {
  if (file_size < 8) {  // covers L-01
    return fail("{}: file too short for the header length, expected at least 8 bytes, got {}", label,
                file_size);
  }
  uint64_t n = 0;
  std::memcpy(&n, prefix.data(), 8);
  if (n > kMaxHeaderBytes) {  // covers L-03 (so 8 + N cannot overflow either)
    return fail("{}: header length too large, expected at most {} bytes, got {}", label, kMaxHeaderBytes, n);
  }
  if (n > file_size - 8) {  // covers L-02
    return fail("{}: header length past the end of the file, expected at most {} bytes, got {}", label,
                file_size - 8, n);
  }
  return n;
}

// Everything after N: JSON schema, then sizes and the exact tiling of the data section.
Result<SafetensorsHeader> parse_header(std::string_view json_text, uint64_t file_size,
                                       std::string_view label) {
  SafetensorsHeader out;
  out.header_bytes = json_text.size();
  out.data_offset = 8 + out.header_bytes;
  const uint64_t data_size = file_size - out.data_offset;

  if (Status s = check_utf8(json_text, label); !s) return tl::unexpected(s.error());
  // note: nlohmann's lexer takes a raw NUL for the end of input (so "{}\0junk" would pass) and skips a
  // leading UTF-8 BOM; JSON allows neither (a NUL inside a string must be escaped) and the reference refuses
  // both.
  if (const size_t nul = json_text.find('\0'); nul != std::string_view::npos) {
    return fail("{}: header has a raw NUL at byte {}, expected none", label, 8 + nul);
  }
  if (json_text.starts_with("\xef\xbb\xbf")) {
    return fail("{}: header starts with a UTF-8 byte-order mark, expected '{{' or whitespace", label);
  }
  HeaderSax sax(label);
  bool ok = false;
  try {
    ok = nlohmann::json::sax_parse(json_text.begin(), json_text.end(), &sax);
  } catch (const std::exception& e) {  // nlohmann reports through parse_error; this is belt and braces
    return fail("{}: header is not valid JSON: {}", label, printable(e.what()));
  }
  if (!ok) {
    if (sax.message().empty()) return fail("{}: header is not valid JSON", label);
    return tl::unexpected(Error{sax.message()});
  }
  out.tensors = sax.take_tensors();
  out.metadata = sax.take_metadata();

  for (const TensorEntry& t : out.tensors) {
    const std::string name = printable(t.name);
    if (t.end < t.begin) {  // covers L-11
      return fail("{}: {}: data_offsets, expected end >= begin, got [{}, {}]", label, name, t.begin, t.end);
    }
    if (t.end > data_size) {
      return fail("{}: {}: data_offsets past the data section, expected end <= {}, got {}", label, name,
                  data_size, t.end);
    }
    Result<uint64_t> want = tensor_nbytes(t.dtype, t.shape, fmt::format("{}: {}", label, name));
    if (!want) return tl::unexpected(want.error());
    if (*want != t.nbytes()) {  // covers L-14, G-05
      return fail("{}: {}: byte range does not match {} {}, expected {} bytes, got {}", label, name,
                  dtype_name(t.dtype), fmt::join(t.shape, "x"), *want, t.nbytes());
    }
  }

  // note: sorting by (begin, end) puts zero-size tensors at an offset before the tensor that starts there, so
  // the walk below accepts them (L-16) while any two non-empty tensors sharing bytes fail it (L-12).
  std::sort(out.tensors.begin(), out.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t cursor = 0;
  const TensorEntry* prev = nullptr;
  for (const TensorEntry& t : out.tensors) {
    if (t.begin < cursor) {  // covers L-12
      return fail("{}: {}: overlaps {}, expected begin >= {}, got {}", label, printable(t.name),
                  printable(prev->name), cursor, t.begin);
    }
    if (t.begin > cursor) {  // covers L-13 (hole)
      return fail("{}: {}: hole before the tensor, expected begin {}, got {}", label, printable(t.name),
                  cursor, t.begin);
    }
    cursor = t.end;
    prev = &t;
  }
  if (cursor != data_size) {  // covers L-13 (trailing bytes)
    return fail("{}: data section not fully covered by tensors, expected {} bytes, got {}", label, cursor,
                data_size);
  }
  return out;
}

}  // namespace

Result<Dtype> parse_dtype(std::string_view name) {
  for (const DtypeRow& row : kDtypes)
    if (row.name == name) return row.dtype;
  return fail(
      "unsupported dtype {}, expected one of BOOL F4 U8 I8 F8_E5M2 F8_E4M3 F8_E8M0 I16 U16 F16 BF16 "
      "I32 U32 F32 F64 I64 U64",
      printable(name));
}

std::string_view dtype_name(Dtype dtype) {
  assert(dtype < Dtype::kCount);
  return kDtypes[static_cast<size_t>(dtype)].name;
}

int dtype_bits(Dtype dtype) {
  assert(dtype < Dtype::kCount);
  return kDtypes[static_cast<size_t>(dtype)].bits;
}

Result<uint64_t> tensor_nbytes(Dtype dtype, std::span<const int64_t> shape, std::string_view what) {
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) return fail("{}: shape, expected dimensions >= 0, got {}", what, d);
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {  // covers L-15
      return fail("{}: shape {} overflows, expected an element count below 2^64", what,
                  fmt::join(shape, "x"));
    }
  }
  uint64_t bits = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_bits(dtype)), &bits)) {
    return fail("{}: shape {} of {} overflows, expected a size below 2^64 bits", what, fmt::join(shape, "x"),
                dtype_name(dtype));
  }
  if (bits % 8 != 0) {  // covers L-09 (sub-byte)
    return fail("{}: {} elements of {} do not fill whole bytes, expected a multiple of 8 bits, got {}", what,
                numel, dtype_name(dtype), bits);
  }
  return bits / 8;
}

std::string printable(std::string_view text) {
  // note: plain byte escaping on purpose: fmt 9's "{:?}" aborts on some invalid UTF-8 (found by the fuzzer).
  constexpr size_t kShown = 200;
  std::string s;
  s.reserve(std::min(text.size(), kShown) + 16);
  for (const char ch : text.substr(0, kShown)) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\') {
      s += "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      s += ch;
    } else {
      s += fmt::format("\\x{:02x}", c);
    }
  }
  if (text.size() > kShown) s += fmt::format("...({} bytes)", text.size());
  return s;
}

Result<SafetensorsHeader> parse_safetensors(std::span<const uint8_t> image, std::string_view label) {
  Result<uint64_t> n = header_length(image.first(std::min<size_t>(image.size(), 8)), image.size(), label);
  if (!n) return tl::unexpected(n.error());
  const auto* json = reinterpret_cast<const char*>(image.data() + 8);
  return parse_header(std::string_view(json, *n), image.size(), label);
}

SafetensorsFile::SafetensorsFile(MappedFile map, SafetensorsHeader header)
    : map_(std::move(map)), header_(std::move(header)) {
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  Result<MappedFile> map = MappedFile::open(path);
  if (!map) return tl::unexpected(map.error());
  const std::span<const uint8_t> image = map->bytes();
  // note: the header is copied out under the SIGBUS guard too, so a file truncated while we validate it
  // yields an error rather than a crash.
  std::array<uint8_t, 8> prefix{};
  const size_t prefix_len = std::min<size_t>(image.size(), 8);
  if (!copy_guarding_sigbus(image.data(), prefix_len, prefix.data())) {
    return fail("{}: file truncated while reading the header length", path);
  }
  Result<uint64_t> n = header_length(std::span(prefix).first(prefix_len), image.size(), path);
  if (!n) return tl::unexpected(n.error());
  std::string json(*n, '\0');
  if (!copy_guarding_sigbus(image.data() + 8, *n, reinterpret_cast<uint8_t*>(json.data()))) {
    return fail("{}: file truncated while reading the header", path);
  }
  Result<SafetensorsHeader> header = parse_header(json, image.size(), path);
  if (!header) return tl::unexpected(header.error());
  return SafetensorsFile(std::move(*map), std::move(*header));
}

const TensorEntry* SafetensorsFile::find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

std::span<const uint8_t> SafetensorsFile::bytes(const TensorEntry& entry) const {
  assert(&entry >= header_.tensors.data() && &entry < header_.tensors.data() + header_.tensors.size());
  return map_.bytes().subspan(header_.data_offset + entry.begin, entry.nbytes());
}

Status SafetensorsFile::read(const TensorEntry& entry, std::span<uint8_t> dst) const {
  const std::span<const uint8_t> src = bytes(entry);
  if (dst.size() != src.size()) {
    return fail("{}: {}: destination size, expected {} bytes, got {}", path(), printable(entry.name),
                src.size(), dst.size());
  }
  if (Status s = map_.check_unchanged(printable(entry.name)); !s) return s;
  if (!copy_guarding_sigbus(src.data(), src.size(), dst.data())) {  // covers L-19
    return fail(
        "{}: {}: bus error reading the mapping, expected {} readable bytes at offset {} (file truncated "
        "while reading?)",
        path(), printable(entry.name), src.size(), header_.data_offset + entry.begin);
  }
  return {};
}

}  // namespace mxq
