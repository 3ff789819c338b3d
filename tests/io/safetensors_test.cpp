// Reader tests: one case per bad_inputs.md ID that applies to safetensors (crafted bytes in temp files),
// valid files of every dtype, zero-size and rank-0 tensors, unaligned data, truncation after open, and the
// golden file written by the python `safetensors` library (tests/golden/make_safetensors_golden.py).
#include "io/safetensors.h"
#include "temp_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace mxq {
namespace {

namespace fs = std::filesystem;
using namespace std::string_literals;

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// u64 header length | header | data: the whole file.
std::string image(std::string_view header, std::string_view data = {}) {
  return le64(header.size()) + std::string(header) + std::string(data);
}

std::string write_file(const std::string& dir, const std::string& name, std::string_view bytes) {
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string u8(const TensorEntry& t, const SafetensorsFile& f) {
  std::string out(t.nbytes(), '\0');
  Status s = f.read(t, std::span(reinterpret_cast<uint8_t*>(out.data()), out.size()));
  EXPECT_TRUE(s.has_value()) << s.error().message;
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// Bad inputs: each must fail at open with one line that names the file and says what was expected.

struct BadCase {
  std::string id;    // bad_inputs.md ID
  std::string name;  // test name suffix
  std::string bytes;
  std::string expect;  // substring of the error
};

void PrintTo(const BadCase& c, std::ostream* os) {
  *os << c.id << " " << c.name << " (" << c.bytes.size() << " bytes, expects \"" << c.expect << "\")";
}

const std::string kU8x2 = R"("dtype":"U8","shape":[2],"data_offsets":[0,2])";

std::string deep_array(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::vector<BadCase> bad_cases() {
  std::vector<BadCase> v = {
      // covers L-01
      {"L-01", "empty_file", "", "expected at least 8 bytes, got 0"},
      {"L-01", "one_byte", "\x01", "expected at least 8 bytes, got 1"},
      {"L-01", "seven_bytes", std::string(7, '\0'), "expected at least 8 bytes, got 7"},
      // covers L-02
      {"L-02", "header_past_eof", le64(100) + std::string(50, ' '), "expected at most 50 bytes, got 100"},
      {"L-02", "header_one_past_eof", le64(3) + "{}", "expected at most 2 bytes, got 3"},
      // covers L-03
      {"L-03", "header_over_100MB", le64(100'000'001) + "{}",
       "expected at most 100000000 bytes, got 100000001"},
      {"L-03", "header_len_u64_max", le64(UINT64_MAX) + "{}", "header length too large"},
      // covers G-01: N + 8 wraps to 0 in u64
      {"G-01", "header_len_wraps", le64(UINT64_MAX - 7) + "{}", "header length too large"},
      // covers G-08: no magic or version in safetensors; a big-endian length reads as a huge N
      {"G-08", "big_endian_length", std::string("\0\0\0\0\0\0\0\x02{}", 10), "header length too large"},
      // covers L-04
      {"L-04", "invalid_byte", image("{\"a\xff\":{}}"), "not valid UTF-8 at byte 11, got 0xff"},
      {"L-04", "overlong_slash", image("{\"\xc0\xaf\":{}}"), "not valid UTF-8 at byte 10, got 0xc0"},
      {"L-04", "utf8_surrogate", image("{\"\xed\xa0\x80\":{}}"), "not valid UTF-8 at byte 10, got 0xed"},
      {"L-04", "truncated_sequence", image("{\"\xe2\x82\":{}}"), "not valid UTF-8"},
      {"L-04", "escaped_lone_surrogate", image(R"({"\ud800":{}})"), "not valid JSON"},
      // covers L-05
      {"L-05", "truncated_json", image(R"({"a":{"dtype":"U8")"), "not valid JSON"},
      {"L-05", "invalid_json", image(R"({"a":})"), "not valid JSON"},
      {"L-05", "empty_header", image(""), "not valid JSON"},
      {"L-05", "two_objects", image("{}{}"), "not valid JSON"},
      {"L-05", "nested_top_array", image(deep_array(100000)), "header, expected a JSON object, got an array"},
      {"L-05", "nested_in_shape", image(R"({"a":{"dtype":"U8","shape":)" + deep_array(5000) + "}}"),
       "a: shape, expected an integer in [0, 2^63), got an array"},
      {"L-05", "nested_in_metadata", image(R"({"__metadata__":{"k":{"k":{"k":"v"}}}})"),
       "__metadata__: value of k, expected a string, got an object"},
      {"L-05", "top_level_string", image(R"("x")"), "header, expected a JSON object, got a string"},
      // covers L-06: NUL padding is not JSON whitespace
      {"L-06", "nul_padding", image(std::string("{}\0\0", 4)),
       "header has a raw NUL at byte 10, expected none"},
      {"L-05", "nul_then_junk", image(std::string("{}\0{\"x\":1}", 10)), "raw NUL at byte 10"},
      {"L-06", "byte_order_mark", image("\xef\xbb\xbf{}"), "starts with a UTF-8 byte-order mark"},
      // covers L-07
      {"L-07", "duplicate_tensor", image("{\"a\":{" + kU8x2 + "},\"a\":{" + kU8x2 + "}}", "xy"),
       "duplicate key a in the header"},
      {"L-07", "duplicate_metadata_block", image(R"({"__metadata__":{},"__metadata__":{}})"),
       "duplicate key __metadata__"},
      {"L-07", "duplicate_metadata_key", image(R"({"__metadata__":{"k":"1","k":"2"}})"),
       "__metadata__: duplicate key k"},
      {"L-07", "duplicate_field",
       image(R"({"a":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})", "x"),
       "a: duplicate field dtype"},
      // covers L-08
      {"L-08", "metadata_number", image(R"({"__metadata__":{"k":1}})"),
       "__metadata__: value of k, expected a string, got the number 1"},
      {"L-08", "metadata_null", image(R"({"__metadata__":{"k":null}})"), "expected a string, got null"},
      {"L-08", "metadata_as_tensor", image("{\"__metadata__\":{" + kU8x2 + "}}", "xy"),
       "__metadata__: value of shape, expected a string, got an array"},
      {"L-08", "metadata_not_object", image(R"({"__metadata__":"x"})"),
       "__metadata__, expected an object of strings, got a string"},
      // covers L-09
      {"L-09", "unknown_dtype_f6",
       image(R"({"a":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}})", "xyz"),
       "a: unsupported dtype F6_E2M3"},
      {"L-09", "unknown_dtype_c64",
       image(R"({"a":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", "12345678"),
       "unsupported dtype C64"},
      {"L-09", "lowercase_dtype", image(R"({"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", "1234"),
       "unsupported dtype f32"},
      {"L-09", "dtype_not_string", image(R"({"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", "1234"),
       "a: dtype, expected a string, got the number 4"},
      {"L-09", "f4_odd_elements", image(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", "xy"),
       "3 elements of F4 do not fill whole bytes, expected a multiple of 8 bits, got 12"},
      // covers L-10
      {"L-10", "negative_dim", image(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})"),
       "a: shape, expected an integer in [0, 2^63), got -1"},
      {"L-10", "fractional_dim", image(R"({"a":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]}})", "xy"),
       "a: shape, expected an integer in [0, 2^63), got 2.5"},
      {"L-10", "exponent_dim", image(R"({"a":{"dtype":"U8","shape":[2e0],"data_offsets":[0,2]}})", "xy"),
       "got 2e0"},
      {"L-10", "dim_2pow63",
       image(R"({"a":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,2]}})", "xy"),
       "got 9223372036854775808"},
      {"L-10", "negative_offset", image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[-2,0]}})", "xy"),
       "a: data_offsets, expected an integer in [0, 2^63), got -2"},
      {"L-10", "offset_past_u64",
       image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,18446744073709551618]}})", "xy"),
       "data_offsets, expected an integer in [0, 2^63), got 18446744073709551618"},
      {"L-10", "three_offsets", image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2,2]}})", "xy"),
       "data_offsets, expected 2 values, got more"},
      {"L-10", "one_offset", image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0]}})", "xy"),
       "data_offsets, expected 2 values, got 1"},
      {"L-10", "missing_field", image(R"({"a":{"dtype":"U8","shape":[2]}})", "xy"), "a: missing field"},
      {"L-10", "unknown_field", image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":0}})", "xy"),
       "a: unknown field x"},
      // covers L-11
      {"L-11", "end_before_begin", image(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", "wxyz"),
       "a: data_offsets, expected end >= begin, got [4, 0]"},
      // covers L-12
      {"L-12", "two_alias_one_range", image("{\"a\":{" + kU8x2 + "},\"b\":{" + kU8x2 + "}}", "xy"),
       "b: overlaps a, expected begin >= 2, got 0"},
      {"L-12", "partial_overlap",
       image(R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
             R"("b":{"dtype":"U8","shape":[3],"data_offsets":[2,5]}})",
             "12345"),
       "b: overlaps a, expected begin >= 3, got 2"},
      // covers L-13
      {"L-13", "hole_at_start", image(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", "xy"),
       "a: hole before the tensor, expected begin 0, got 1"},
      {"L-13", "hole_between",
       image(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
             R"("b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}})",
             "xyz"),
       "b: hole before the tensor, expected begin 1, got 2"},
      {"L-13", "trailing_bytes", image("{\"a\":{" + kU8x2 + "}}", "xy<html>"),
       "data section not fully covered by tensors, expected 2 bytes, got 8"},
      {"L-13", "short_buffer", image("{\"a\":{" + kU8x2 + "}}", "x"),
       "a: data_offsets past the data section, expected end <= 1, got 2"},
      {"L-13", "no_tensor_but_data", image("{}", "x"), "expected 0 bytes, got 1"},
      // covers L-14, G-05
      {"L-14", "million_f32_in_4_bytes",
       image(R"({"a":{"dtype":"F32","shape":[1000,1000],"data_offsets":[0,4]}})", "1234"),
       "a: byte range does not match F32 1000x1000, expected 4000000 bytes, got 4"},
      {"G-05", "logical_larger_than_physical",
       image(R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,4]}})", "1234"),
       "expected 6 bytes, got 4"},
      {"G-05", "logical_smaller_than_physical",
       image(R"({"a":{"dtype":"U16","shape":[1],"data_offsets":[0,4]}})", "1234"), "expected 2 bytes, got 4"},
      // covers L-15
      {"L-15", "dims_2_by_2pow64m2",
       image(R"({"a":{"dtype":"U8","shape":[2,18446744073709551614],"data_offsets":[0,4]}})", "1234"),
       "a: shape, expected an integer in [0, 2^63), got 18446744073709551614"},
      {"L-15", "element_count_overflow",
       image(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", "1234"),
       "a: shape 4294967296x4294967296 overflows"},
      {"L-15", "bit_count_overflow",
       image(R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,4]}})", "1234"),
       "of F64 overflows"},
      // covers G-04: offsets sum far past the data; refused before anything adds them up
      {"G-04", "offset_near_2pow63",
       image(R"({"a":{"dtype":"U8","shape":[9223372036854775807],"data_offsets":[0,9223372036854775807]}})",
             "1"),
       "expected end <= 1, got 9223372036854775807"},
      // covers L-17
      {"L-17", "nul_in_name", image(R"({"a\u0000b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", "xy"),
       "tensor a\\x00b: name contains NUL"},
      {"L-17", "huge_name", image("{\"" + std::string(5000, 'n') + "\":{" + kU8x2 + "}}", "xy"),
       "name too long, expected at most 4096 bytes, got 5000"},
      // covers G-02
      {"G-02", "rank_17",
       image(R"({"a":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", "x"),
       "a: shape, expected rank <= 16, got more dimensions"},
      // covers G-03: dtypes are strings here; an unknown name never reaches a table index
      {"G-03", "dtype_empty_string", image(R"({"a":{"dtype":"","shape":[1],"data_offsets":[0,1]}})", "x"),
       "unsupported dtype , expected one of"},
  };
  // covers L-12: allocation amplification, 1000 tensors over one 4-byte range
  std::string many = "{";
  for (int i = 0; i < 1000; ++i) {
    many +=
        fmt::format("{}\"t{}\":{{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", i ? "," : "", i);
  }
  v.push_back({"L-12", "thousand_aliases", image(many + "}", "1234"), "overlaps"});
  return v;
}

