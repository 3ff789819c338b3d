// The refit applier against synthetic stores: every record kind and format lands byte-exact (identity and a
// padded transposed layout), every refusal leaves the store untouched, and every failure after the first
// write (checksum, injected fault, a faulting undo) leaves exactly the old bytes, or marks the store
// unservable. The expected new planes are the ones the trainer side diffed, never bytes the applier produced.
#include "refit/applier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "applier_test_model.h"
#include "refit/delta_encoder.h"

namespace mxq::refit {
namespace {

using test_model::kSpecs;
using test_model::random_entry;
using test_model::Spec;

using test_model::ModelPlanes;
using test_model::native;
using test_model::Planes;

// Re-draws a fraction `p` of the entries of both planes (all of them for p = 1).
Planes mutate(const Spec& s, Planes planes, double p, std::mt19937& rng) {
  std::bernoulli_distribution pick(p);
  for (Plane plane : {Plane::kValues, Plane::kScales}) {
    auto& bytes = plane == Plane::kValues ? planes.values : planes.scales;
    if (bytes.empty()) continue;  // plain formats: no scales plane (and no scale entry width)
    const auto w = static_cast<size_t>(entry_bytes(s.format, plane));
    for (size_t i = 0; i + w <= bytes.size(); i += w)
      if (pick(rng)) random_entry(s.format, plane, rng, bytes.data() + i);
  }
  return planes;
}

ModelPlanes random_model(uint32_t seed) {
  std::mt19937 rng(seed);
  ModelPlanes m;
  for (const Spec& s : kSpecs) {
    auto pb = plane_bytes(s.format, s.shape, s.name);
    Planes zero{std::vector<uint8_t>(static_cast<size_t>(pb->values)),
                std::vector<uint8_t>(static_cast<size_t>(pb->scales))};
    m[s.name] = mutate(s, zero, 1.0, rng);
  }
  return m;
}

ModelPlanes step(const ModelPlanes& from, double p, uint32_t seed) {
  std::mt19937 rng(seed);
  ModelPlanes m;
  for (const Spec& s : kSpecs) m[s.name] = mutate(s, from.at(s.name), p, rng);
  return m;
}

// A layout that moves every byte: values transposed ([rows, row_bytes] -> [row_bytes, rows]), scale rows
// padded by 3 bytes. Stands in for a kernel's native layout.
Layout transposed_layout(const Spec& s) {
  auto pb = plane_bytes(s.format, s.shape, s.name);
  const int64_t rows = s.shape[s.shape.size() - 2], vrow = pb->values / rows, srows = pb->scales ? rows : 0;
  Layout l{"transposed",
           {PlaneKind::kSeparable, {rows, vrow}, pb->values, {}, {}},
           {PlaneKind::kSeparable, {srows, srows ? pb->scales / srows : 0}, 0, {}, {}}};
  for (int64_t r = 0; r < rows; ++r) l.values.row_off.push_back(r);
  for (int64_t c = 0; c < vrow; ++c) l.values.col_off.push_back(c * rows);
  const int64_t srow = l.scales.canonical.row_bytes, pitch = srow + 3;
  for (int64_t r = 0; r < srows; ++r) l.scales.row_off.push_back(r * pitch);
  for (int64_t c = 0; c < srow; ++c) l.scales.col_off.push_back(c);
  l.scales.native_bytes = srows * pitch;
  return l;
}

WeightStore make_store(const ModelPlanes& m, bool transposed_mxfp8) {
  WeightStore store;
  for (const Spec& s : kSpecs) {
    const bool native = transposed_mxfp8 && s.format == Format::kMXFP8;
    EXPECT_TRUE(native ? store.add(s.name, s.format, s.shape, transposed_layout(s))
                       : store.add(s.name, s.format, s.shape));
    EXPECT_TRUE(store.apply_tensor(s.name, m.at(s.name).values, m.at(s.name).scales));
  }
  return store;
}

ModelPlanes canonical(const WeightStore& store) {
  ModelPlanes m;
  for (const auto& [name, t] : store.tensors()) {
    Planes p{std::vector<uint8_t>(static_cast<size_t>(t.layout.values.canonical.bytes())),
             std::vector<uint8_t>(static_cast<size_t>(t.layout.scales.canonical.bytes()))};
    EXPECT_TRUE(store.read_canonical(name, mxq::Plane::kValues, p.values));
    EXPECT_TRUE(store.read_canonical(name, mxq::Plane::kScales, p.scales));
    m[name] = std::move(p);
  }
  return m;
}

Delta make_delta(const ModelPlanes& from, const ModelPlanes& to, uint64_t base, uint64_t next, bool anchors) {
  Delta d{base, next, {}};
  for (const Spec& s : kSpecs) {
    const CanonicalPlanes old_planes{from.at(s.name).values, from.at(s.name).scales};
    auto t = diff_tensor(s.name, s.format, s.shape, &old_planes, {to.at(s.name).values, to.at(s.name).scales},
                         anchors);
    EXPECT_TRUE(t) << t.error().message;
    d.tensors.push_back(std::move(*t));
  }
  return d;
}

// Every tensor's stored checksum equals the XXH3-64 of its canonical planes in `m`.
void expect_checksums(const WeightStore& store, const ModelPlanes& m) {
  for (const auto& [name, p] : m)
    EXPECT_EQ(store.at(name).checksum, canonical_checksum(p.values, p.scales)) << name;
}

// ---- applying
struct ApplyCase {
  std::string name;
  double p;      // changed fraction of entries
  bool anchors;  // every record an anchor
  bool layout;   // mxfp8 tensor lives in the transposed layout
};
void PrintTo(const ApplyCase& c, std::ostream* os) { *os << c.name; }

class ApplyDelta : public ::testing::TestWithParam<ApplyCase> {};

TEST_P(ApplyDelta, LandsTheTrainersPlanesAndAdvancesTheVersion) {
  const ApplyCase& c = GetParam();
  const ModelPlanes a = random_model(1), b = step(a, c.p, 2);
  WeightStore store = make_store(a, c.layout);
  uint64_t version = 7;
  const Delta d = make_delta(a, b, 7, 8, c.anchors);
  ASSERT_TRUE(apply_delta(store, version, d));
  EXPECT_EQ(version, 8u);
  EXPECT_TRUE(canonical(store) == b);
  expect_checksums(store, b);
  if (c.layout) {  // the native bytes are b's permuted by hand, pads zero
    const Spec& s = kSpecs[1];
    const QTensor& t = store.at(s.name);
    const auto& v = b.at(s.name).values;
    for (int64_t r = 0; r < 8; ++r)
      for (int64_t k = 0; k < 64; ++k)
        ASSERT_EQ(t.values[static_cast<size_t>(k * 8 + r)], v[static_cast<size_t>(r * 64 + k)]);
    for (int64_t r = 0; r < 8; ++r)
      for (int64_t k = 2; k < 5; ++k) ASSERT_EQ(t.scales[static_cast<size_t>(r * 5 + k)], 0) << "pad byte";
  }
}

// The same delta read as an undecoded view (apply_delta on a DeltaView: a host store decodes it first)
// lands the same bytes; a view of a spoiled index set is refused with nothing written.
TEST_P(ApplyDelta, TheWireViewLandsTheSameBytes) {
  const ApplyCase& c = GetParam();
  const ModelPlanes a = random_model(1), b = step(a, c.p, 2);
  WeightStore store = make_store(a, c.layout);
  uint64_t version = 7;
  auto body = encode_delta_body(make_delta(a, b, 7, 8, c.anchors));
  ASSERT_TRUE(body);
  auto view = parse_delta_view(*body);
  ASSERT_TRUE(view) << view.error().message;
  ASSERT_TRUE(apply_delta(store, version, *view));
  EXPECT_EQ(version, 8u);
  EXPECT_TRUE(canonical(store) == b);
  expect_checksums(store, b);
  // back to a through a view whose first gaps set ends inside a varint: refused, b stays
  auto back = encode_delta_body(make_delta(b, a, 8, 9, c.anchors));
  ASSERT_TRUE(back);
  auto back_view = parse_delta_view(*back);
  ASSERT_TRUE(back_view);
  for (const TensorView& t : back_view->tensors) {
    if (t.anchor || t.values.encoding != 0 || t.values.index.empty()) continue;
    std::vector<uint8_t> spoiled = *back;
    spoiled[static_cast<size_t>(t.values.index.data() - back->data()) + t.values.index.size() - 1] |= 0x80;
    auto bad = parse_delta_view(spoiled);
    ASSERT_TRUE(bad);
    const ModelPlanes before = native(store);
    auto s = apply_delta(store, version, *bad);
    ASSERT_FALSE(s);
    EXPECT_NE(s.error().message.find(t.name + " values: varint cut off"), std::string::npos)
        << s.error().message;
    EXPECT_EQ(version, 8u);
    EXPECT_TRUE(native(store) == before);
    break;
  }
}

INSTANTIATE_TEST_SUITE_P(Records, ApplyDelta,
                         ::testing::Values(ApplyCase{"sparse_1pct", 0.01, false, false},
                                           ApplyCase{"sparse_20pct", 0.2, false, false},
                                           ApplyCase{"identity_update", 0.0, false, false},  // covers W-22
                                           ApplyCase{"anchors", 0.3, true, false},
                                           ApplyCase{"sparse_transposed_layout", 0.05, false, true},
                                           ApplyCase{"anchors_transposed_layout", 0.3, true, true}),
                         [](const auto& i) { return i.param.name; });

// ---- refusals before the first write
struct RefuseCase {
  std::string name;
  std::string id;  // the bad_inputs.md ID the message must name
  std::function<void(Delta&)> spoil;
};
void PrintTo(const RefuseCase& c, std::ostream* os) { *os << c.name << " (" << c.id << ")"; }

class RefuseDelta : public ::testing::TestWithParam<RefuseCase> {};

TEST_P(RefuseDelta, BeforeAnyWriteAndWithoutTouchingTheStore) {
  const RefuseCase& c = GetParam();
  const ModelPlanes a = random_model(3), b = step(a, 0.1, 4);
  WeightStore store = make_store(a, true);
  const ModelPlanes before = native(store);
  Delta d = make_delta(a, b, 5, 6, false);
  c.spoil(d);
  uint64_t version = 5;
  int hooks = 0;
  ApplyOptions opt;
  opt.fault = [&](const StagePoint&) {
    ++hooks;
    return Status{};
  };
  const Status s = apply_delta(store, version, d, opt);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find(c.id), std::string::npos) << s.error().message;
  EXPECT_EQ(s.error().message.find('\n'), std::string::npos);
  EXPECT_EQ(hooks, 0) << "refused after the validation stage";
  EXPECT_EQ(version, 5u);
  EXPECT_TRUE(native(store) == before);
}

TensorDelta& mxfp8(Delta& d) { return d.tensors[1]; }

INSTANTIATE_TEST_SUITE_P(
    Rules, RefuseDelta,
    ::testing::Values(
        // covers W-01
        RefuseCase{"index_past_end", "W-01", [](Delta& d) { mxfp8(d).values.indices.back() = 8 * 64; }},
        RefuseCase{"negative_index", "W-01", [](Delta& d) { mxfp8(d).values.indices.front() = -1; }},
        // covers W-02
        RefuseCase{"duplicate_index", "W-02",
                   [](Delta& d) { mxfp8(d).values.indices[1] = mxfp8(d).values.indices[0]; }},
        // covers W-03
        RefuseCase{"short_bytes", "W-03", [](Delta& d) { mxfp8(d).values.bytes.pop_back(); }},
        RefuseCase{"three_byte_f32_scale", "W-03", [](Delta& d) { d.tensors[3].scales.bytes.resize(3); }},
        // covers W-04
        RefuseCase{"unsorted", "W-04",
                   [](Delta& d) { std::swap(mxfp8(d).values.indices[0], mxfp8(d).values.indices[1]); }},
        // covers W-05
        RefuseCase{"e4m3_nan", "W-05", [](Delta& d) { mxfp8(d).values.bytes[0] = 0x7F; }},
        RefuseCase{"e8m0_nan_in_anchor", "W-05",
                   [](Delta& d) {
                     const std::string name = d.tensors[2].name;  // mxfp4 [2, 4, 64]: 256 + 16 plane bytes
                     d.tensors[2] = {name,
                                     Format::kMXFP4,
                                     {2, 4, 64},
                                     true,
                                     0,
                                     {{}, std::vector<uint8_t>(256)},
                                     {{}, std::vector<uint8_t>(16, 0xFF)}};
                   }},
        // covers W-07
        RefuseCase{"unknown_name", "W-07", [](Delta& d) { d.tensors[0].name = "model.norm.bias"; }},
        RefuseCase{"missing_tensor", "W-07", [](Delta& d) { d.tensors.pop_back(); }},
        RefuseCase{"duplicated_tensor", "W-07", [](Delta& d) { d.tensors.push_back(d.tensors[0]); }},
        // covers W-08
        RefuseCase{"wrong_shape", "W-08",
                   [](Delta& d) {
                     mxfp8(d).shape = {64, 8};
                   }},
        RefuseCase{"wrong_format", "W-08", [](Delta& d) { d.tensors[0].format = Format::kF16; }},
        RefuseCase{
            "short_anchor", "W-08",
            [](Delta& d) {
              d.tensors[4] = {
                  d.tensors[4].name, Format::kF32, {4, 8}, true, 0, {{}, std::vector<uint8_t>(124)}, {}};
            }},
        // covers W-12
        RefuseCase{"wrong_base", "W-12", [](Delta& d) { d.base_version = 4, d.new_version = 5 + 2; }},
        RefuseCase{"already_applied", "W-12", [](Delta& d) { d.base_version = 4, d.new_version = 5; }},
        RefuseCase{"not_newer", "W-12", [](Delta& d) { d.new_version = 5; }}),
    [](const auto& i) { return i.param.name; });

// covers W-26
TEST(ApplyDeltaUndoLog, AllocationFailureFailsBeforeTheFirstWrite) {
  const ModelPlanes a = random_model(5), b = step(a, 0.1, 6);
  WeightStore store = make_store(a, false);
  const Delta d = make_delta(a, b, 0, 1, false);
  size_t asked = 0;
  ApplyOptions opt;
  opt.allocate_undo = [&](size_t bytes) {
    asked = bytes;
    return std::unique_ptr<uint8_t[]>();
  };
  opt.fault = [](const StagePoint& p) { return fail("hook reached at {}", stage_name(p.stage)); };
  uint64_t version = 0;
  const Status s = apply_delta(store, version, d, opt);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("W-26"), std::string::npos) << s.error().message;
  EXPECT_EQ(asked, undo_log_bytes(d));
  EXPECT_GT(asked, 0u);
  EXPECT_EQ(version, 0u);
  EXPECT_TRUE(canonical(store) == a);
}

