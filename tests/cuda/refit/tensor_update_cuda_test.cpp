// cuda::apply_device_buffer (the device half of /update_weights_from_tensor, without the IPC open: a handle
// cannot be opened by the process that made it) on a CUDA WeightStore: bf16 sources land as the CPU
// quantizer's bytes with the startup rule, canonical planes land as sent, and a NaN source, an invalid plane
// byte or a wrong manifest checksum are refused with every live byte as before. The device W-05 check
// (check_planes) against its host twin on planted bad entries.
#include "refit/tensor_update_cuda.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "../gpu_test_util.h"
#include "cuda/linear/gemv_layout.h"
#include "format/quantize.h"
#include "format/quantize_parallel.h"
#include "layout/probe.h"
#include "model/weight_memory_cuda.h"
#include "refit/applier.h"

namespace mxq::cuda {
namespace {

struct Spec {
  std::string name;
  Format format;
  std::vector<int64_t> shape;
  bool gemv = false;
};
const std::vector<Spec> kSpecs = {
    {"model.layers.0.self_attn.q_proj.weight", Format::kMXFP8, {64, 256}, true},
    {"model.layers.0.mlp.up_proj.weight", Format::kMXFP4, {32, 384}},
    {"model.layers.0.mlp.experts.down_proj", Format::kMXFP4, {2, 32, 64}},
    {"model.layers.0.self_attn.o_proj.weight", Format::kFP8_B128, {130, 160}},
    {"model.norm.weight", Format::kBF16, {200}},
};

int64_t elements(const Spec& s) {
  int64_t n = 1;
  for (int64_t d : s.shape) n *= d;
  return n;
}

struct Planes {
  std::vector<uint8_t> values, scales;
  bool operator==(const Planes&) const = default;
};
using Model = std::map<std::string, Planes>;

WeightStore make_store() {
  auto mem = cuda_weight_memory();
  EXPECT_TRUE(mem) << mem.error().message;
  WeightStore store(std::move(*mem));
  for (const Spec& s : kSpecs) {
    if (!s.gemv) {
      EXPECT_TRUE(store.add(s.name, s.format, s.shape));
      continue;
    }
    auto l = probe_layout(s.name, "cuda_gemv", s.format, s.shape, [&](const HostPlanes& in) -> Result<HostPlanes> {
      HostPlanes out{std::vector<uint8_t>(in.values.size()), in.scales};
      if (auto st = prepare_gemv_values(s.format, in.values.data(), out.values.data(), s.shape[0], s.shape[1]); !st)
        return tl::unexpected(st.error());
      return out;
    });
    EXPECT_TRUE(l) << l.error().message;
    EXPECT_TRUE(store.add(s.name, s.format, s.shape, *l));
  }
  return store;
}

Model live(const WeightStore& store) {
  Model m;
  for (const auto& [name, t] : store.tensors()) {
    Planes p{std::vector<uint8_t>(static_cast<size_t>(t.layout.values.canonical.bytes())),
             std::vector<uint8_t>(static_cast<size_t>(t.layout.scales.canonical.bytes()))};
    EXPECT_TRUE(store.read_canonical(name, Plane::kValues, p.values));
    EXPECT_TRUE(store.read_canonical(name, Plane::kScales, p.scales));
    m[name] = std::move(p);
  }
  return m;
}

// Random bf16 weights per tensor, and what the CPU makes of them (the startup rule; plain: the bytes).
struct Weights {
  std::map<std::string, std::vector<uint16_t>> bf16;
  Model planes;
};
Weights random_weights(std::mt19937_64& rng) {
  Weights w;
  for (const Spec& s : kSpecs) {
    auto x = test::random_bf16(rng, static_cast<size_t>(elements(s)));
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(x.data()), x.size() * 2);
    if (is_quantized(s.format)) {
      auto q = quantize_tensor(s.format, default_scale_rule(s.format), Format::kBF16, bytes, s.shape, s.name, 1);
      EXPECT_TRUE(q) << q.error().message;
      w.planes[s.name] = {q->values, q->scales};
    } else {
      w.planes[s.name] = {{bytes.begin(), bytes.end()}, {}};
    }
    w.bf16[s.name] = std::move(x);
  }
  return w;
}

// One buffer: every tensor's bf16 source (planes = false) or its canonical planes, 16-byte aligned.
struct Buffer {
  refit::TensorManifest manifest;
  std::vector<uint8_t> host;
  DeviceBuffer device;
};
Buffer pack(const Weights& w, bool planes) {
  Buffer b;
  auto put = [&](std::span<const uint8_t> bytes) {
    const uint64_t at = b.host.size();
    b.host.insert(b.host.end(), bytes.begin(), bytes.end());
    b.host.resize((b.host.size() + 15) / 16 * 16, 0);
    return at;
  };
  for (const Spec& s : kSpecs) {
    refit::ManifestTensor t{s.name, Format::kBF16, s.shape, 0, 0, {}};
    if (planes && is_quantized(s.format)) {
      const Planes& p = w.planes.at(s.name);
      t.dtype = s.format;
      t.offset = put(p.values);
      t.scales_offset = put(p.scales);
      t.checksum = canonical_checksum(p.values, p.scales);
    } else {
      const auto& x = w.bf16.at(s.name);
      t.offset = put({reinterpret_cast<const uint8_t*>(x.data()), x.size() * 2});
    }
    b.manifest.tensors.push_back(t);
  }
  b.manifest.size = b.host.size();
  auto dev = test::upload(b.host);
  EXPECT_TRUE(dev) << dev.error().message;
  b.device = std::move(*dev);
  return b;
}

Status apply(WeightStore& store, uint64_t& version, const Buffer& b) {
  return apply_device_buffer(store, version, version + 1, b.manifest, b.device.as<uint8_t>());
}

TEST(TensorUpdate, SourcesLandAsTheCpuQuantizesThemAndPlanesAsSent) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  WeightStore store = make_store();
  uint64_t version = 0;
  const Weights a = random_weights(rng), b = random_weights(rng);
  ASSERT_TRUE(apply(store, version, pack(a, false)));
  EXPECT_EQ(version, 1u);
  EXPECT_TRUE(live(store) == a.planes);
  for (const auto& [name, p] : a.planes) EXPECT_EQ(store.at(name).checksum, canonical_checksum(p.values, p.scales));
  const QTensor& q = store.at(kSpecs[0].name);
  const std::vector<uint8_t*> where{q.values.data(), q.scales.data()};
  ASSERT_TRUE(apply(store, version, pack(b, true)));
  EXPECT_EQ(version, 2u);
  EXPECT_TRUE(live(store) == b.planes);
  EXPECT_EQ(store.at(kSpecs[0].name).values.data(), where[0]) << "a live plane moved";
}