class SafetensorsBadInput : public ::testing::TestWithParam<BadCase> {};

// covers G-09: every case comes back as an error value (asserts are on in every build type, so an assert or
// abort on input would fail the test binary).
TEST_P(SafetensorsBadInput, RefusedWithOneLineNamingTheFile) {
  const BadCase& c = GetParam();
  ScopedTempDir dir;
  const std::string path = write_file(dir.path(), "bad.safetensors", c.bytes);
  Result<SafetensorsFile> f = SafetensorsFile::open(path);
  ASSERT_FALSE(f.has_value()) << c.id;
  const std::string& msg = f.error().message;
  EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
  EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 600u) << msg;
  // The in-memory validator used by the fuzzer agrees with the file path.
  Result<SafetensorsHeader> h =
      parse_safetensors(std::span(reinterpret_cast<const uint8_t*>(c.bytes.data()), c.bytes.size()), path);
  ASSERT_FALSE(h.has_value());
  EXPECT_EQ(h.error().message, msg);
}

INSTANTIATE_TEST_SUITE_P(Cases, SafetensorsBadInput, ::testing::ValuesIn(bad_cases()), [](const auto& info) {
  std::string id = info.param.id;
  id.erase(std::remove(id.begin(), id.end(), '-'), id.end());
  return id + "_" + info.param.name;
});

