// refit::apply_delta on a WeightStore in CUDA device memory: deltas land bit-exact (A -> B -> A and a
// 4-step chain with an anchor step) with unchanged device addresses; every injected fault and a checksum
// mismatch leave exactly the old bytes (both with full checksums and with incremental ones); W-26 (no room
// for the undo log) is refused before any write; and W-16: a CUDA graph of GEMV launches reading the store,
// replayed after a sparse and an anchor delta, equals the same graph on a fresh store loaded with the target
// weights.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "cuda/gemv_layout.h"
#include "cuda/gemv_mx.h"
#include "cuda/weight_memory_cuda.h"
#include "gpu_test_util.h"
#include "layout/probe.h"
#include "refit/applier.h"
#include "refit/delta_encoder.h"

namespace mxq::cuda {
namespace {

using refit::ApplyStage;
using refit::Delta;

struct Spec {
  std::string name;
  Format format;
  std::vector<int64_t> shape;
  bool gemv;  // values in the GEMV native layout (probed)
};
const std::vector<Spec> kSpecs = {
    {"model.layers.0.self_attn.q_proj.weight", Format::kMXFP8, {64, 256}, true},
    {"model.layers.0.mlp.down_proj.weight", Format::kMXFP8, {96, 160}, true},
    {"model.layers.0.mlp.up_proj.weight", Format::kMXFP4, {32, 384}, true},
    {"model.layers.0.self_attn.o_proj.weight", Format::kFP8_B128, {130, 160}, false},
    {"model.norm.weight", Format::kBF16, {200}, false},
    {"model.embed_tokens.weight", Format::kF32, {4, 8}, false},
};

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
    if (s.gemv) {
      auto l = gemv_layout(s);
      EXPECT_TRUE(l) << l.error().message;
      EXPECT_TRUE(store.add(s.name, s.format, s.shape, *l));
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

// note: both tests run with and without incremental checksums (kept block sums updated by the scatters).
class CudaRefitModes : public ::testing::TestWithParam<bool> {};

TEST_P(CudaRefitModes, ABAAndChainBitExactAtFixedAddresses) {
  const uint32_t seed = static_cast<uint32_t>(test::fresh_seed());
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Model a = mutate({}, 1.0, seed), b = mutate(a, 0.05, seed + 1);
  WeightStore store = make_store(a, SIZE_MAX, GetParam());
  const Native start = native(store);
  EXPECT_EQ(canonical(store), a);
  expect_checksums(store, a);
  uint64_t version = 1;
  ASSERT_TRUE(refit::apply_delta(store, version, make_delta(a, b, 1, 2, false)));
  EXPECT_EQ(version, 2u);
  EXPECT_EQ(canonical(store), b);
  expect_checksums(store, b);
  ASSERT_TRUE(refit::apply_delta(store, version, make_delta(b, a, 2, 3, false)));
  const Native back = native(store);
  EXPECT_EQ(back.bytes, start.bytes) << "A -> B -> A restores every live byte";
  EXPECT_EQ(back.at, start.at);
  // 4 steps: sparse, anchors, sparse of 40%, sparse of 0.5%
  Model cur = a;
  const double fractions[] = {0.02, 1.0, 0.4, 0.005};
  for (int k = 0; k < 4; ++k) {
    const Model next = mutate(cur, fractions[k] >= 1.0 ? 0.3 : fractions[k], seed + 10 + k);
    ASSERT_TRUE(
        refit::apply_delta(store, version, make_delta(cur, next, version, version + 1, fractions[k] >= 1.0)));
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
  WeightStore store = make_store(a, SIZE_MAX, GetParam());
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
      auto s = refit::apply_delta(store, version, d, o);
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
    ASSERT_FALSE(refit::apply_delta(store, version, d, o));
    EXPECT_EQ(native(store).bytes, before.bytes) << "transient undo faults";
    EXPECT_TRUE(store.servable());
  }
  // a checksum the weights do not reach (W-06): restored
  {
    Delta bad = d;
    bad.tensors[2].checksum ^= 1;
    uint64_t version = 5;
    auto s = refit::apply_delta(store, version, bad);
    ASSERT_FALSE(s);
    EXPECT_NE(s.error().message.find("W-06"), std::string::npos) << s.error().message;
    EXPECT_EQ(native(store).bytes, before.bytes);
  }
  // the same delta applies cleanly afterwards
  uint64_t version = 5;
  ASSERT_TRUE(refit::apply_delta(store, version, d)) << faults;
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
    auto s = refit::apply_delta(store, version, back, o);
    ASSERT_FALSE(s);
    EXPECT_FALSE(store.servable());
  }
}

INSTANTIATE_TEST_SUITE_P(Checksums, CudaRefitModes, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "incremental" : "full"; });

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
    if (s.gemv) gemvs.push_back(&s);
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
