// The applier's encoded path (apply_delta on a DeltaView for a device store: docs/refit-format.md "Device
// path") run on the CPU: a host memory that says it is a device, with decode_sparse / scatter_sparse done by
// the CPU twin (decode_indices, the W-05 policy, scatter through the layout). It exercises everything of that
// path but the kernels: segments of a pinned or pageable body, run tables, jobs, undo steps over decoded
// positions, anchors from the uploaded image, the checksum batch, every fault stage and the rollback, and a
// refusal worded by check_tensor_view with nothing written. The GPU tests (refit_apply_test.cpp,
// sparse_decode_test.cpp) run the same path with the kernels.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "applier_test_model.h"
#include "model/weight_memory.h"
#include "refit/applier.h"
#include "refit/delta_encoder.h"
#include "refit/index_codec.h"

namespace mxq::refit {
namespace {

using test_model::kSpecs;
using test_model::random_entry;
using test_model::Spec;

// The W-05 rules of NewBytePolicy (weight_memory.h), as the device applies them.
bool refused(NewBytePolicy policy, const uint8_t* e) {
  uint32_t w = 0;
  std::memcpy(&w, e, policy == NewBytePolicy::kBF16 || policy == NewBytePolicy::kF16 ? 2 : 4);
  float f;
  std::memcpy(&f, &w, 4);
  switch (policy) {
    case NewBytePolicy::kE4M3:
      return (e[0] & 0x7F) == 0x7F;
    case NewBytePolicy::kE8M0:
      return e[0] == 0xFF;
    case NewBytePolicy::kF32Scale:
      return !(f > 0.0f && f <= 3.402823466e38f);
    case NewBytePolicy::kBF16:
      return (w >> 7 & 0xFF) == 0xFF;
    case NewBytePolicy::kF16:
      return (w >> 10 & 0x1F) == 0x1F;
    case NewBytePolicy::kF32:
      return (w >> 23 & 0xFF) == 0xFF;
    default:
      return false;
  }
}

class EncodedHostMemory final : public WeightMemory {
 public:
  std::string_view name() const override { return "encoded-host"; }
  bool on_device() const override { return true; }
  Result<std::span<uint8_t>> allocate_plane(const PlaneLayout& l) override {
    return host_->allocate_plane(l);
  }
  void free_plane(std::span<uint8_t> native) override { host_->free_plane(native); }
  Result<std::span<uint8_t>> allocate_scratch(size_t bytes) override {
    if (bytes == 0) return std::span<uint8_t>{};
    auto buf = std::make_unique<uint8_t[]>(bytes);
    std::memset(buf.get(), 0xA5, bytes);  // note: poisoned, so a position the decode skips shows
    const std::span<uint8_t> s{buf.get(), bytes};
    scratch_[buf.get()] = std::move(buf);
    return s;
  }
  void free_scratch(std::span<uint8_t> s) override { scratch_.erase(s.data()); }
  Status upload(std::span<const uint8_t> host, std::span<uint8_t> dst) override {
    if (host.size() != dst.size()) return fail("upload of {} bytes into {}", host.size(), dst.size());
    if (!host.empty()) std::memcpy(dst.data(), host.data(), host.size());
    ++uploads;
    return {};
  }
  Status write_plane(const PlaneLayout& l, std::span<const uint8_t> c, std::span<uint8_t> n) override {
    return host_->write_plane(l, c, n);
  }
  Status read_plane(const PlaneLayout& l, std::span<const uint8_t> n, std::span<uint8_t> c) override {
    return host_->read_plane(l, n, c);
  }
  Status scatter(const PlaneLayout& l, std::span<const int64_t> indices, int entry_bytes,
                 std::span<const uint8_t> bytes, std::span<uint8_t> undo, std::span<uint8_t> native,
                 std::string_view what) override {
    return host_->scatter(l, indices, entry_bytes, bytes, undo, native, what);
  }
  Status checksums(std::span<const ChecksumJob> jobs) override { return host_->checksums(jobs); }
  Status sync() override { return {}; }
  bool host_pinned(std::span<const uint8_t> bytes) const override {
    return !bytes.empty() && bytes.data() == pinned.data();
  }