// covers G-08: names are printed safely (control bytes escaped, nothing raw reaches the log line)
TEST(SafetensorsErrors, ControlBytesInNamesAreEscaped) {
  ScopedTempDir dir;
  const std::string bytes =
      image(R"({"a\n\u001b[31m":{"dtype":"U8","shape":[3],"data_offsets":[0,2]}})", "xy");
  Result<SafetensorsFile> f = SafetensorsFile::open(write_file(dir.path(), "x.safetensors", bytes));
  ASSERT_FALSE(f.has_value());
  EXPECT_NE(f.error().message.find("a\\x0a\\x1b[31m: byte range"), std::string::npos) << f.error().message;
  EXPECT_EQ(f.error().message.find('\x1b'), std::string::npos);
  EXPECT_EQ(printable(std::string(300, 'x')), std::string(200, 'x') + "...(300 bytes)");
  EXPECT_EQ(printable("a\\b\xff"), "a\\\\b\\xff");
}

TEST(SafetensorsErrors, MissingFileAndDirectory) {
  ScopedTempDir dir;
  Result<SafetensorsFile> missing = SafetensorsFile::open(dir.path() + "/nope.safetensors");
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message.find("cannot open"), std::string::npos);
  Result<SafetensorsFile> directory = SafetensorsFile::open(dir.path());
  ASSERT_FALSE(directory.has_value());
  EXPECT_NE(directory.error().message.find("not a regular file"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------------------
// Valid files.

struct DtypeCase {
  std::string name;
  int bits;
  std::vector<int64_t> shape;
  std::string bytes;
};

void PrintTo(const DtypeCase& c, std::ostream* os) { *os << c.name << " (" << c.bits << " bits)"; }

class SafetensorsEveryDtype : public ::testing::TestWithParam<DtypeCase> {};

TEST_P(SafetensorsEveryDtype, OpensAndReadsBytes) {
  const DtypeCase& c = GetParam();
  Result<Dtype> d = parse_dtype(c.name);
  ASSERT_TRUE(d.has_value()) << d.error().message;
  EXPECT_EQ(dtype_name(*d), c.name);
  EXPECT_EQ(dtype_bits(*d), c.bits);
  const std::string shape = fmt::format("{}", fmt::join(c.shape, ","));
  const std::string header = fmt::format(R"({{"t":{{"dtype":"{}","shape":[{}],"data_offsets":[0,{}]}}}})",
                                         c.name, shape, c.bytes.size());
  ScopedTempDir dir;
  Result<SafetensorsFile> f =
      SafetensorsFile::open(write_file(dir.path(), "t.safetensors", image(header, c.bytes)));
  ASSERT_TRUE(f.has_value()) << f.error().message;
  ASSERT_EQ(f->tensors().size(), 1u);
  const TensorEntry* t = f->find("t");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, *d);
  EXPECT_EQ(t->shape, c.shape);
  EXPECT_EQ(u8(*t, *f), c.bytes);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f->bytes(*t).data()), f->bytes(*t).size()), c.bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, SafetensorsEveryDtype,
    ::testing::Values(DtypeCase{"BOOL", 8, {3}, "\x01\x00\x01"s}, DtypeCase{"F4", 4, {2, 2}, "\x21\xf7"},
                      DtypeCase{"U8", 8, {2}, "\xff\x00"s}, DtypeCase{"I8", 8, {2}, "\x80\x7f"},
                      DtypeCase{"F8_E5M2", 8, {1}, "\x3c"}, DtypeCase{"F8_E4M3", 8, {2}, "\x38\x7f"},
                      DtypeCase{"F8_E8M0", 8, {2}, "\x7f\xff"}, DtypeCase{"I16", 16, {1}, "\x01\x80"},
                      DtypeCase{"U16", 16, {2}, "\xff\xff\x00\x01"s}, DtypeCase{"F16", 16, {1}, "\x00\x3c"s},
                      DtypeCase{"BF16", 16, {1, 1}, "\x80\x3f"},
                      DtypeCase{"I32", 32, {1}, "\x01\x02\x03\x04"},
                      DtypeCase{"U32", 32, {1}, "\xff\xff\xff\xff"},
                      DtypeCase{"F32", 32, {1}, "\x00\x00\x80\x3f"s},
                      DtypeCase{"F64", 64, {1}, "\x00\x00\x00\x00\x00\x00\xf0\x3f"s},
                      DtypeCase{"I64", 64, {1}, "\xfe\xff\xff\xff\xff\xff\xff\xff"},
                      DtypeCase{"U64", 64, {1}, "\x01\x00\x00\x00\x00\x00\x00\x80"s}),
    [](const auto& info) { return info.param.name; });