// ---- failures after the first write restore the old bytes
struct ChecksumCase {
  std::string name;
  size_t record;       // record whose checksum is wrong
  bool corrupt_bytes;  // its first new byte corrupted (still a valid code) instead of its checksum
};
void PrintTo(const ChecksumCase& c, std::ostream* os) { *os << c.name; }

class ChecksumMismatch : public ::testing::TestWithParam<ChecksumCase> {};

// covers W-09, W-22 (a deliberately corrupted tensor fails the verifier)
TEST_P(ChecksumMismatch, OnTensorKOfNRestoresEveryByte) {
  const ChecksumCase& c = GetParam();
  const ModelPlanes a = random_model(7), b = step(a, 0.1, 8);
  WeightStore store = make_store(a, true);
  const ModelPlanes before = native(store);
  Delta d = make_delta(a, b, 1, 2, false);
  TensorDelta& bad = d.tensors[c.record];
  if (c.corrupt_bytes) {
    ASSERT_FALSE(bad.values.bytes.empty());
    bad.values.bytes[0] ^= 0x01;  // note: bf16 low mantissa bit / an E2M1 nibble: never a NaN code
  } else {
    bad.checksum ^= 1;
  }
  uint64_t version = 1;
  const Status s = apply_delta(store, version, d);
  ASSERT_FALSE(s);
  const std::string where =
      fmt::format("tensor {} of {} {}", c.record + 1, kSpecs.size(), kSpecs[c.record].name);
  EXPECT_NE(s.error().message.find(where), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("restored"), std::string::npos) << s.error().message;
  EXPECT_EQ(version, 1u);
  EXPECT_TRUE(native(store) == before);
  expect_checksums(store, a);
  EXPECT_TRUE(store.servable());
}

