// refit::apply_delta on a WeightStore in CUDA device memory: deltas land bit-exact (A -> B -> A and a
// 4-step chain with an anchor step) with unchanged device addresses; every injected fault and a checksum
// mismatch leave exactly the old bytes (both with full checksums and with incremental ones); W-26 (no room
// for the undo log) is refused before any write; and W-16: a CUDA graph of GEMV launches reading the store,
// replayed after a sparse and an anchor delta, equals the same graph on a fresh store loaded with the target
// weights.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include "../gpu_test_util.h"
#include "cuda/linear/gemv_layout.h"
#include "cuda/linear/gemv_mx.h"
#include "layout/probe.h"
#include "model/weight_memory_cuda.h"
#include "refit/applier.h"
#include "refit/delta_encoder.h"
#include "refit/delta_format.h"

namespace mxq::cuda {
namespace {

using refit::ApplyStage;
using refit::Delta;

// Values layouts: the store's default (identity), the GEMV native layout (probed), and two separable ones
// the batched sparse write takes by other routes (refit_scatter.cu word_pieces): column-major (runs of 1
// byte: byte by byte) and rows reversed with 8-byte runs reversed in each row (one 8-byte piece per word).
enum class Lay { kDefault, kGemv, kColumnMajor, kRuns8 };
struct Spec {
  std::string name;
  Format format;
  std::vector<int64_t> shape;
  Lay lay = Lay::kDefault;
  bool gemv() const { return lay == Lay::kGemv; }
};
// note: GEMV MXFP8 [64, 256] is the 4x4-word transpose (two 4-byte pieces per word), [96, 160] runs of 4
// without it; the last bf16 plane (406 bytes) ends inside an 8-byte word.
const std::vector<Spec> kSpecs = {
    {"model.layers.0.self_attn.q_proj.weight", Format::kMXFP8, {64, 256}, Lay::kGemv},
    {"model.layers.0.mlp.down_proj.weight", Format::kMXFP8, {96, 160}, Lay::kGemv},
    {"model.layers.0.mlp.up_proj.weight", Format::kMXFP4, {32, 384}, Lay::kGemv},
    {"model.layers.0.self_attn.o_proj.weight", Format::kFP8_B128, {130, 160}},
    {"model.norm.weight", Format::kBF16, {200}},
    {"model.embed_tokens.weight", Format::kF32, {4, 8}},
    {"model.layers.0.self_attn.k_proj.weight", Format::kBF16, {9, 16}, Lay::kColumnMajor},
    {"model.layers.0.self_attn.v_proj.weight", Format::kBF16, {5, 32}, Lay::kRuns8},
    {"model.layers.1.input_layernorm.weight", Format::kBF16, {203}},
};

// The column-major and reversed-runs layouts of a 2-D bf16 tensor (scales: none).
Layout custom_layout(const Spec& s) {
  const int64_t rows = s.shape[0], w = 2 * s.shape[1];
  Layout l{s.lay == Lay::kColumnMajor ? "column_major" : "reversed_runs8",
           {PlaneKind::kSeparable, {rows, w}, rows * w, {}, {}},
           {PlaneKind::kIdentity, {0, 0}, 0, {}, {}}};
  for (int64_t r = 0; r < rows; ++r)
    l.values.row_off.push_back(s.lay == Lay::kColumnMajor ? r : (rows - 1 - r) * w);
  for (int64_t c = 0; c < w; ++c)
    l.values.col_off.push_back(s.lay == Lay::kColumnMajor ? c * rows : w - 8 - c / 8 * 8 + c % 8);
  return l;
}

struct Planes {
  std::vector<uint8_t> values, scales;
  bool operator==(const Planes&) const = default;
};
using Model = std::map<std::string, Planes>;

Result<Layout> gemv_layout(const Spec& s) {
  return probe_layout(
      s.name, "cuda_gemv", s.format, s.shape, [&](const HostPlanes& in) -> Result<HostPlanes> {
        HostPlanes out{std::vector<uint8_t>(in.values.size()), in.scales};
        if (auto st =
                prepare_gemv_values(s.format, in.values.data(), out.values.data(), s.shape[0], s.shape[1]);
            !st)
          return tl::unexpected(st.error());
        return out;
      });
}

void random_entry(Format f, refit::Plane p, std::mt19937& rng, uint8_t* e) {
  if (p == refit::Plane::kScales && f == Format::kFP8_B128) {
    const float s = std::uniform_real_distribution<float>(1e-4f, 1.0f)(rng);
    std::memcpy(e, &s, 4);
  } else if (p == refit::Plane::kScales) {
    e[0] = static_cast<uint8_t>(110 + rng() % 20);
  } else if (f == Format::kBF16 || f == Format::kF32) {
    const float x = std::uniform_real_distribution<float>(0.25f, 2.0f)(rng) * (rng() & 1 ? 1.f : -1.f);
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    if (f == Format::kF32)
      std::memcpy(e, &bits, 4);
    else
      e[0] = static_cast<uint8_t>(bits >> 16), e[1] = static_cast<uint8_t>(bits >> 24);
  } else {
    e[0] = static_cast<uint8_t>(rng());
    if (f != Format::kMXFP4 && (e[0] & 0x7F) == 0x7F) e[0] ^= 1;
  }
}

Model mutate(const Model& from, double p, uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution pick(p);
  Model m;
  for (const Spec& s : kSpecs) {
    Planes planes;
    if (from.count(s.name)) {
      planes = from.at(s.name);
    } else {
      auto pb = plane_bytes(s.format, s.shape, s.name);
      planes = {std::vector<uint8_t>(static_cast<size_t>(pb->values)),
                std::vector<uint8_t>(static_cast<size_t>(pb->scales))};
    }
    for (refit::Plane pl : {refit::Plane::kValues, refit::Plane::kScales}) {
      auto& bytes = pl == refit::Plane::kValues ? planes.values : planes.scales;
      if (bytes.empty()) continue;
      const auto w = static_cast<size_t>(refit::entry_bytes(s.format, pl));
      for (size_t i = 0; i + w <= bytes.size(); i += w)
        if (p >= 1.0 || pick(rng)) random_entry(s.format, pl, rng, bytes.data() + i);
    }
    m[s.name] = std::move(planes);
  }
  return m;
}

WeightStore make_store(const Model& m, size_t scratch_limit = SIZE_MAX, bool incremental = false) {
  CudaMemoryOptions o;
  o.scratch_limit = scratch_limit;
  o.incremental_checksums = incremental;
  auto mem = cuda_weight_memory(o);
  EXPECT_TRUE(mem);
  WeightStore store(std::move(*mem));
  for (const Spec& s : kSpecs) {
    if (s.gemv()) {
      auto l = gemv_layout(s);
      EXPECT_TRUE(l) << l.error().message;
      EXPECT_TRUE(store.add(s.name, s.format, s.shape, *l));
    } else if (s.lay != Lay::kDefault) {
      EXPECT_TRUE(store.add(s.name, s.format, s.shape, custom_layout(s)));
    } else {
      EXPECT_TRUE(store.add(s.name, s.format, s.shape));
    }
    EXPECT_TRUE(store.apply_tensor(s.name, m.at(s.name).values, m.at(s.name).scales));
  }
  return store;
}

Model canonical(const WeightStore& store) {
  Model m;
  for (const auto& [name, t] : store.tensors()) {
    Planes p{std::vector<uint8_t>(static_cast<size_t>(t.layout.values.canonical.bytes())),
             std::vector<uint8_t>(static_cast<size_t>(t.layout.scales.canonical.bytes()))};
    EXPECT_TRUE(store.read_canonical(name, mxq::Plane::kValues, p.values));
    EXPECT_TRUE(store.read_canonical(name, mxq::Plane::kScales, p.scales));
    m[name] = std::move(p);
  }
  return m;
}

// Live native bytes (padding included) and the addresses they sit at.
struct Native {
  Model bytes;
  std::map<std::string, std::pair<const void*, const void*>> at;
};
Native native(const WeightStore& store) {
  Native n;
  for (const auto& [name, t] : store.tensors()) {
    Planes p{std::vector<uint8_t>(t.values.size()), std::vector<uint8_t>(t.scales.size())};
    if (!p.values.empty()) {
      EXPECT_EQ(cudaMemcpy(p.values.data(), t.values.data(), p.values.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    if (!p.scales.empty()) {
      EXPECT_EQ(cudaMemcpy(p.scales.data(), t.scales.data(), p.scales.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    n.bytes[name] = std::move(p);
    n.at[name] = {t.values.data(), t.scales.data()};
  }
  return n;
}

Delta make_delta(const Model& from, const Model& to, uint64_t base, uint64_t next, bool anchors) {
  Delta d{base, next, {}};
  for (const Spec& s : kSpecs) {
    const refit::CanonicalPlanes old_planes{from.at(s.name).values, from.at(s.name).scales};
    auto t = refit::diff_tensor(s.name, s.format, s.shape, &old_planes,
                                {to.at(s.name).values, to.at(s.name).scales}, anchors);
    EXPECT_TRUE(t) << t.error().message;
    d.tensors.push_back(std::move(*t));
  }
  return d;
}

void expect_checksums(const WeightStore& store, const Model& m) {
  for (const auto& [name, p] : m)
    EXPECT_EQ(store.at(name).checksum, canonical_checksum(p.values, p.scales)) << name;
}

// The wire path: the delta's body (encode_delta_body), read up to its encoded index sets
// (parse_delta_view), the index sets decoded and checked on the device. The body lives in `keep`.
Status apply_wire(WeightStore& store, uint64_t& version, const Delta& d, const refit::ApplyOptions& o,
                  std::vector<uint8_t>& keep) {
  auto body = refit::encode_delta_body(d);
  if (!body) return tl::unexpected(body.error());
  keep = std::move(*body);
  auto view = refit::parse_delta_view(keep);
  if (!view) return tl::unexpected(view.error());
  return refit::apply_delta(store, version, *view, o);
}

// note: both tests run with and without incremental checksums (kept block sums updated by the scatters),
// each through the decoded delta (int32 indices uploaded) and through the wire path (device decode).
class CudaRefitModes : public ::testing::TestWithParam<std::tuple<bool, bool>> {
 protected:
  bool incremental() const { return std::get<0>(GetParam()); }
  Status apply(WeightStore& store, uint64_t& version, const Delta& d, const refit::ApplyOptions& o = {}) {
    if (!std::get<1>(GetParam())) return refit::apply_delta(store, version, d, o);
    return apply_wire(store, version, d, o, body_);
  }
  std::vector<uint8_t> body_;
};

TEST_P(CudaRefitModes, ABAAndChainBitExactAtFixedAddresses) {
  const uint32_t seed = static_cast<uint32_t>(test::fresh_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Model a = mutate({}, 1.0, seed), b = mutate(a, 0.05, seed + 1);
  WeightStore store = make_store(a, SIZE_MAX, incremental());
  const Native start = native(store);
  EXPECT_EQ(canonical(store), a);
  expect_checksums(store, a);
  uint64_t version = 1;
  ASSERT_TRUE(apply(store, version, make_delta(a, b, 1, 2, false)));
  EXPECT_EQ(version, 2u);
  EXPECT_EQ(canonical(store), b);
  expect_checksums(store, b);
  ASSERT_TRUE(apply(store, version, make_delta(b, a, 2, 3, false)));
  const Native back = native(store);
  EXPECT_EQ(back.bytes, start.bytes) << "A -> B -> A restores every live byte";
  EXPECT_EQ(back.at, start.at);
  // 4 steps: sparse, anchors, sparse of 40%, sparse of 0.5%
  Model cur = a;
  const double fractions[] = {0.02, 1.0, 0.4, 0.005};
  for (int k = 0; k < 4; ++k) {
    const Model next = mutate(cur, fractions[k] >= 1.0 ? 0.3 : fractions[k], seed + 10 + k);
    ASSERT_TRUE(apply(store, version, make_delta(cur, next, version, version + 1, fractions[k] >= 1.0)));
    cur = next;
    EXPECT_EQ(canonical(store), cur) << "step " << k;
    expect_checksums(store, cur);
  }
  // the chain's end equals a fresh load of its target, byte for byte (layout, padding and all)
  WeightStore fresh = make_store(cur);
  EXPECT_EQ(native(store).bytes, native(fresh).bytes);
  EXPECT_EQ(native(store).at, start.at) << "device addresses never change";
}

TEST_P(CudaRefitModes, EveryFaultLeavesTheOldBytes) {
  const uint32_t seed = static_cast<uint32_t>(test::fresh_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Model a = mutate({}, 1.0, seed), b = mutate(a, 0.1, seed + 1);
  // a delta mixing anchors and sparse records
  Delta d = make_delta(a, b, 5, 6, false);
  const Delta anchors = make_delta(a, b, 5, 6, true);
  d.tensors[1] = anchors.tensors[1];
  d.tensors[4] = anchors.tensors[4];
  WeightStore store = make_store(a, SIZE_MAX, incremental());
  const Native before = native(store);
  const size_t n = d.tensors.size();
  int faults = 0;
  for (ApplyStage stage :
       {ApplyStage::kValidated, ApplyStage::kTensorWritten, ApplyStage::kChecksumVerified}) {
    for (size_t k = 0; k < (stage == ApplyStage::kValidated ? 1 : n); ++k) {
      refit::ApplyOptions o;
      o.fault = [&](const refit::StagePoint& p) -> Status {
        if (p.stage == stage && p.tensor == k) return fail("injected");
        return {};
      };
      uint64_t version = 5;
      auto s = apply(store, version, d, o);
      ASSERT_FALSE(s) << refit::stage_name(stage) << " " << k;
      EXPECT_EQ(version, 5u);
      EXPECT_TRUE(store.servable());
      const Native after = native(store);
      EXPECT_EQ(after.bytes, before.bytes)
          << refit::stage_name(stage) << " at " << k << ": " << s.error().message;
      EXPECT_EQ(after.at, before.at);
      ++faults;
    }
  }
  // transient undo faults: two failures of each undo step, then success
  {
    refit::ApplyOptions o;
    std::map<size_t, int> tries;
    o.fault = [&](const refit::StagePoint& p) -> Status {
      if (p.stage == ApplyStage::kChecksumVerified && p.tensor == n - 1) return fail("late fault");
      if (p.stage == ApplyStage::kUndoStep && ++tries[p.tensor] <= 2) return fail("transient");
      return {};
    };
    uint64_t version = 5;
    ASSERT_FALSE(apply(store, version, d, o));
    EXPECT_EQ(native(store).bytes, before.bytes) << "transient undo faults";
    EXPECT_TRUE(store.servable());
  }
  // a checksum the weights do not reach (W-06): restored
  {
    Delta bad = d;
    bad.tensors[2].checksum ^= 1;
    uint64_t version = 5;
    auto s = apply(store, version, bad);
    ASSERT_FALSE(s);
    EXPECT_NE(s.error().message.find("W-06"), std::string::npos) << s.error().message;
    EXPECT_EQ(native(store).bytes, before.bytes);
  }
  // the same delta applies cleanly afterwards
  uint64_t version = 5;
  ASSERT_TRUE(apply(store, version, d)) << faults;
  EXPECT_EQ(canonical(store), b);
  // a persistent undo fault: the store refuses to serve
  {
    const Delta back = make_delta(b, a, 6, 7, false);
    refit::ApplyOptions o;
    o.fault = [&](const refit::StagePoint& p) -> Status {
      if (p.stage == ApplyStage::kTensorWritten && p.tensor == 0) return fail("fault");
      if (p.stage == ApplyStage::kUndoStep) return fail("persistent");
      return {};
    };
    auto s = apply(store, version, back, o);
    ASSERT_FALSE(s);
    EXPECT_FALSE(store.servable());
  }
}

INSTANTIATE_TEST_SUITE_P(Checksums, CudaRefitModes, ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "incremental" : "full") +
                                  (std::get<1>(info.param) ? "_wire" : "_decoded");
                         });

// The wire path against the host path, bitwise: every encoding (gaps at low fractions, bitmaps above 1/8,
// runs for clustered changes), from a pinned and from a pageable body, on a CUDA store and on a host store
// that decodes on the host.
TEST(CudaRefitWire, EveryEncodingLandsAsOnTheHost) {
  const uint32_t seed = static_cast<uint32_t>(test::fresh_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Model a = mutate({}, 1.0, seed);
  // b: scales 30% changed (bitmaps), values rewritten in their first half (one run)
  Model b = mutate(a, 0.3, seed + 1);
  for (auto& [name, p] : b) {
    p.values = a.at(name).values;
    // note: 0x10 / 0x11 are valid in every format here (E4M3, E2M1 pairs, low bytes of bf16 / f32 entries)
    for (size_t i = 0; i < p.values.size() / 2; ++i) p.values[i] = p.values[i] == 0x10 ? 0x11 : 0x10;
  }
  const Model c = mutate(b, 0.004, seed + 2);  // gaps
  WeightStore store = make_store(a, SIZE_MAX, true);
  WeightStore host;
  for (const Spec& s : kSpecs) {
    ASSERT_TRUE(host.add(s.name, s.format, s.shape));
    ASSERT_TRUE(host.apply_tensor(s.name, a.at(s.name).values, a.at(s.name).scales));
  }
  uint64_t version = 1, host_version = 1;
  int encodings[3] = {0, 0, 0};
  using Step = std::pair<const Model*, const Model*>;
  for (const auto& [from, to] : {Step{&a, &b}, Step{&b, &c}, Step{&c, &a}}) {
    const Delta d = make_delta(*from, *to, version, version + 1, false);
    auto body = refit::encode_delta_body(d);
    ASSERT_TRUE(body);
    auto view = refit::parse_delta_view(*body);
    ASSERT_TRUE(view) << view.error().message;
    for (const auto& t : view->tensors) ++encodings[t.values.encoding], ++encodings[t.scales.encoding];
    // note: the pinned copy takes the zero-copy upload, the pageable one the packed staging.
    const bool pinned = from == &b;
    uint8_t* pin = nullptr;
    ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&pin), body->size(), cudaHostAllocDefault), cudaSuccess);
    std::memcpy(pin, body->data(), body->size());
    auto pinned_view = refit::parse_delta_view({pin, body->size()});
    ASSERT_TRUE(pinned_view);
    auto s = refit::apply_delta(store, version, pinned ? *pinned_view : *view);
    cudaFreeHost(pin);
    ASSERT_TRUE(s) << s.error().message;
    ASSERT_TRUE(refit::apply_delta(host, host_version, *view));
    EXPECT_EQ(canonical(store), *to);
    EXPECT_EQ(canonical(host), *to);
    for (const auto& [name, t] : host.tensors()) EXPECT_EQ(store.at(name).checksum, t.checksum) << name;
  }
  EXPECT_EQ(version, host_version);
  EXPECT_GT(encodings[0], 0);
  EXPECT_GT(encodings[1], 0);
  EXPECT_GT(encodings[2], 0);
}

// A corrupted index set or new entry that the parser lets through (the structure is intact) is refused on
// the device before any write, worded as the host words it (check_tensor_view).
TEST(CudaRefitWire, CorruptIndexSetsAndBytesAreRefusedBeforeAnyWrite) {
  const uint32_t seed = static_cast<uint32_t>(test::fresh_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Model a = mutate({}, 1.0, seed), b = mutate(a, 0.05, seed + 1);
  WeightStore store = make_store(a, SIZE_MAX, true);
  const Native before = native(store);
  const Delta d = make_delta(a, b, 1, 2, false);
  auto good = refit::encode_delta_body(d);
  ASSERT_TRUE(good);
  auto view = refit::parse_delta_view(*good);
  ASSERT_TRUE(view);
  struct Corruption {
    std::string what;
    size_t record;
    bool scales;
    std::function<bool(uint8_t* index, size_t n, uint8_t* bytes, size_t nb)> apply;  // false: not applicable
  };
  auto single = [](const uint8_t* x, size_t i) { return x[i] < 0x80 && (i == 0 || x[i - 1] < 0x80); };
  std::vector<Corruption> cases = {
      {"zero gap (W-02)", 0, false,
       [&](uint8_t* x, size_t n, uint8_t*, size_t) {
         for (size_t i = 1; i < n; ++i)
           if (single(x, i)) return x[i] = 0, true;
         return false;
       }},
      {"non-minimal varint", 1, false,
       [&](uint8_t* x, size_t n, uint8_t*, size_t) {
         for (size_t i = 1; i + 1 < n; ++i)
           if (single(x, i) && single(x, i + 1)) return x[i] |= 0x80, x[i + 1] = 0, true;
         return false;
       }},
      {"varint of ten bytes", 0, false,
       [&](uint8_t* x, size_t n, uint8_t*, size_t) {
         if (n < 12) return false;
         for (size_t i = 0; i < 10; ++i) x[i] = 0x80;
         x[10] = 0x01;
         return true;
       }},
      {"cut off inside a varint", 1, false,
       [&](uint8_t* x, size_t n, uint8_t*, size_t) { return n > 0 ? (x[n - 1] |= 0x80, true) : false; }},
      {"index past the plane (W-01)", 4, false,
       [&](uint8_t* x, size_t n, uint8_t*, size_t) {
         // note: every one-byte gap made 127: two of them already pass the 200 entries of the norm
         int made = 0;
         for (size_t i = 0; i < n; ++i)
           if (single(x, i)) x[i] = 0x7F, ++made;
         return made >= 2;
       }},
      {"E4M3 NaN new value (W-05)", 0, false,
       [&](uint8_t*, size_t, uint8_t* v, size_t nb) { return nb > 0 ? (v[nb / 2] = 0x7F, true) : false; }},
      {"E8M0 NaN new scale (W-05)", 1, true,
       [&](uint8_t*, size_t, uint8_t* v, size_t nb) { return nb > 0 ? (v[0] = 0xFF, true) : false; }},
      {"f32 scale <= 0 (W-05)", 3, true,
       [&](uint8_t*, size_t, uint8_t* v, size_t nb) { return nb >= 4 ? (v[3] |= 0x80, true) : false; }},
      {"bf16 Inf (W-05)", 4, false,
       [&](uint8_t*, size_t, uint8_t* v, size_t nb) {
         return nb >= 2 ? (v[0] = 0x80, v[1] = 0x7F, true) : false;
       }},
  };
  int applied = 0;
  for (const Corruption& c : cases) {
    std::vector<uint8_t> body = *good;
    const refit::PlaneView& pv = c.scales ? view->tensors[c.record].scales : view->tensors[c.record].values;
    uint8_t* index = body.data() + (pv.index.data() - good->data());
    uint8_t* bytes = body.data() + (pv.bytes.data() - good->data());
    if (!c.apply(index, pv.index.size(), bytes, pv.bytes.size())) continue;
    ++applied;
    auto bad = refit::parse_delta_view(body);
    ASSERT_TRUE(bad) << c.what << ": the structure stays intact";
    auto host_says = refit::check_tensor_view(bad->tensors[c.record]);
    ASSERT_FALSE(host_says) << c.what << ": the host refuses it too";
    uint64_t version = 1;
    auto s = refit::apply_delta(store, version, *bad);
    ASSERT_FALSE(s) << c.what;
    EXPECT_EQ(s.error().message, host_says.error().message) << c.what;
    EXPECT_NE(s.error().message.find(kSpecs[c.record].name), std::string::npos) << s.error().message;
    EXPECT_EQ(version, 1u);
    EXPECT_EQ(native(store).bytes, before.bytes) << c.what << ": nothing written";
  }
  EXPECT_GE(applied, 7);
  uint64_t version = 1;
  std::vector<uint8_t> keep;
  ASSERT_TRUE(apply_wire(store, version, d, {}, keep)) << "the intact delta still applies";
  EXPECT_EQ(canonical(store), b);
  expect_checksums(store, b);
}

TEST(CudaRefit, UndoLogThatDoesNotFitIsRefusedBeforeAnyWrite) {
  const uint32_t seed = static_cast<uint32_t>(test::fresh_seed());
  const Model a = mutate({}, 1.0, seed), b = mutate(a, 0.3, seed + 1);
  const Delta d = make_delta(a, b, 1, 2, true);
  WeightStore store = make_store(a, refit::undo_log_bytes(d) - 1);
  const Native before = native(store);
  uint64_t version = 1;
  auto s = refit::apply_delta(store, version, d);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("W-26"), std::string::npos) << s.error().message;
  EXPECT_EQ(version, 1u);
  EXPECT_EQ(native(store).bytes, before.bytes);
}

// Scratch comes from a stream-ordered pool (CudaMemoryOptions::scratch_keep_bytes): after each apply every
// scratch span is back, a repeated apply reuses the reserved memory instead of growing it (also after a
// delta the device refused once its scratch was placed), and with nothing to keep a sync hands it all back.
TEST(CudaRefit, ScratchIsReusedAcrossAppliesAndAfterARefusal) {
  const uint32_t seed = static_cast<uint32_t>(test::fresh_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Model a = mutate({}, 1.0, seed), b = mutate(a, 0.05, seed + 1);
  WeightStore store = make_store(a, SIZE_MAX, true);
  std::vector<uint8_t> keep;
  uint64_t version = 1;
  ASSERT_TRUE(apply_wire(store, version, make_delta(a, b, 1, 2, false), {}, keep));
  EXPECT_EQ(scratch_in_use(store.memory()), 0u);
  const size_t reserved = scratch_reserved(store.memory());
  EXPECT_GT(reserved, 0u) << "freed scratch stays reserved for the next apply";
  ASSERT_TRUE(apply_wire(store, version, make_delta(b, a, 2, 3, false), {}, keep));
  // a delta the device refuses (a zero gap in record 0's values) after its scratch was placed
  const Delta d = make_delta(a, b, 3, 4, false);
  auto body = refit::encode_delta_body(d);
  ASSERT_TRUE(body);
  auto view = refit::parse_delta_view(*body);
  ASSERT_TRUE(view);
  const refit::PlaneView& pv = view->tensors[0].values;
  ASSERT_EQ(pv.encoding, 0) << "gaps at 5%";
  std::vector<uint8_t> bad = *body;
  uint8_t* index = bad.data() + (pv.index.data() - body->data());
  bool made = false;
  for (size_t i = 1; i < pv.index.size() && !made; ++i)
    if (index[i] < 0x80 && index[i - 1] < 0x80) index[i] = 0, made = true;
  ASSERT_TRUE(made);
  auto bad_view = refit::parse_delta_view(bad);
  ASSERT_TRUE(bad_view);
  bad_view->base_version = 3, bad_view->new_version = 4;
  const Native before = native(store);
  auto refused = refit::apply_delta(store, version, *bad_view);
  ASSERT_FALSE(refused);
  EXPECT_EQ(version, 3u);
  EXPECT_EQ(native(store).bytes, before.bytes);
  EXPECT_EQ(scratch_in_use(store.memory()), 0u) << "a refusal returns its scratch";
  for (int k = 0; k < 2; ++k) {
    ASSERT_TRUE(apply_wire(store, version, k == 0 ? d : make_delta(b, a, 4, 5, false), {}, keep));
    EXPECT_EQ(scratch_in_use(store.memory()), 0u);
    EXPECT_EQ(scratch_reserved(store.memory()), reserved) << "apply " << k << " reuses the kept scratch";
  }
  EXPECT_EQ(canonical(store), a);
  expect_checksums(store, a);
  // keep nothing: the sync after an apply hands the pool's memory back
  CudaMemoryOptions o;
  o.scratch_keep_bytes = 0;
  auto mem = cuda_weight_memory(o);
  ASSERT_TRUE(mem);
  WeightStore bare(std::move(*mem));
  for (const Spec& s : kSpecs) {
    ASSERT_TRUE(bare.add(s.name, s.format, s.shape));
    ASSERT_TRUE(bare.apply_tensor(s.name, a.at(s.name).values, a.at(s.name).scales));
  }
  version = 1;
  ASSERT_TRUE(apply_wire(bare, version, make_delta(a, b, 1, 2, false), {}, keep));
  ASSERT_TRUE(bare.sync());
  EXPECT_EQ(scratch_in_use(bare.memory()), 0u);
  EXPECT_EQ(scratch_reserved(bare.memory()), 0u);
  EXPECT_EQ(canonical(bare), b);
}

// W-16: the graph records the store's device addresses once; after refits its replay must equal the same
// graph over a fresh store holding the target weights.
TEST(CudaRefit, GraphReplayAfterRefitEqualsFreshLoad) {
  const uint32_t seed = static_cast<uint32_t>(test::fresh_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Model a = mutate({}, 1.0, seed), b = mutate(a, 0.03, seed + 1), c = mutate(b, 0.5, seed + 2);
  WeightStore store = make_store(a);
  const Native start = native(store);
  std::mt19937_64 rng(seed);
  constexpr int64_t m = 3;
  std::vector<const Spec*> gemvs;
  for (const Spec& s : kSpecs)
    if (s.gemv()) gemvs.push_back(&s);
  std::vector<DeviceBuffer> xs, ys;
  for (const Spec* s : gemvs) {
    auto x = test::upload(test::random_bf16(rng, static_cast<size_t>(m * s->shape[1])));
    auto y = test::poisoned<uint16_t>(static_cast<size_t>(m * s->shape[0]));
    ASSERT_TRUE(x && y);
    xs.push_back(std::move(*x)), ys.push_back(std::move(*y));
  }
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  auto enqueue = [&](const WeightStore& st, std::vector<DeviceBuffer>& out) -> Status {
    for (size_t i = 0; i < gemvs.size(); ++i) {
      const QTensor& t = st.at(gemvs[i]->name);
      const MxGemvWeights w{t.format, t.values.data(), t.scales.data(), t.shape[0], t.shape[1]};
      auto s = t.format == Format::kMXFP8
                   ? gemv_mxfp8(xs[i].as<uint16_t>(), m, w, out[i].as<uint16_t>(), stream)
                   : gemv_mxfp4(xs[i].as<uint16_t>(), m, w, out[i].as<uint16_t>(), stream);
      if (!s) return s;
    }
    return {};
  };
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_TRUE(enqueue(store, ys));
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  uint64_t version = 1;
  ASSERT_TRUE(refit::apply_delta(store, version, make_delta(a, b, 1, 2, false)));  // sparse
  ASSERT_TRUE(refit::apply_delta(store, version, make_delta(b, c, 2, 3, true)));   // anchors
  for (auto& y : ys) ASSERT_EQ(cudaMemset(y.as(), 0xFF, y.bytes()), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  // reference: eager launches over a fresh store loaded with C
  WeightStore fresh = make_store(c);
  std::vector<DeviceBuffer> ref;
  for (const Spec* s : gemvs) {
    auto y = test::poisoned<uint16_t>(static_cast<size_t>(m * s->shape[0]));
    ASSERT_TRUE(y);
    ref.push_back(std::move(*y));
  }
  ASSERT_TRUE(enqueue(fresh, ref));
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (size_t i = 0; i < gemvs.size(); ++i) {
    const size_t count = static_cast<size_t>(m * gemvs[i]->shape[0]);
    auto got = test::download<uint16_t>(ys[i], count), want = test::download<uint16_t>(ref[i], count);
    ASSERT_TRUE(got && want);
    EXPECT_EQ(*got, *want) << gemvs[i]->name;
    size_t nan = 0;
    for (uint16_t h : *got) nan += (h & 0x7FFF) > 0x7F80;
    EXPECT_EQ(nan, 0u) << "every output written";
  }
  EXPECT_EQ(native(store).at, start.at) << "buffer addresses unchanged";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace mxq::cuda