// covers L-16: zero-size tensors (also sharing an offset with a neighbour) and rank 0
TEST(SafetensorsValid, ZeroSizeAndRankZero) {
  const std::string header = R"({"z0":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                             R"("s":{"dtype":"BF16","shape":[],"data_offsets":[0,2]},)"
                             R"("z1":{"dtype":"I64","shape":[3,0,2],"data_offsets":[2,2]},)"
                             R"("z2":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},)"
                             R"("b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]},)"
                             R"("zend":{"dtype":"F4","shape":[0],"data_offsets":[3,3]}})";
  ScopedTempDir dir;
  Result<SafetensorsFile> f =
      SafetensorsFile::open(write_file(dir.path(), "z.safetensors", image(header, "\x80\x3f!")));
  ASSERT_TRUE(f.has_value()) << f.error().message;
  ASSERT_EQ(f->tensors().size(), 6u);
  // Data order: ascending offsets, zero-size before the tensor starting at the same offset, then by name.
  std::vector<std::string> order;
  for (const TensorEntry& t : f->tensors()) order.push_back(t.name);
  EXPECT_EQ(order, (std::vector<std::string>{"z0", "s", "z1", "z2", "b", "zend"}));
  const TensorEntry* s = f->find("s");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(u8(*s, *f), "\x80\x3f");
  const TensorEntry* z1 = f->find("z1");
  ASSERT_NE(z1, nullptr);
  EXPECT_EQ(z1->nbytes(), 0u);
  EXPECT_TRUE(f->read(*z1, {}));
  EXPECT_EQ(f->bytes(*z1).size(), 0u);
  EXPECT_EQ(f->find("nope"), nullptr);
}

