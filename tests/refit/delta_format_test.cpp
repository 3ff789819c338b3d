// Delta files: write/read round trips of every record kind, the reader's refusals of malformed files, and
// validate_delta against an engine tensor table, one case per W-xx fault.
#include "refit/delta_format.h"

#include <gtest/gtest.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <random>

#include "refit/delta_encoder.h"
#include "refit/index_codec.h"

namespace mxq::refit {
namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed, uint8_t max = 0x7E) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng() % (max + 1));
  return v;
}

// A small valid model: one tensor of each format, changed in a few entries.
struct Model {
  TensorTable table;
  Delta delta;
};
Model small_model() {
  Model m;
  const std::vector<std::tuple<std::string, Format, std::vector<int64_t>>> specs = {
      {"a.mxfp8", Format::kMXFP8, {4, 64}},     {"b.mxfp4", Format::kMXFP4, {4, 64}},
      {"c.b128", Format::kFP8_B128, {130, 20}}, {"d.bf16", Format::kBF16, {100}},
      {"e.f32", Format::kF32, {3, 3}},          {"f.experts", Format::kMXFP8, {2, 4, 32}}};
  m.delta = {3, 4, {}};
  uint32_t seed = 1;
  for (const auto& [name, format, shape] : specs) {
    m.table[name] = {format, shape};
    auto g = *tensor_geometry(format, shape, name);
    auto ov = random_bytes(static_cast<size_t>(g[0].bytes), seed++), nv = ov;
    auto os = random_bytes(static_cast<size_t>(g[1].bytes), seed++, 0x7F), ns = os;
    if (format == Format::kFP8_B128)  // f32 scales: keep them finite and positive
      for (size_t i = 0; i < os.size(); i += 4) os[i + 3] = ns[i + 3] = 0x3F;
    nv[1] = 0x10;
    nv.back() = 0x22;
    if (!ns.empty()) ns[0] = 0x40;
    CanonicalPlanes o{ov, os}, n{nv, ns};
    m.delta.tensors.push_back(*diff_tensor(name, format, shape, &o, n, name == "e.f32"));
  }
  return m;
}

bool same(const Delta& a, const Delta& b) {
  if (a.base_version != b.base_version || a.new_version != b.new_version ||
      a.tensors.size() != b.tensors.size())
    return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const TensorDelta &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.format != y.format || x.shape != y.shape || x.anchor != y.anchor ||
        x.checksum != y.checksum || x.values.indices != y.values.indices ||
        x.values.bytes != y.values.bytes || x.scales.indices != y.scales.indices ||
        x.scales.bytes != y.scales.bytes)
      return false;
  }
  return true;
}

TEST(DeltaFile, RoundTripsEveryRecordKind) {
  Model m = small_model();
  ASSERT_TRUE(validate_delta(m.delta, m.table, 3)) << validate_delta(m.delta, m.table, 3).error().message;
  for (int level : {kRawBody, 1, 3, 19}) {
    auto file = write_delta(m.delta, level);
    ASSERT_TRUE(file) << file.error().message;
    auto back = read_delta(*file);
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_TRUE(same(*back, m.delta)) << "level " << level;
  }
  EXPECT_TRUE(m.delta.tensors[4].anchor);
  EXPECT_FALSE(m.delta.tensors[0].anchor);
}

// Flags bit 0: the body stored as it is. It is read where it lies (raw_body: the same bytes as the encoded
// body, inside the file), decompress_body copies it, and a cut, a longer tail or a changed byte is refused.
TEST(DeltaFile, ARawBodyIsReadInPlace) {
  Model m = small_model();
  auto body = encode_delta_body(m.delta);
  ASSERT_TRUE(body);
  auto file = wrap_body(*body, kRawBody);
  ASSERT_TRUE(file);
  ASSERT_EQ(file->size(), kFileHeaderBytes + body->size());
  uint32_t flags;
  std::memcpy(&flags, file->data() + 12, 4);
  EXPECT_EQ(flags, kRawBodyFlag);
  auto in_place = raw_body(*file);
  ASSERT_TRUE(in_place) << in_place.error().message;
  ASSERT_TRUE(*in_place);
  EXPECT_EQ((*in_place)->data(), file->data() + kFileHeaderBytes);
  EXPECT_TRUE(std::equal((*in_place)->begin(), (*in_place)->end(), body->begin(), body->end()));
  std::vector<uint8_t> copy(body->size());
  ASSERT_TRUE(decompress_body(*file, copy));
  EXPECT_EQ(copy, *body);
  auto zstd = write_delta(m.delta, 3);
  ASSERT_TRUE(zstd);
  auto none = raw_body(*zstd);
  ASSERT_TRUE(none);
  EXPECT_FALSE(*none);  // a zstd file: decompress_body's job
  std::vector<uint8_t> longer = *file, cut = *file, changed = *file;
  longer.push_back(0);
  cut.pop_back();
  changed.back() ^= 1;
  for (auto* f : {&longer, &cut}) {
    auto r = raw_body(*f);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("a raw body of"), std::string::npos) << r.error().message;
  }
  auto r = raw_body(changed);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("XXH3-64"), std::string::npos) << r.error().message;
  EXPECT_FALSE(read_delta(changed));
}