  Result<std::optional<SparseRefusal>> decode_sparse(std::span<const SparsePlaneJob> jobs,
                                                     std::span<uint8_t> positions) override {
    auto* out = reinterpret_cast<int32_t*>(positions.data());
    for (size_t k = 0; k < jobs.size(); ++k) {
      const SparsePlaneJob& j = jobs[k];
      std::vector<int64_t> idx;
      if (j.encoding == static_cast<uint8_t>(IndexEncoding::kRuns)) {
        std::vector<int32_t> table(j.index.size() / 4);
        std::memcpy(table.data(), j.index.data(), j.index.size());
        for (size_t r = 0; r < table.size(); r += 2) {
          const int64_t end = r + 2 < table.size() ? table[r + 3] : j.count;
          for (int64_t p = table[r + 1]; p < end; ++p) idx.push_back(table[r] + (p - table[r + 1]));
        }
      } else {
        auto d = decode_indices(static_cast<IndexEncoding>(j.encoding), j.index, j.count, j.entries);
        if (!d) return std::optional<SparseRefusal>{SparseRefusal{k, 0}};
        idx = std::move(*d);
      }
      for (size_t e = 0; e < idx.size(); ++e) {
        if (refused(j.policy, j.bytes.data() + e * static_cast<size_t>(j.entry_bytes)))
          return std::optional<SparseRefusal>{SparseRefusal{k, static_cast<int64_t>(e)}};
        *out++ = static_cast<int32_t>(idx[e]);
      }
    }
    ++decodes;
    return std::optional<SparseRefusal>{};
  }
  Status scatter_sparse(std::span<const SparsePlaneJob> jobs, std::span<const uint8_t> positions) override {
    const auto* pos = reinterpret_cast<const int32_t*>(positions.data());
    for (const SparsePlaneJob& j : jobs) {
      if (auto s = host_->scatter32(*j.layout, {pos, static_cast<size_t>(j.count)}, j.entry_bytes, j.bytes,
                                    j.undo, j.native, j.what);
          !s)
        return s;
      pos += j.count;
    }
    return {};
  }

  std::span<const uint8_t> pinned;  // the body the test calls pinned (zero-copy)
  int uploads = 0, decodes = 0;

 private:
  std::unique_ptr<WeightMemory> host_ = host_weight_memory();
  std::map<const uint8_t*, std::unique_ptr<uint8_t[]>> scratch_;
};

using Model = std::map<std::string, std::pair<std::vector<uint8_t>, std::vector<uint8_t>>>;

// Each entry changed with probability p; `run` > 0 also rewrites the first `run` entries of every plane.
Model step(const Model* from, double p, uint32_t seed, int64_t run = 0) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution pick(p);
  Model m;
  for (const Spec& s : kSpecs) {
    auto pb = plane_bytes(s.format, s.shape, s.name);
    auto planes = from ? from->at(s.name)
                       : std::pair{std::vector<uint8_t>(static_cast<size_t>(pb->values)),
                                   std::vector<uint8_t>(static_cast<size_t>(pb->scales))};
    for (Plane pl : {Plane::kValues, Plane::kScales}) {
      auto& bytes = pl == Plane::kValues ? planes.first : planes.second;
      if (bytes.empty()) continue;
      const auto w = static_cast<size_t>(entry_bytes(s.format, pl));
      for (size_t i = 0; i + w <= bytes.size(); i += w)
        if (!from || pick(rng) || static_cast<int64_t>(i / w) < run)
          random_entry(s.format, pl, rng, bytes.data() + i);
    }
    m[s.name] = std::move(planes);
  }
  return m;
}

WeightStore make_store(const Model& m, EncodedHostMemory** mem = nullptr) {
  auto owned = std::make_unique<EncodedHostMemory>();
  if (mem) *mem = owned.get();
  WeightStore store(std::move(owned));
  for (const Spec& s : kSpecs) {
    EXPECT_TRUE(store.add(s.name, s.format, s.shape));
    EXPECT_TRUE(store.apply_tensor(s.name, m.at(s.name).first, m.at(s.name).second));
  }
  return store;
}

Model live(const WeightStore& store) {
  Model m;
  for (const auto& [name, t] : store.tensors())
    m[name] = {{t.values.begin(), t.values.end()}, {t.scales.begin(), t.scales.end()}};
  return m;
}

std::vector<uint8_t> body_of(const Model& from, const Model& to, uint64_t base, bool anchors) {
  Delta d{base, base + 1, {}};
  for (const Spec& s : kSpecs) {
    const CanonicalPlanes old{from.at(s.name).first, from.at(s.name).second};
    auto t =
        diff_tensor(s.name, s.format, s.shape, &old, {to.at(s.name).first, to.at(s.name).second}, anchors);
    EXPECT_TRUE(t);
    d.tensors.push_back(std::move(*t));
  }
  auto body = encode_delta_body(d);
  EXPECT_TRUE(body);
  return *body;
}

TEST(ApplyEncoded, EveryEncodingPinnedOrPageableLandsTheTargetBytes) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Model a = step(nullptr, 1, seed);
  EncodedHostMemory* mem = nullptr;
  WeightStore store = make_store(a, &mem);
  uint64_t version = 1;
  Model cur = a;
  int encodings[3] = {0, 0, 0};
  // 1% (gaps), 40% (bitmaps), a run of 40 entries (runs), anchors, then back to a
  const double p[] = {0.01, 0.4, 0, 0.3};
  for (int k = 0; k < 5; ++k) {
    const Model target = k < 4 ? step(&cur, p[k], seed + 1 + k, k == 2 ? 40 : 0) : a;
    std::vector<uint8_t> body = body_of(cur, target, version, k == 3);
    mem->pinned = k % 2 ? std::span<const uint8_t>(body) : std::span<const uint8_t>{};
    auto view = parse_delta_view(body);
    ASSERT_TRUE(view) << view.error().message;
    for (const TensorView& t : view->tensors)
      if (!t.anchor) ++encodings[t.values.encoding], ++encodings[t.scales.encoding];
    const int decodes = mem->decodes;
    auto s = apply_delta(store, version, *view);
    ASSERT_TRUE(s) << "step " << k << ": " << s.error().message;
    EXPECT_EQ(mem->decodes, decodes + 1) << "the encoded path ran";
    cur = target;
    EXPECT_TRUE(live(store) == cur) << "step " << k;
    for (const Spec& sp : kSpecs)
      EXPECT_EQ(store.at(sp.name).checksum,
                canonical_checksum(cur.at(sp.name).first, cur.at(sp.name).second));
  }
  EXPECT_EQ(version, 6u);
  EXPECT_GT(encodings[0], 0);
  EXPECT_GT(encodings[1], 0);
  EXPECT_GT(encodings[2], 0);
}