// covers L-06: JSON whitespace around the header object is accepted (reference behaviour since #686)
TEST(SafetensorsValid, WhitespaceAroundHeader) {
  const std::string header = " \t\r\n{\"a\":{" + kU8x2 + "}}\n      ";
  ScopedTempDir dir;
  Result<SafetensorsFile> f =
      SafetensorsFile::open(write_file(dir.path(), "w.safetensors", image(header, "xy")));
  ASSERT_TRUE(f.has_value()) << f.error().message;
  EXPECT_EQ(f->data_offset(), 8 + header.size());
  EXPECT_EQ(u8(f->tensors()[0], *f), "xy");
}

// covers L-17: "/" and ".." are only names (nothing here turns a name into a path)
TEST(SafetensorsValid, PathLikeNamesAreJustNames) {
  const std::string header = R"({"../../etc/passwd":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("/abs":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  ScopedTempDir dir;
  Result<SafetensorsFile> f =
      SafetensorsFile::open(write_file(dir.path(), "p.safetensors", image(header, "xy")));
  ASSERT_TRUE(f.has_value()) << f.error().message;
  ASSERT_NE(f->find("../../etc/passwd"), nullptr);
  EXPECT_EQ(u8(*f->find("/abs"), *f), "y");
}

// covers L-18: data at odd file offsets comes out byte-exact through the copying accessor
// covers G-07 (not applicable, shown here): safetensors has no alignment field to be zero or not a power of
// two; offsets are byte offsets, and data at any alignment is legal and read by copying, as this test shows.
TEST(SafetensorsValid, UnalignedData) {
  std::string padded = R"({"u":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("f":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  while ((8 + padded.size() + 1) % 4 != 2) padded += ' ';  // puts "f" at a file offset = 2 (mod 4)
  const std::string data = "\x07\x00\x00\x80\x3f\x00\x00\x00\xc0"s;
  ScopedTempDir dir;
  Result<SafetensorsFile> f =
      SafetensorsFile::open(write_file(dir.path(), "u.safetensors", image(padded, data)));
  ASSERT_TRUE(f.has_value()) << f.error().message;
  const TensorEntry* t = f->find("f");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ((f->data_offset() + t->begin) % 4, 2u);  // not 4-aligned in the file
  std::vector<float> values(2);
  ASSERT_TRUE(f->read(*t, std::span(reinterpret_cast<uint8_t*>(values.data()), 8)));
  EXPECT_EQ(values, (std::vector<float>{1.0f, -2.0f}));
  std::vector<uint8_t> wrong(7);
  Status s = f->read(*t, wrong);
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message.find("f: destination size, expected 8 bytes, got 7"), std::string::npos);
}