// The undecoded view (refit's device path) holds the same delta: decoding it gives what the reader gives,
// its spans point into the body, and validate_delta_view agrees with validate_delta on the record checks.
// issue 22: a 49-byte file whose zstd frame declares 60 GiB of content aborted with std::bad_alloc (the body
// was allocated from the declared size). Refused by the frame's own bound, before any allocation.
TEST(DeltaFile, AForgedContentSizeIsRefusedBeforeAllocating) {
  const uint64_t declared = uint64_t{60} << 30;
  std::vector<uint8_t> f(kFileHeaderBytes);
  std::memcpy(f.data(), kDeltaMagic, 8);
  const uint32_t version = kWireVersion, flags = 0;
  std::memcpy(f.data() + 8, &version, 4);
  std::memcpy(f.data() + 12, &flags, 4);
  std::memcpy(f.data() + 16, &declared, 8);
  // zstd frame: magic, descriptor 0xE0 (8-byte content size, single segment), the size, one raw last block
  // of one byte
  for (uint8_t b : {0x28, 0xB5, 0x2F, 0xFD, 0xE0}) f.push_back(b);
  for (int i = 0; i < 8; ++i) f.push_back(static_cast<uint8_t>(declared >> (8 * i)));
  for (uint8_t b : {0x09, 0x00, 0x00, 0x41}) f.push_back(b);
  ASSERT_EQ(ZSTD_getFrameContentSize(f.data() + kFileHeaderBytes, f.size() - kFileHeaderBytes), declared);
  auto d = read_delta(f);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("cannot hold the 64424509440 content bytes it declares"), std::string::npos)
      << d.error().message;
  auto n = body_size(f);
  ASSERT_FALSE(n);
}

TEST(DeltaView, DecodesToWhatTheReaderReads) {
  Model m = small_model();
  auto body = encode_delta_body(m.delta);
  ASSERT_TRUE(body);
  auto view = parse_delta_view(*body);
  ASSERT_TRUE(view) << view.error().message;
  ASSERT_EQ(view->tensors.size(), m.delta.tensors.size());
  for (const TensorView& t : view->tensors) {
    EXPECT_TRUE(check_tensor_view(t)) << t.name;
    for (Plane plane : {Plane::kValues, Plane::kScales}) {
      const PlaneView& p = plane == Plane::kValues ? t.values : t.scales;
      if (!p.bytes.empty()) {
        EXPECT_TRUE(p.bytes.data() >= body->data() && p.bytes.data() < body->data() + body->size());
      }
      if (!t.anchor) {
        EXPECT_EQ(p.bytes.size(), static_cast<size_t>(p.count * entry_bytes(t.format, plane))) << t.name;
      }
    }
  }
  auto decoded = decode_delta_view(*view);
  ASSERT_TRUE(decoded) << decoded.error().message;
  EXPECT_TRUE(same(*decoded, m.delta));
  EXPECT_TRUE(validate_delta_view(*view, m.table, 3));
  auto stale = validate_delta_view(*view, m.table, 2);
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().message, validate_delta(m.delta, m.table, 2).error().message);
  // a zero gap passes the parse (structure intact) and is refused by the record check, as by the reader
  std::vector<uint8_t> bad = *body;
  const PlaneView& v = view->tensors[0].values;
  ASSERT_EQ(v.encoding, 0) << "two changed entries of 256: gaps";
  ASSERT_GE(v.index.size(), 2u);  // indices 1 and 255: varints 01, FE 01
  bad[static_cast<size_t>(v.index.data() - body->data()) + 1] = 0;
  auto bad_view = parse_delta_view(bad);
  ASSERT_TRUE(bad_view);
  auto why = check_tensor_view(bad_view->tensors[0]);
  ASSERT_FALSE(why);
  EXPECT_NE(why.error().message.find("a.mxfp8 values: index 1 repeats at position 1 (W-02)"),
            std::string::npos)
      << why.error().message;
  EXPECT_FALSE(decode_delta_body(bad));
}