// Every hook stage faulted in turn (and the undo steps, transiently): the old bytes exactly, then the same
// delta applies.
TEST(ApplyEncoded, EveryFaultLeavesTheOldBytes) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Model a = step(nullptr, 1, seed), b = step(&a, 0.05, seed + 1, 3);
  std::vector<uint8_t> body = body_of(a, b, 3, false);
  auto view = parse_delta_view(body);
  ASSERT_TRUE(view);
  const size_t stages = 1 + 2 * kSpecs.size();
  for (size_t k = 0; k < stages; ++k) {
    for (int undo_faults : {0, kUndoAttempts - 1}) {
      WeightStore store = make_store(a);
      const Model before = live(store);
      size_t calls = 0;
      int undo = 0;
      ApplyOptions o;
      o.fault = [&](const StagePoint& p) -> Status {
        if (p.stage == ApplyStage::kUndoStep) return undo++ < undo_faults ? fail("transient") : Status{};
        return calls++ == k ? fail("injected fault") : Status{};
      };
      uint64_t version = 3;
      auto s = apply_delta(store, version, *view, o);
      ASSERT_FALSE(s) << k;
      EXPECT_NE(s.error().message.find("injected fault"), std::string::npos) << s.error().message;
      EXPECT_EQ(version, 3u);
      EXPECT_TRUE(store.servable());
      EXPECT_TRUE(live(store) == before) << "fault at stage " << k;
      ASSERT_TRUE(apply_delta(store, version, *view));
      EXPECT_TRUE(live(store) == b);
    }
  }
}

// A gaps set with a zero gap and an E4M3 NaN new byte: refused before any write, in the host's words.
TEST(ApplyEncoded, RefusalIsWordedByTheHostAndWritesNothing) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Model a = step(nullptr, 1, seed), b = step(&a, 0.2, seed + 1);
  const std::vector<uint8_t> good = body_of(a, b, 1, false);
  auto view = parse_delta_view(good);
  ASSERT_TRUE(view);
  const TensorView& t = view->tensors[1];  // mxfp8 [8, 64]: values 20% changed
  for (int c = 0; c < 2; ++c) {
    std::vector<uint8_t> body = good;
    if (c == 0) {
      ASSERT_EQ(t.values.encoding, static_cast<uint8_t>(IndexEncoding::kBitmap));
      // note: one bit cleared: the count no longer matches (the bitmap has no zero gaps to forge)
      const size_t at = static_cast<size_t>(t.values.index.data() - good.data());
      size_t i = 0;
      while (body[at + i] == 0) ++i;
      body[at + i] &= static_cast<uint8_t>(body[at + i] - 1);
    } else {
      body[static_cast<size_t>(t.values.bytes.data() - good.data())] = 0xFF;
    }
    auto bad = parse_delta_view(body);
    ASSERT_TRUE(bad);
    WeightStore store = make_store(a);
    const Model before = live(store);
    uint64_t version = 1;
    auto s = apply_delta(store, version, *bad);
    ASSERT_FALSE(s);
    auto host = check_tensor_view(bad->tensors[1]);
    ASSERT_FALSE(host);
    EXPECT_EQ(s.error().message, host.error().message);
    EXPECT_NE(s.error().message.find(c == 0 ? "W-03" : "W-05"), std::string::npos) << s.error().message;
    EXPECT_TRUE(live(store) == before);
    EXPECT_EQ(version, 1u);
  }
}

}  // namespace
}  // namespace mxq::refit