TEST(SafetensorsValid, MetadataAndEmptyFile) {
  const std::string header = R"({"__metadata__":{"format":"pt","note":"a\"b"}})";
  ScopedTempDir dir;
  Result<SafetensorsFile> f = SafetensorsFile::open(write_file(dir.path(), "m.safetensors", image(header)));
  ASSERT_TRUE(f.has_value()) << f.error().message;
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "a\"b"}}));
}

// covers L-19: truncation after validation gives an error, not SIGBUS
TEST(SafetensorsTruncation, ReadAfterTruncateFails) {
  ScopedTempDir dir;
  const std::string data(8192, 'd');
  const std::string header = R"({"big":{"dtype":"U8","shape":[8192],"data_offsets":[0,8192]}})";
  const std::string path = write_file(dir.path(), "t.safetensors", image(header, data));
  Result<SafetensorsFile> f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.has_value()) << f.error().message;
  ASSERT_EQ(::truncate(path.c_str(), 8 + static_cast<off_t>(header.size())), 0);
  std::vector<uint8_t> dst(8192);
  Status s = f->read(f->tensors()[0], dst);
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message.find(path + ": big: file size changed after it was validated"),
            std::string::npos)
      << s.error().message;
}

// covers L-19: the guard itself, on pages past the end of a truncated mapping (the race the size check
// misses)
TEST(SafetensorsTruncation, GuardedCopyTurnsSigbusIntoFalse) {
  ScopedTempDir dir;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const std::string path = write_file(dir.path(), "g.bin", std::string(4 * page, 'g'));
  Result<MappedFile> m = MappedFile::open(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(page)), 0);
  std::vector<uint8_t> dst(2 * page);
  EXPECT_TRUE(copy_guarding_sigbus(m->bytes().data(), page, dst.data()));
  EXPECT_EQ(dst[0], 'g');
  EXPECT_FALSE(copy_guarding_sigbus(m->bytes().data() + page, 2 * page, dst.data()));
  EXPECT_FALSE(copy_guarding_sigbus(m->bytes().data() + 2 * page, page, dst.data()));  // the guard re-arms
  EXPECT_TRUE(copy_guarding_sigbus(m->bytes().data(), 16, dst.data()));
  EXPECT_FALSE(m->check_unchanged("g").has_value());
}