INSTANTIATE_TEST_SUITE_P(Records, ChecksumMismatch,
                         ::testing::Values(ChecksumCase{"first", 0, false},
                                           ChecksumCase{"transposed_mxfp8", 1, false},
                                           ChecksumCase{"stacked_mxfp4", 2, false},
                                           ChecksumCase{"last", 4, false},
                                           ChecksumCase{"corrupt_bf16_bytes", 0, true},
                                           ChecksumCase{"corrupt_mxfp4_bytes", 2, true}),
                         [](const auto& i) { return i.param.name; });

// covers W-06: the values of an MX block move but the delta drops its new scale; the trainer's checksum
// (of the planes it meant) catches it after the write.
TEST(ApplyDeltaChecksum, ValueChangeWithoutItsScaleIsRestored) {
  const ModelPlanes a = random_model(9);
  ModelPlanes b = a;
  b[kSpecs[1].name].values[0] = a.at(kSpecs[1].name).values[0] == 0x01 ? 0x02 : 0x01;
  b[kSpecs[1].name].scales[0] = static_cast<uint8_t>(a.at(kSpecs[1].name).scales[0] + 1);
  WeightStore store = make_store(a, false);
  Delta d = make_delta(a, b, 0, 1, false);
  ASSERT_EQ(mxfp8(d).scales.indices.size(), 1u);
  mxfp8(d).scales = {};
  uint64_t version = 0;
  const Status s = apply_delta(store, version, d);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find(kSpecs[1].name + ": canonical checksum"), std::string::npos)
      << s.error().message;
  EXPECT_TRUE(canonical(store) == a);
  EXPECT_EQ(version, 0u);
}