// Run tables (the device path's form of a runs set) against decode_indices, and its refusals.
TEST(IndexCodec, RunTableMatchesDecodeIndices) {
  const std::vector<int64_t> idx = {0, 1, 2, 200, 201, 290};
  std::vector<uint8_t> data;
  encode_indices(IndexEncoding::kRuns, idx, 300, data);
  auto table = decode_run_table(data, 6, 300);
  ASSERT_TRUE(table);
  EXPECT_EQ(*table, (std::vector<int32_t>{0, 0, 200, 3, 290, 5}));
  EXPECT_FALSE(decode_run_table(data, 5, 300));
  EXPECT_FALSE(decode_run_table(data, 7, 300));
  EXPECT_FALSE(decode_run_table(data, 6, 290));
  std::vector<uint8_t> touching = {0x00, 0x02, 0x00, 0x01};
  auto t = decode_run_table(touching, 3, 10);
  ASSERT_FALSE(t);
  EXPECT_EQ(t.error().message, decode_indices(IndexEncoding::kRuns, touching, 3, 10).error().message);
}

// ---- reader refusals: each case edits the file or its body
// ---------------------------------------------------
struct FileCase {
  std::string name;
  std::function<void(std::vector<uint8_t>& file)> edit_file;  // applied to the whole file
  std::function<void(std::vector<uint8_t>& body)> edit_body;  // applied to the body, then re-wrapped
  std::string expect;
};
void PrintTo(const FileCase& c, std::ostream* os) { *os << c.name; }

// Offset of the first record's rank byte: versions 16 + count 4 + name length 2 + "a.mxfp8" 7 + 1 +
// "mxfp8" 5.
constexpr size_t kRankAt = 20 + 2 + 7 + 1 + 5;

class DeltaReadRefusal : public ::testing::TestWithParam<FileCase> {};

TEST_P(DeltaReadRefusal, NamesTheFault) {
  const FileCase& c = GetParam();
  Model m = small_model();
  std::vector<uint8_t> file;
  if (c.edit_body) {
    auto body = *encode_delta_body(m.delta);
    c.edit_body(body);
    file = *wrap_body(body);
  } else {
    file = *write_delta(m.delta);
    c.edit_file(file);
  }
  auto r = read_delta(file, ReadLimits{uint64_t{1} << 20});
  ASSERT_FALSE(r) << c.name;
  EXPECT_NE(r.error().message.find(c.expect), std::string::npos) << r.error().message;
}

void put_u32(std::vector<uint8_t>& f, size_t at, uint32_t v) { std::memcpy(f.data() + at, &v, 4); }
void put_u64(std::vector<uint8_t>& f, size_t at, uint64_t v) { std::memcpy(f.data() + at, &v, 8); }