// ---------------------------------------------------------------------------------------------------------
// Golden: a file written by the python safetensors library (Rust core) with every dtype, rank 0, zero-size
// and non-ASCII names; the sidecar JSON holds what torch saw (dtype, shape, raw bytes as hex).

std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

TEST(SafetensorsGolden, ReadsPythonWrittenFile) {
  const std::string dir = MXQ_SOURCE_DIR "/tests/golden/safetensors";
  const nlohmann::json expect = nlohmann::json::parse(read_file(dir + "/all_dtypes.json"));
  Result<SafetensorsFile> f = SafetensorsFile::open(dir + "/all_dtypes.safetensors");
  ASSERT_TRUE(f.has_value()) << f.error().message;
  using StringMap = std::map<std::string, std::string>;
  EXPECT_EQ(f->metadata(), expect["metadata"].get<StringMap>());
  ASSERT_EQ(f->tensors().size(), expect["tensors"].size());
  for (const auto& [name, t] : expect["tensors"].items()) {
    SCOPED_TRACE(name);
    const TensorEntry* e = f->find(name);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(dtype_name(e->dtype), t["dtype"].get<std::string>());
    EXPECT_EQ(e->shape, t["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(u8(*e, *f), unhex(t["hex"].get<std::string>()));
  }
}

// Differential: random near-valid images with the reference reader's verdict
// (tests/golden/make_safetensors_differential.py). mxq never accepts what the reference refuses, and refuses
// what it accepts only by its documented stricter rules.
TEST(SafetensorsDifferential, NeverLooserThanTheReference) {
  const std::string blob = read_file(MXQ_SOURCE_DIR "/tests/golden/safetensors/differential.bin");
  const std::vector<std::string> stricter = {"unsupported dtype", "unknown field", "name contains NUL",
                                             "duplicate key"};
  size_t cases = 0, both_accept = 0, only_reference = 0;
  for (size_t at = 0; at + 5 <= blob.size(); ++cases) {
    uint32_t len = 0;
    std::memcpy(&len, blob.data() + at, 4);
    const bool reference_accepts = blob[at + 4] == 1;
    ASSERT_LE(at + 5 + len, blob.size());
    const std::string_view img(blob.data() + at + 5, len);
    at += 5 + len;
    Result<SafetensorsHeader> h =
        parse_safetensors(std::span(reinterpret_cast<const uint8_t*>(img.data()), img.size()), "case");
    SCOPED_TRACE(fmt::format("case {}: {}", cases, printable(img.substr(8, 300))));
    if (!reference_accepts) {
      EXPECT_FALSE(h.has_value());
      continue;
    }
    if (h) {
      ++both_accept;
      continue;
    }
    ++only_reference;
    const bool documented = std::any_of(stricter.begin(), stricter.end(), [&](const std::string& rule) {
      return h.error().message.find(rule) != std::string::npos;
    });
    EXPECT_TRUE(documented) << h.error().message;
  }
  EXPECT_EQ(cases, 600u);
  EXPECT_GT(both_accept, 100u);  // the set exercises acceptance, not only refusals
  EXPECT_GT(only_reference, 0u);
}

}  // namespace
}  // namespace mxq