// A sparse record that changes nothing is verified against the checksum the store holds (its planes are not
// re-hashed: an untouched embedding would cost a full pass): it lands with the others, and a wrong checksum in
// it is still refused by name and every other record restored. Host store, and the wire view on it.
TEST(ApplyDeltaChecksum, AnUnchangedRecordKeepsItsChecksum) {
  const ModelPlanes a = random_model(12);
  ModelPlanes b = step(a, 0.1, 13);
  const std::string& same = kSpecs[3].name;
  b[same] = a.at(same);
  for (bool wire : {false, true}) {
    SCOPED_TRACE(wire ? "wire view" : "decoded delta");
    WeightStore store = make_store(a, false);
    Delta d = make_delta(a, b, 0, 1, false);
    const auto& rec = *std::find_if(d.tensors.begin(), d.tensors.end(), [&](auto& t) { return t.name == same; });
    ASSERT_FALSE(rec.anchor);
    ASSERT_TRUE(rec.values.indices.empty() && rec.scales.indices.empty());
    auto apply = [&](const Delta& delta, uint64_t& version) -> Status {
      if (!wire) return apply_delta(store, version, delta);
      auto body = encode_delta_body(delta);
      if (!body) return tl::unexpected(body.error());
      auto view = parse_delta_view(*body);
      if (!view) return tl::unexpected(view.error());
      return apply_delta(store, version, *view);
    };
    Delta wrong = d;
    std::find_if(wrong.tensors.begin(), wrong.tensors.end(), [&](auto& t) { return t.name == same; })->checksum ^= 1;
    uint64_t version = 0;
    const Status refused = apply(wrong, version);
    ASSERT_FALSE(refused);
    EXPECT_NE(refused.error().message.find(same + ": canonical checksum"), std::string::npos)
        << refused.error().message;
    EXPECT_TRUE(canonical(store) == a);
    EXPECT_EQ(version, 0u);
    ASSERT_TRUE(apply(d, version));
    EXPECT_EQ(version, 1u);
    EXPECT_TRUE(canonical(store) == b);
    expect_checksums(store, b);
  }
}