INSTANTIATE_TEST_SUITE_P(
    Bad, DeltaReadRefusal,
    ::testing::Values(
        FileCase{"short_file", [](auto& f) { f.resize(31); }, nullptr, "shorter than"},
        FileCase{"bad_magic", [](auto& f) { f[0] = 'X'; }, nullptr, "bad magic"},
        FileCase{"future_version", [](auto& f) { put_u32(f, 8, 2); }, nullptr,
                 "wire version 2"},  // covers G-08
        FileCase{"flags", [](auto& f) { put_u32(f, 12, 2); }, nullptr, "expected 0 or 1"},
        // the raw-body flag on a zstd frame: the frame's bytes are not the body's count
        FileCase{"raw_flag_on_a_frame", [](auto& f) { put_u32(f, 12, kRawBodyFlag); }, nullptr,
                 "a raw body of"},
        FileCase{"body_over_limit", [](auto& f) { put_u64(f, 16, uint64_t{1} << 40); }, nullptr,
                 "exceeds the limit"},
        FileCase{"body_size_lies", [](auto& f) { put_u64(f, 16, 7); }, nullptr, "declares"},
        FileCase{"body_hash", [](auto& f) { f[24] ^= 1; }, nullptr, "XXH3-64"},
        FileCase{"trailing_bytes", [](auto& f) { f.push_back(0); }, nullptr, "one zstd frame"},
        FileCase{"truncated_frame", [](auto& f) { f.pop_back(); }, nullptr, "one zstd frame"},
        FileCase{"body_trailing", nullptr, [](auto& b) { b.push_back(0); }, "after the last"},
        FileCase{"body_cut", nullptr, [](auto& b) { b.resize(b.size() - 3); }, "record 5 of 6: f.experts"},
        FileCase{"more_records_than_body", nullptr, [](auto& b) { b[16] = 7; }, "record 6 of 7"},
        FileCase{"unknown_format", nullptr, [](auto& b) { b[kRankAt - 1] = 'Z'; }, "unknown format"},
        FileCase{"rank_too_big", nullptr, [](auto& b) { b[kRankAt] = 9; }, "rank 9"},  // covers G-02
        FileCase{"negative_dim", nullptr,                                              // covers L-10
                 [](auto& b) { put_u64(b, kRankAt + 1, static_cast<uint64_t>(-4)); }, "negative"},
        FileCase{"zero_dim_huge_others", nullptr,  // covers L-15 (found by fuzz_delta)
                 [](auto& b) {
                   put_u64(b, kRankAt + 1, 0);
                   put_u64(b, kRankAt + 9, uint64_t{1} << 62);
                 },
                 "exceeds 2^48"},
        FileCase{"name_with_newline", nullptr, [](auto& b) { b[23] = '\n'; },
                 "control bytes"},  // covers L-17
        // issue 22: `delta inspect --json` aborted on such a name
        FileCase{"name_not_utf8", nullptr, [](auto& b) { b[23] = 0xFF; }, "is not UTF-8"},
        FileCase{"record_kind", nullptr, [](auto& b) { b[kRankAt + 17] = 2; }, "record kind 2"},
        FileCase{"encoding_code", nullptr, [](auto& b) { b[kRankAt + 26] = 3; }, "index encoding 3"},
        FileCase{"count_past_plane", nullptr,  // covers W-01 / W-03: more changes than entries
                 [](auto& b) { put_u64(b, kRankAt + 27, 1u << 20); }, "W-03"}),
    [](const auto& info) { return info.param.name; });

// ---- validation against the engine
// -------------------------------------------------------------------------
struct ValidateCase {
  std::string name;
  std::function<void(Model&)> edit;
  uint64_t live_version;
  std::string expect;  // substring of the error; empty = accepted
};
void PrintTo(const ValidateCase& c, std::ostream* os) { *os << c.name; }

class DeltaValidate : public ::testing::TestWithParam<ValidateCase> {};

TEST_P(DeltaValidate, Verdict) {
  const ValidateCase& c = GetParam();
  Model m = small_model();
  c.edit(m);
  Status s = validate_delta(m.delta, m.table, c.live_version);
  if (c.expect.empty()) {
    EXPECT_TRUE(s) << s.error().message;
    return;
  }
  ASSERT_FALSE(s) << c.name;
  EXPECT_NE(s.error().message.find(c.expect), std::string::npos) << s.error().message;
  EXPECT_EQ(s.error().message.find('\n'), std::string::npos) << "one line";
}