// covers W-05, W-06
TEST(TensorUpdate, BadInputLeavesEveryByte) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  WeightStore store = make_store();
  uint64_t version = 0;
  const Weights a = random_weights(rng);
  ASSERT_TRUE(apply(store, version, pack(a, false)));
  const Model before = live(store);
  Weights b = random_weights(rng);
  auto refused = [&](const Buffer& buf, const std::string& needle) {
    const Status s = apply(store, version, buf);
    ASSERT_FALSE(s);
    EXPECT_NE(s.error().message.find(needle), std::string::npos) << s.error().message;
    EXPECT_EQ(version, 1u);
    EXPECT_TRUE(live(store) == before);
    EXPECT_TRUE(store.servable());
  };
  Weights nan = b;
  nan.bf16[kSpecs[3].name][777] = 0x7FC0;  // a bf16 NaN in the FP8-B128 source
  refused(pack(nan, false), kSpecs[3].name);
  Weights bad_byte = b;
  bad_byte.planes[kSpecs[0].name].values[300] = 0xFF;  // an E4M3 NaN in the MXFP8 planes
  Buffer planes = pack(bad_byte, true);
  planes.manifest.tensors[0].checksum.reset();
  refused(planes, kSpecs[0].name + " values: entry 300");
  Buffer wrong = pack(b, true);
  *wrong.manifest.tensors[1].checksum ^= 1;
  refused(wrong, "W-06");
  Buffer short_buf = pack(b, false);
  short_buf.manifest.tensors.pop_back();
  refused(short_buf, "W-07");
}

TEST(TensorUpdate, DeviceCheckEqualsTheHostTwin) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto mem = cuda_weight_memory();
  ASSERT_TRUE(mem);
  const std::vector<std::pair<NewBytePolicy, int>> policies = {
      {NewBytePolicy::kE4M3, 1}, {NewBytePolicy::kE8M0, 1}, {NewBytePolicy::kF32Scale, 4},
      {NewBytePolicy::kBF16, 2}, {NewBytePolicy::kF16, 2},  {NewBytePolicy::kF32, 4}};
  for (int round = 0; round < 40; ++round) {
    // planes of a few policies, valid bytes, some with one bad entry; at offsets 0 or 4 in the buffer
    std::vector<uint8_t> host;
    std::vector<std::pair<size_t, size_t>> spans;
    std::vector<std::pair<NewBytePolicy, int>> kinds;
    for (int j = 0; j < 5; ++j) {
      const auto [policy, eb] = policies[rng() % policies.size()];
      const size_t entries = 1 + rng() % 5000, at = (host.size() + 15) / 16 * 16 + (rng() % 2) * 4;
      host.resize(at + entries * static_cast<size_t>(eb));
      for (size_t e = 0; e < entries; ++e) {
        uint8_t* p = host.data() + at + e * static_cast<size_t>(eb);
        const float f = 0.5f + static_cast<float>(rng() % 1000) / 1000.0f;
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        if (eb == 4) std::memcpy(p, &bits, 4);
        if (eb == 2) p[0] = 0x00, p[1] = 0x3C;  // 1.0 (f16), 2^-7 (bf16 0x3C00)
        if (eb == 1) p[0] = static_cast<uint8_t>(rng() % 0x7F);
        if (rng() % 3000 == 0) {  // a bad entry
          if (eb == 1) p[0] = policy == NewBytePolicy::kE8M0 ? 0xFF : 0x7F;
          if (eb == 2) p[1] = 0x7F, p[0] = 0xF0;
          if (eb == 4) p[3] = 0x7F, p[2] = 0xC0;
        }
      }
      spans.emplace_back(at, entries * static_cast<size_t>(eb));
      kinds.emplace_back(policy, eb);
    }
    auto dev = test::upload(host);
    ASSERT_TRUE(dev);
    std::vector<PlaneCheckJob> on_host, on_device;
    for (size_t j = 0; j < spans.size(); ++j) {
      on_host.push_back({{host.data() + spans[j].first, spans[j].second}, kinds[j].second, kinds[j].first});
      on_device.push_back(
          {{dev->as<uint8_t>() + spans[j].first, spans[j].second}, kinds[j].second, kinds[j].first});
    }
    auto want = (*mem)->WeightMemory::check_planes(on_host);
    auto got = (*mem)->check_planes(on_device);
    ASSERT_TRUE(want && got) << (got ? "" : got.error().message);
    ASSERT_EQ(want->has_value(), got->has_value()) << "round " << round;
    if (*want) {
      EXPECT_EQ((*want)->job, (*got)->job) << "round " << round;
      EXPECT_EQ((*want)->position, (*got)->position) << "round " << round;
    }
  }
}

}  // namespace
}  // namespace mxq::cuda