// before_write runs once, after every check and before the first write: its refusal leaves every byte and the
// version (the server's body hash, computed beside the checks); a delta the checks refuse never reaches it.
TEST(ApplyDeltaBeforeWrite, RunsOnceBeforeTheFirstWriteAndItsRefusalWritesNothing) {
  const ModelPlanes a = random_model(14), b = step(a, 0.1, 15);
  for (bool wire : {false, true}) {
    SCOPED_TRACE(wire ? "wire view" : "decoded delta");
    WeightStore store = make_store(a, true);
    const ModelPlanes before = native(store);
    const Delta d = make_delta(a, b, 0, 1, false);
    auto body = encode_delta_body(d);
    ASSERT_TRUE(body);
    auto view = parse_delta_view(*body);
    ASSERT_TRUE(view);
    int calls = 0;
    bool ok = false;
    ApplyOptions o;
    o.before_write = [&]() -> Status {
      ++calls;
      EXPECT_TRUE(native(store) == before) << "written before before_write";
      return ok ? Status{} : fail("body XXH3-64 differs from the header");
    };
    auto apply = [&](uint64_t& v) { return wire ? apply_delta(store, v, *view, o) : apply_delta(store, v, d, o); };
    uint64_t version = 0;
    const Status refused = apply(version);
    ASSERT_FALSE(refused);
    EXPECT_NE(refused.error().message.find("XXH3-64"), std::string::npos) << refused.error().message;
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(version, 0u);
    EXPECT_TRUE(native(store) == before);
    uint64_t wrong_base = 5;
    EXPECT_FALSE(apply(wrong_base));  // W-12: refused by the checks, before_write never asked
    EXPECT_EQ(calls, 1);
    ok = true;
    ASSERT_TRUE(apply(version));
    EXPECT_EQ(calls, 2);
    EXPECT_EQ(version, 1u);
    EXPECT_TRUE(canonical(store) == b);
  }
}

// A progress callback sees every tensor once, in record order; cancelling at tensor k restores the old bytes.
TEST(ApplyDeltaProgress, ReportsEachTensorAndCancelsByRollingBack) {
  const ModelPlanes a = random_model(10), b = step(a, 0.1, 11);
  const Delta d = make_delta(a, b, 0, 1, false);
  for (int64_t cancel_at = 1; cancel_at <= static_cast<int64_t>(kSpecs.size()) + 1; ++cancel_at) {
    WeightStore store = make_store(a, true);
    std::vector<std::string> seen;
    ApplyOptions opt;
    opt.progress = [&](const Progress& p) {
      EXPECT_EQ(p.done, static_cast<int64_t>(seen.size()) + 1);
      EXPECT_EQ(p.total, static_cast<int64_t>(kSpecs.size()));
      seen.emplace_back(p.item);
      return p.done != cancel_at;
    };
    uint64_t version = 0;
    const Status s = apply_delta(store, version, d, opt);
    if (cancel_at > static_cast<int64_t>(kSpecs.size())) {  // never cancelled
      ASSERT_TRUE(s) << s.error().message;
      EXPECT_TRUE(canonical(store) == b);
      EXPECT_EQ(seen.size(), kSpecs.size());
      for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], kSpecs[i].name);
      continue;
    }
    ASSERT_FALSE(s);
    EXPECT_NE(s.error().message.find("cancelled"), std::string::npos) << s.error().message;
    EXPECT_EQ(version, 0u);
    EXPECT_TRUE(canonical(store) == a) << "cancelled at tensor " << cancel_at;
  }
}