TensorDelta& tensor(Model& m, std::string_view name) {
  for (auto& t : m.delta.tensors)
    if (t.name == name) return t;
  throw std::logic_error("no such test tensor");
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DeltaValidate,
    ::testing::Values(
        ValidateCase{"valid", [](Model&) {}, 3, ""},
        // covers W-01
        ValidateCase{"value_index_at_numel",
                     [](Model& m) { tensor(m, "a.mxfp8").values.indices.back() = 256; }, 3,
                     "a.mxfp8: values: index 256"},
        ValidateCase{"scale_index_negative", [](Model& m) { tensor(m, "a.mxfp8").scales.indices[0] = -1; }, 3,
                     "a.mxfp8: scales: index -1"},
        // covers W-02
        ValidateCase{"duplicate_index",
                     [](Model& m) {
                       auto& p = tensor(m, "a.mxfp8").values;
                       p.indices = {5, 5};
                       p.bytes = {1, 2};
                     },
                     3, "repeats"},
        // covers W-04
        ValidateCase{"unsorted",
                     [](Model& m) {
                       auto& p = tensor(m, "b.mxfp4").values;
                       p.indices = {9, 5};
                       p.bytes = {1, 2};
                     },
                     3, "must increase"},
        // covers W-03
        ValidateCase{"length_mismatch", [](Model& m) { tensor(m, "a.mxfp8").values.bytes.push_back(0); }, 3,
                     "W-03"},
        ValidateCase{"f32_scale_width", [](Model& m) { tensor(m, "c.b128").scales.bytes.pop_back(); }, 3,
                     "4 per entry"},
        ValidateCase{"bf16_width", [](Model& m) { tensor(m, "d.bf16").values.bytes.resize(1); }, 3,
                     "2 per entry"},
        // covers W-05
        ValidateCase{"e4m3_nan_7f", [](Model& m) { tensor(m, "a.mxfp8").values.bytes[0] = 0x7F; }, 3,
                     "E4M3 NaN"},
        ValidateCase{"e4m3_nan_ff", [](Model& m) { tensor(m, "c.b128").values.bytes[0] = 0xFF; }, 3,
                     "E4M3 NaN"},
        ValidateCase{"e8m0_ff", [](Model& m) { tensor(m, "a.mxfp8").scales.bytes[0] = 0xFF; }, 3, "0xFF"},
        ValidateCase{"e8m0_00_is_legal", [](Model& m) { tensor(m, "a.mxfp8").scales.bytes[0] = 0x00; }, 3,
                     ""},
        ValidateCase{"mxfp4_any_code", [](Model& m) { tensor(m, "b.mxfp4").values.bytes[0] = 0xFF; }, 3, ""},
        ValidateCase{"b128_scale_zero",
                     [](Model& m) {
                       auto& b = tensor(m, "c.b128").scales.bytes;
                       std::fill(b.begin(), b.begin() + 4, 0);
                     },
                     3, "finite > 0"},
        ValidateCase{"bf16_inf",
                     [](Model& m) {
                       auto& b = tensor(m, "d.bf16").values.bytes;
                       b[0] = 0x80, b[1] = 0x7F;
                     },
                     3, "NaN/Inf"},
        ValidateCase{"anchor_nan",
                     [](Model& m) {
                       tensor(m, "e.f32").values.bytes[3] = 0x7F, tensor(m, "e.f32").values.bytes[2] = 0xC0;
                     },
                     3, "NaN/Inf"},
        // covers W-07
        ValidateCase{"unknown_name", [](Model& m) { tensor(m, "d.bf16").name = "zz.bf16"; }, 3,
                     "1 unknown [zz.bf16], 1 missing [d.bf16], 0 duplicated"},
        ValidateCase{"missing_name", [](Model& m) { m.delta.tensors.pop_back(); }, 3,
                     "1 missing [f.experts]"},
        ValidateCase{"duplicate_name", [](Model& m) { m.delta.tensors.push_back(m.delta.tensors[0]); }, 3,
                     "1 duplicated [a.mxfp8]"},
        // covers W-08
        ValidateCase{"anchor_short", [](Model& m) { tensor(m, "e.f32").values.bytes.resize(32); }, 3,
                     "anchor values plane of 32 bytes, expected 36"},
        ValidateCase{"anchor_missing_scales",
                     [](Model& m) {
                       auto& t = tensor(m, "a.mxfp8");
                       t.anchor = true;
                       t.values = {{}, std::vector<uint8_t>(256, 1)};
                       t.scales = {};
                     },
                     3, "anchor scales plane of 0 bytes, expected 8"},
        ValidateCase{"wrong_format", [](Model& m) { tensor(m, "b.mxfp4").format = Format::kMXFP8; }, 3,
                     "b.mxfp4: delta record is mxfp8 [4, 64], the live tensor is mxfp4 [4, 64]"},
        ValidateCase{"wrong_shape", [](Model& m) { tensor(m, "e.f32").shape = {9}; }, 3, "(W-08)"},
        // covers W-12
        ValidateCase{"wrong_base", [](Model&) {}, 2, "applies on version 3, live version is 2"},
        ValidateCase{"already_applied", [](Model&) {}, 4, "already applied"},
        ValidateCase{"not_newer", [](Model& m) { m.delta.new_version = 3; }, 3, "does not exceed"}),
    [](const auto& info) { return info.param.name; });

TEST(DeltaCoverage, ReportListsEveryName) {
  Model m = small_model();
  m.delta.tensors.erase(m.delta.tensors.begin(), m.delta.tensors.begin() + 2);
  CoverageReport r = coverage(m.delta, m.table);
  EXPECT_EQ(r.missing, (std::vector<std::string>{"a.mxfp8", "b.mxfp4"}));
  EXPECT_TRUE(r.unknown.empty());
  EXPECT_FALSE(r.complete());
}

TEST(DeltaWrite, RefusesWhatTheReaderWould) {
  Model m = small_model();
  tensor(m, "a.mxfp8").values.bytes[0] = 0x7F;  // covers W-05 on the trainer side
  EXPECT_FALSE(write_delta(m.delta));
  m = small_model();
  m.delta.tensors.push_back(m.delta.tensors[0]);  // covers W-07
  EXPECT_FALSE(write_delta(m.delta));
  m = small_model();
  tensor(m, "a.mxfp8").format = Format::kE4M3;  // not a delta format: refused by name
  auto r = write_delta(m.delta);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("format e4m3 cannot be carried"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace mxq::refit

namespace mxq::refit {
namespace {

// Large records, many tensors (validation spreads records over threads and scans entries in blocks): the
// first refused entry deep in a plane, in any of several records, is the one reported, as a serial scan
// would.
TEST(Validate, LargeDeltaReportsTheFirstRefusalInDeltaOrder) {
  std::mt19937 rng(7);
  Delta d{3, 4, {}};
  TensorTable table;
  for (int k = 0; k < 6; ++k) {
    TensorDelta t;
    t.name = "t" + std::to_string(k);
    t.format = Format::kMXFP8;
    t.shape = {64, 4096};
    t.anchor = k == 5;
    const int64_t entries = 64 * 4096;
    if (t.anchor) {
      t.values.bytes = random_bytes(static_cast<size_t>(entries), 100 + k);
      t.scales.bytes = std::vector<uint8_t>(static_cast<size_t>(entries / 32), 127);
    } else {
      for (int64_t i = k; i < entries; i += 7) t.values.indices.push_back(i);
      t.values.bytes = random_bytes(t.values.indices.size(), 200 + k);
      for (int64_t i = 0; i < entries / 32; i += 3) t.scales.indices.push_back(i);
      t.scales.bytes = std::vector<uint8_t>(t.scales.indices.size(), 120);
    }
    table[t.name] = {t.format, t.shape};
    d.tensors.push_back(std::move(t));
  }
  ASSERT_TRUE(validate_delta(d, table, 3)) << validate_delta(d, table, 3).error().message;
  {
    Delta bad = d;
    bad.tensors[4].values.bytes[30000] = 0x7F;  // E4M3 NaN deep in a later record
    bad.tensors[2].values.indices[20000] = bad.tensors[2].values.indices[19999];  // repeat (W-02), earlier
    Status s = validate_delta(bad, table, 3);
    ASSERT_FALSE(s);
    EXPECT_NE(s.error().message.find("t2"), std::string::npos) << s.error().message;
    EXPECT_NE(s.error().message.find("position 20000"), std::string::npos) << s.error().message;
  }
  {
    Delta bad = d;
    bad.tensors[1].values.bytes[9000] = 0xFF;  // E4M3 NaN (W-05)
    bad.tensors[1].values.bytes[9001] = 0x7F;
    Status s = validate_delta(bad, table, 3);
    ASSERT_FALSE(s);
    const std::string want = "value entry " + std::to_string(bad.tensors[1].values.indices[9000]);
    EXPECT_NE(s.error().message.find(want), std::string::npos) << s.error().message;
  }
  {
    Delta bad = d;
    bad.tensors[5].values.bytes[200000] = 0xFF;  // anchor plane
    bad.tensors[3].scales.bytes[2000] = 0xFF;    // E8M0 NaN scale, earlier record
    Status s = validate_delta(bad, table, 3);
    ASSERT_FALSE(s);
    EXPECT_NE(s.error().message.find("t3"), std::string::npos) << s.error().message;
    EXPECT_NE(s.error().message.find("scale entry " + std::to_string(bad.tensors[3].scales.indices[2000])),
              std::string::npos)
        << s.error().message;
  }
  {
    Delta bad = d;
    bad.tensors[5].values.bytes[200000] = 0xFF;
    Status s = validate_delta(bad, table, 3);
    ASSERT_FALSE(s);
    EXPECT_NE(s.error().message.find("value entry 200000"), std::string::npos) << s.error().message;
  }
  {
    Delta bad = d;
    bad.tensors[0].values.indices.back() = 64 * 4096;  // past the plane (W-01), last position
    Status s = validate_delta(bad, table, 3);
    ASSERT_FALSE(s);
    EXPECT_NE(s.error().message.find("W-01"), std::string::npos) << s.error().message;
  }
}

}  // namespace
}  // namespace mxq::refit