// ---- fault injection at every stage (W-10)
std::vector<StagePoint> stages_of(const Delta& d, const ModelPlanes& a, bool layout) {
  WeightStore store = make_store(a, layout);
  std::vector<StagePoint> seen;  // names point into `d`, which outlives the result
  ApplyOptions opt;
  opt.fault = [&](const StagePoint& p) {
    seen.push_back(p);
    return Status{};
  };
  uint64_t version = d.base_version;
  EXPECT_TRUE(apply_delta(store, version, d, opt));
  return seen;
}

struct FaultCase {
  std::string name;
  bool anchors, layout;
  int undo_faults;  // consecutive faults injected at the first undo step
};
void PrintTo(const FaultCase& c, std::ostream* os) { *os << c.name; }

class FaultAtEveryStage : public ::testing::TestWithParam<FaultCase> {};

// covers W-10
TEST_P(FaultAtEveryStage, LeavesExactlyTheOldBytesOrRefusesToServe) {
  const FaultCase& c = GetParam();
  const ModelPlanes a = random_model(11), b = step(a, 0.05, 12);
  const Delta d = make_delta(a, b, 3, 4, c.anchors);
  const std::vector<StagePoint> stages = stages_of(d, a, c.layout);
  ASSERT_EQ(stages.size(), 1 + 2 * kSpecs.size()) << "validated + written/verified per record";
  for (size_t k = 0; k < stages.size(); ++k) {
    SCOPED_TRACE(fmt::format("fault at stage {} ({} {})", k, stage_name(stages[k].stage), stages[k].name));
    WeightStore store = make_store(a, c.layout);
    const ModelPlanes before = native(store);
    size_t calls = 0;
    int undo_faults = 0;
    ApplyOptions opt;
    opt.fault = [&](const StagePoint& p) -> Status {
      if (p.stage == ApplyStage::kUndoStep) {
        if (undo_faults++ < c.undo_faults) return fail("injected undo fault");
        return {};
      }
      if (calls++ == k) return fail("injected fault");
      return {};
    };
    uint64_t version = 3;
    const Status s = apply_delta(store, version, d, opt);
    ASSERT_FALSE(s);
    EXPECT_EQ(version, 3u);
    const bool wrote = k > 0;
    if (wrote && c.undo_faults >= kUndoAttempts) {  // a persistent undo fault: never serve
      EXPECT_NE(s.error().message.find("refuses to serve"), std::string::npos) << s.error().message;
      EXPECT_FALSE(store.servable());
      uint64_t again = 3;
      EXPECT_FALSE(apply_delta(store, again, d)) << "an inconsistent store took another delta";
      continue;
    }
    EXPECT_NE(s.error().message.find("injected fault"), std::string::npos) << s.error().message;
    EXPECT_TRUE(store.servable());
    EXPECT_TRUE(native(store) == before);
    expect_checksums(store, a);
    // the same store then takes the delta cleanly: the old state is a real version-3 state
    ASSERT_TRUE(apply_delta(store, version, d));
    EXPECT_TRUE(canonical(store) == b);
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, FaultAtEveryStage,
                         ::testing::Values(FaultCase{"sparse", false, false, 0},
                                           FaultCase{"anchors", true, false, 0},
                                           FaultCase{"sparse_transposed_layout", false, true, 0},
                                           FaultCase{"transient_undo_fault", false, true, kUndoAttempts - 1},
                                           FaultCase{"anchors_transient_undo_fault", true, false, 1},
                                           FaultCase{"persistent_undo_fault", false, false, kUndoAttempts}),
                         [](const auto& i) { return i.param.name; });

// ---- chains (W-16, W-17)
struct ChainCase {
  std::string name;
  std::vector<double> steps;  // changed fraction of each step; a negative entry returns to the first model
  bool layout;
};
void PrintTo(const ChainCase& c, std::ostream* os) { *os << c.name; }

class DeltaChain : public ::testing::TestWithParam<ChainCase> {};

// covers W-16 (no buffer moves) and W-17 (3+ updates and A -> B -> A stay bit-exact)
TEST_P(DeltaChain, EachVersionEqualsLoadingItDirectly) {
  const ChainCase& c = GetParam();
  std::vector<ModelPlanes> models = {random_model(13)};
  WeightStore store = make_store(models[0], c.layout);
  std::map<std::string, std::pair<const uint8_t*, const uint8_t*>> where;
  for (const auto& [name, t] : store.tensors()) where[name] = {t.values.data(), t.scales.data()};
  uint64_t version = 0;
  for (size_t i = 0; i < c.steps.size(); ++i) {
    const ModelPlanes next =
        c.steps[i] < 0 ? models[0] : step(models.back(), c.steps[i], 20 + static_cast<uint32_t>(i));
    ASSERT_TRUE(apply_delta(store, version, make_delta(models.back(), next, i, i + 1, false)));
    models.push_back(next);
    const WeightStore fresh = make_store(next, c.layout);  // "loading the target directly"
    EXPECT_TRUE(native(store) == native(fresh)) << "after step " << i + 1;
    for (const auto& [name, t] : store.tensors()) {
      EXPECT_EQ(t.checksum, fresh.at(name).checksum) << name;
      EXPECT_EQ(where[name], std::make_pair(static_cast<const uint8_t*>(t.values.data()),
                                            static_cast<const uint8_t*>(t.scales.data())))
          << name << " moved";
    }
  }
  EXPECT_EQ(version, c.steps.size());
}

INSTANTIATE_TEST_SUITE_P(Chains, DeltaChain,
                         ::testing::Values(ChainCase{"a_b_a", {0.1, -1}, false},
                                           ChainCase{"a_b_a_transposed_layout", {0.1, -1}, true},
                                           ChainCase{"four_steps", {0.01, 0.05, 0.3, 0.001}, false},
                                           ChainCase{"three_steps_then_back", {0.02, 0.02, 0.02, -1}, true}),
                         [](const auto& i) { return i.param.name; });

// W-11 (one TP/EP rank fails while the others succeed): not applicable. mxq runs one engine on one device,
// with no tensor- or expert-parallel ranks to disagree; one store takes an update all or nothing (above).

// ---- buckets (W-21)
// One update A -> B sent as one delta, or cut at other boundaries. A delta names every tensor (W-07: a
// partial one is refused), so a bucket is a delta whose records for the other tensors carry no change:
// one tensor's change per delta, an empty delta between them, and one tensor's change split over two deltas
// (an intermediate with half its entries moved).
// covers W-21: every bucketing lands the same native bytes and checksums as the single delta.
TEST(DeltaBuckets, EveryBucketingLandsTheSameBytes) {
  const ModelPlanes a = random_model(41), b = step(a, 0.2, 42);
  WeightStore whole = make_store(a, true);
  uint64_t whole_version = 0;
  ASSERT_TRUE(apply_delta(whole, whole_version, make_delta(a, b, 0, 1, false)));
  ASSERT_TRUE(canonical(whole) == b);

  // one tensor per delta (the others unchanged), an empty delta after the first
  WeightStore per_tensor = make_store(a, true);
  uint64_t v = 0;
  const Delta all = make_delta(a, b, 0, 1, false);
  auto partial = apply_delta(per_tensor, v, Delta{0, 1, {all.tensors[0]}});
  ASSERT_FALSE(partial);
  EXPECT_NE(partial.error().message.find("W-07"), std::string::npos) << partial.error().message;
  ModelPlanes at = a;
  for (size_t k = 0; k < kSpecs.size(); ++k) {
    ModelPlanes next = at;
    next[kSpecs[k].name] = b.at(kSpecs[k].name);
    auto one = apply_delta(per_tensor, v, make_delta(at, next, v, v + 1, false));
    ASSERT_TRUE(one) << kSpecs[k].name << ": " << one.error().message;
    at = std::move(next);
    if (k == 0) {
      auto empty = apply_delta(per_tensor, v, make_delta(at, at, v, v + 1, false));
      ASSERT_TRUE(empty) << empty.error().message;
    }
  }
  EXPECT_EQ(v, kSpecs.size() + 1);
  EXPECT_TRUE(native(per_tensor) == native(whole));

  // the MXFP8 tensor (in the transposed layout) split in two: the first half of its entries, then the rest
  const Spec& s = kSpecs[1];
  ModelPlanes half = a;
  for (Plane plane : {Plane::kValues, Plane::kScales}) {
    auto& mid = plane == Plane::kValues ? half[s.name].values : half[s.name].scales;
    const auto& to = plane == Plane::kValues ? b.at(s.name).values : b.at(s.name).scales;
    const size_t w = static_cast<size_t>(entry_bytes(s.format, plane)), cut = mid.size() / w / 2 * w;
    std::copy(to.begin(), to.begin() + static_cast<std::ptrdiff_t>(cut), mid.begin());
  }
  ASSERT_FALSE(half == a);
  ASSERT_FALSE(half == b);
  WeightStore split = make_store(a, true);
  uint64_t sv = 0;
  ASSERT_TRUE(apply_delta(split, sv, make_delta(a, half, 0, 1, false)));
  ASSERT_TRUE(apply_delta(split, sv, make_delta(half, b, 1, 2, false)));
  EXPECT_TRUE(native(split) == native(whole));
  for (const auto& [name, t] : whole.tensors()) {
    EXPECT_EQ(per_tensor.at(name).checksum, t.checksum) << name;
    EXPECT_EQ(split.at(name).checksum, t.checksum) << name;
  }
}

// ---- resident anchors (a full update from a buffer already in the store's memory: DeltaView::resident)
// A view of `d`'s anchors whose planes point at `d`'s bytes (host memory for a host store).
DeltaView resident_view(const Delta& d) {
  DeltaView v{d.base_version, d.new_version, {}, {}, true};
  for (const TensorDelta& t : d.tensors)
    v.tensors.push_back({t.name, t.format, t.shape, true, t.checksum, {0, 0, {}, t.values.bytes},
                         {0, 0, {}, t.scales.bytes}});
  return v;
}

TEST(ApplyResident, LandsThePlanesOrRestoresEveryByte) {
  for (bool layout : {false, true}) {
    SCOPED_TRACE(layout ? "transposed layout" : "identity");
    const ModelPlanes a = random_model(21), b = step(a, 0.3, 22);
    const Delta d = make_delta(a, b, 2, 3, /*anchors=*/true);
    WeightStore store = make_store(a, layout);
    uint64_t version = 2;
    ASSERT_TRUE(apply_delta(store, version, resident_view(d)));
    EXPECT_EQ(version, 3u);
    EXPECT_TRUE(canonical(store) == b);
    expect_checksums(store, b);
    // a wrong expected checksum on the last record: found after the write, every byte restored (W-06)
    WeightStore again = make_store(a, layout);
    const ModelPlanes before = native(again);
    DeltaView wrong = resident_view(d);
    wrong.tensors.back().checksum ^= 1;
    version = 2;
    const Status s = apply_delta(again, version, wrong);
    ASSERT_FALSE(s);
    EXPECT_NE(s.error().message.find("W-06"), std::string::npos) << s.error().message;
    EXPECT_NE(s.error().message.find("every written byte restored"), std::string::npos) << s.error().message;
    EXPECT_EQ(version, 2u);
    EXPECT_TRUE(native(again) == before);
  }
}

// covers W-05, W-07, W-10
TEST(ApplyResident, RefusesBadBytesAndCoverageAndSurvivesAFaultAtEveryStage) {
  const ModelPlanes a = random_model(23), b = step(a, 0.2, 24);
  Delta d = make_delta(a, b, 0, 1, true);
  d.tensors[1].values.bytes[5] = 0xFF;  // an E4M3 NaN in the mxfp8 anchor
  WeightStore store = make_store(a, true);
  const ModelPlanes before = native(store);
  uint64_t version = 0;
  int hooks = 0;
  ApplyOptions count;
  count.fault = [&](const StagePoint&) { return ++hooks, Status{}; };
  Status s = apply_delta(store, version, resident_view(d), count);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find(d.tensors[1].name + " values: entry 5"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("W-05"), std::string::npos) << s.error().message;
  EXPECT_EQ(hooks, 0);
  EXPECT_TRUE(native(store) == before);
  d = make_delta(a, b, 0, 1, true);
  Delta short_d = d;
  short_d.tensors.pop_back();
  s = apply_delta(store, version, resident_view(short_d));
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("W-07"), std::string::npos) << s.error().message;
  EXPECT_TRUE(native(store) == before);
  // a fault at each stage after validation (validated, then written / verified per record)
  for (size_t k = 0; k < 1 + 2 * kSpecs.size(); ++k) {
    SCOPED_TRACE(fmt::format("fault at stage {}", k));
    WeightStore live = make_store(a, true);
    size_t calls = 0;
    ApplyOptions opt;
    opt.fault = [&](const StagePoint& p) -> Status {
      if (p.stage != ApplyStage::kUndoStep && calls++ == k) return fail("injected fault");
      return {};
    };
    uint64_t v = 0;
    const Status f = apply_delta(live, v, resident_view(d), opt);
    ASSERT_FALSE(f);
    EXPECT_NE(f.error().message.find("injected fault"), std::string::npos) << f.error().message;
    EXPECT_EQ(v, 0u);
    EXPECT_TRUE(native(live) == before);
    expect_checksums(live, a);
  }
}


}  // namespace
}  // namespace mxq::refit
