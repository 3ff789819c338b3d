// The grouped expert linear (cuda/linear/moe_grouped_linear.h) against its CPU twin
// (cpu/moe_grouped_linear.h) on fresh random canonical planes of a stacked [E · parts, n, k] tensor in
// linear_prepare's native layout and a fresh routing (cpu/moe_route on random router logits, some experts
// biased so their groups fill every token: per-expert counts from 0 to T, past the 8- and 16-row chunks),
// outputs poisoned first: every entry's row within the format's NMSE tolerance, rows past the entries
// untouched; ragged n, K with and without a tail group, 1 or 2 parts, x gathered through sorted_rows or in
// entry order, device token count below capacity, none routed. The quantized formats also equal the dense
// GEMV (gemv_mx.h, gemv_fp8_b128.h) run per expert on the same rows in the grouped launch's chunks, bit for
// bit: one tile body serves both.
#include "cuda/linear/moe_grouped_linear.h"

#include <array>
#include <cstring>

#include "../op_test_util.h"
#include "cpu/moe_grouped_linear.h"
#include "cpu/moe_route.h"
#include "cuda/linear/gemv_fp8_b128.h"
#include "cuda/linear/gemv_grouped_launch.h"
#include "cuda/linear/gemv_mx.h"
#include "cuda/ops/moe_route.h"
#include "layout/probe.h"

namespace mxq::cuda {
namespace {

struct GroupedCase {
  Format format;
  int experts, top_k, tokens, capacity, n, k, parts;
  bool gather;
  int hot;  // experts biased to take every token (counts = tokens)
};
void PrintTo(const GroupedCase& c, std::ostream* os) {
  *os << traits(c.format).name << " E=" << c.experts << " k=" << c.top_k << " T=" << c.tokens << "/"
      << c.capacity << " [" << c.n << ", " << c.k << "] x" << c.parts << (c.gather ? " gather" : " in order")
      << " hot=" << c.hot;
}

// Random canonical planes for `mats` stacked [n, k] matrices: non-NaN codes, scales keeping products normal;
// bf16 weights N(0, 1).
HostPlanes random_planes(std::mt19937_64& rng, Format f, int64_t mats, int64_t n, int64_t k) {
  HostPlanes p;
  if (f == Format::kBF16) {
    const auto w = test::normal_bf16(rng, static_cast<size_t>(mats * n * k));
    p.values.resize(w.size() * 2);
    std::memcpy(p.values.data(), w.data(), p.values.size());
    return p;
  }
  // note: the other formats' planes are op_test_util.h's (its default scale ranges)
  return test::random_planes(rng, f, mats * values_bytes(f, n, k), mats * scales_bytes(f, n, k));
}

class MoeGroupedLinear : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(MoeGroupedLinear, MatchesCpuTwin) {
  const GroupedCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto arch = device_arch(0);
  ASSERT_TRUE(arch) << arch.error().message;
  const int64_t E = c.experts, K = c.top_k, P = c.parts, n = c.n, k = c.k, mats = E * P;

  // routing: random logits, `hot` experts lifted above the rest for every token
  std::vector<float> logits(static_cast<size_t>(c.capacity) * E);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int t = 0; t < c.capacity; ++t)
    for (int64_t e = 0; e < E; ++e) logits[t * E + e] = nd(rng) + (e < c.hot ? 20.0f : 0.0f);
  const size_t cap = static_cast<size_t>(c.capacity) * K;
  std::vector<int32_t> ids(cap), counts(E), offsets(E + 1), sorted(cap, -1), row_of(cap), active(E);
  std::vector<float> rw(cap);
  ASSERT_TRUE(moe_route(logits.data(), c.tokens, E, K, true, ids.data(), rw.data(), counts.data(),
                        offsets.data(), sorted.data(), row_of.data(), active.data()));
  const int32_t entries = offsets[E];
  if (c.hot > 0) ASSERT_EQ(counts[0], c.tokens);

  // weights: a stacked [E · P, n, k] tensor in the native layout, viewed per matrix
  const std::vector<int64_t> shape = {mats, n, k};
  auto g = tensor_geometry("experts", c.format, shape);
  ASSERT_TRUE(g) << g.error().message;
  const HostPlanes canonical = random_planes(rng, c.format, mats, n, k);
  auto native = linear_prepare(c.format, *arch, *g, canonical);
  ASSERT_TRUE(native) << native.error().message;
  auto dv = test::must(test::upload(native->values));
  auto ds = test::must(test::upload(native->scales));
  std::vector<LinearWeights> views;
  std::vector<WeightView> cpu_views;
  const size_t vb = static_cast<size_t>(c.format == Format::kBF16 ? n * k * 2 : values_bytes(c.format, n, k)),
               sb = c.format == Format::kBF16 ? 0 : static_cast<size_t>(scales_bytes(c.format, n, k));
  for (int64_t i = 0; i < mats; ++i) {
    auto v =
        linear_weights("experts", c.format, shape, {dv.as<uint8_t>(), native->values.size()},
                       {c.format == Format::kBF16 ? nullptr : ds.as<uint8_t>(), native->scales.size()}, i);
    ASSERT_TRUE(v) << v.error().message;
    views.push_back(*v);
    cpu_views.push_back(WeightView{c.format, n, k, canonical.values.data() + i * vb,
                                   sb ? canonical.scales.data() + i * sb : nullptr});
  }
  auto w = MoeGroupedWeights::create("experts", views, P);
  ASSERT_TRUE(w) << w.error().message;

  // x: the tokens' input (gather) or rows in entry order
  const size_t x_rows = c.gather ? static_cast<size_t>(c.capacity) : cap;
  const auto x = test::normal_bf16(rng, x_rows * static_cast<size_t>(k));
  const auto xf = test::to_f32(x);
  std::vector<float> ref(static_cast<size_t>(P) * cap * n, 0.0f);
  ASSERT_TRUE(mxq::moe_grouped_linear("experts", cpu_views, P, offsets.data(),
                                      c.gather ? sorted.data() : nullptr, K, xf.data(), ref.data(),
                                      static_cast<int64_t>(cap) * n));

  auto dx = test::must(test::upload(x));
  auto doff = test::must(test::upload(offsets));
  auto dact = test::must(test::upload(active));
  auto dsorted = test::must(test::upload(sorted));
  auto dy = test::must(test::poisoned<uint16_t>(static_cast<size_t>(P) * cap * n));
  const MoeGroups groups{doff.as<int32_t>(), dact.as<int32_t>(), dsorted.as<int32_t>(), K,
                         static_cast<int64_t>(cap)};
  const Status st = moe_grouped_linear(*w, groups, c.gather, dx.as<uint16_t>(), dy.as<uint16_t>(), nullptr);
  ASSERT_TRUE(st) << st.error().message;
  const auto got = test::must(test::download<uint16_t>(dy, static_cast<size_t>(P) * cap * n));

  for (int64_t q = 0; q < P; ++q) {
    const size_t base = static_cast<size_t>(q) * cap * n, used = static_cast<size_t>(entries) * n;
    std::vector<float> out(used);
    std::vector<double> want(used);
    for (size_t i = 0; i < used; ++i) out[i] = bf16_to_f32(got[base + i]), want[i] = ref[base + i];
    if (used > 0)
      EXPECT_LE(test::nmse(out, want), traits(c.format).nmse_tolerance)
          << "part " << q << " (NaN: an entry row left unwritten)";
    for (size_t i = used; i < cap * n; ++i)
      ASSERT_EQ(got[base + i], 0xFFFF) << "part " << q << ": row " << i / n << " past the entries written";
  }

  // the dense GEMV per expert on the same rows, in the grouped launch's chunks: bitwise
  if (c.format == Format::kBF16) return;
  const int32_t chunk = 8 * gemv_grouped_max_ntiles(c.capacity);
  for (int64_t e = 0; e < E; ++e)
    for (int32_t c0 = offsets[e]; c0 < offsets[e + 1]; c0 += chunk) {
      const int32_t m = std::min(chunk, offsets[e + 1] - c0);
      std::vector<uint16_t> xs(static_cast<size_t>(m) * k);
      for (int32_t i = 0; i < m; ++i) {
        const int64_t r = c.gather ? sorted[c0 + i] / K : c0 + i;
        std::copy_n(x.begin() + r * k, k, xs.begin() + static_cast<int64_t>(i) * k);
      }
      auto dxs = test::must(test::upload(xs));
      for (int64_t q = 0; q < P; ++q) {
        const LinearWeights& lw = views[e * P + q];
        auto dys = test::must(test::poisoned<uint16_t>(static_cast<size_t>(m) * n));
        Status ds2 =
            c.format == Format::kFP8_B128
                ? gemv_fp8_b128(dxs.as<uint16_t>(), m,
                                Fp8B128Weights{lw.values, reinterpret_cast<const float*>(lw.scales), n, k},
                                dys.as<uint16_t>(), nullptr)
            : c.format == Format::kMXFP8
                ? gemv_mxfp8(dxs.as<uint16_t>(), m, MxGemvWeights{c.format, lw.values, lw.scales, n, k},
                             dys.as<uint16_t>(), nullptr)
                : gemv_mxfp4(dxs.as<uint16_t>(), m, MxGemvWeights{c.format, lw.values, lw.scales, n, k},
                             dys.as<uint16_t>(), nullptr);
        ASSERT_TRUE(ds2) << ds2.error().message;
        const auto dense = test::must(test::download<uint16_t>(dys, static_cast<size_t>(m) * n));
        for (size_t i = 0; i < dense.size(); ++i)
          ASSERT_EQ(got[static_cast<size_t>(q) * cap * n + static_cast<size_t>(c0) * n + i], dense[i])
              << "expert " << e << " part " << q << " entry " << c0 + static_cast<int64_t>(i) / n << " col "
              << i % n;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MoeGroupedLinear,
                         ::testing::Values(
                             // format, E, top_k, tokens, capacity, n, k, parts, gather, hot
                             GroupedCase{Format::kMXFP8, 8, 2, 1, 1, 256, 256, 1, true, 0},
                             GroupedCase{Format::kMXFP8, 16, 4, 13, 16, 200, 96, 2, true, 1},
                             GroupedCase{Format::kMXFP8, 8, 2, 70, 80, 64, 128, 1, false, 2},
                             GroupedCase{Format::kMXFP8, 128, 8, 32, 32, 96, 128, 1, true, 0},
                             GroupedCase{Format::kMXFP8, 8, 2, 0, 4, 64, 64, 1, true, 0},
                             GroupedCase{Format::kMXFP4, 16, 4, 9, 32, 136, 160, 1, true, 0},
                             GroupedCase{Format::kMXFP4, 8, 8, 40, 40, 48, 256, 2, true, 0},
                             GroupedCase{Format::kMXFP4, 32, 4, 21, 24, 130, 384, 1, false, 1},
                             GroupedCase{Format::kFP8_B128, 16, 2, 5, 8, 300, 272, 1, true, 0},
                             GroupedCase{Format::kFP8_B128, 8, 4, 33, 40, 128, 128, 2, false, 1},
                             GroupedCase{Format::kFP8_B128, 8, 3, 20, 20, 160, 208, 1, true, 3},
                             GroupedCase{Format::kBF16, 8, 2, 3, 4, 256, 256, 1, true, 0},
                             GroupedCase{Format::kBF16, 16, 4, 37, 40, 72, 136, 2, false, 1},
                             GroupedCase{Format::kBF16, 60, 4, 11, 16, 100, 64, 1, true, 0}));

// moe_route's active-expert list (the grouped linear's slots) against the CPU twin's.
TEST(MoeGroupedLinearRoute, ActiveExpertsMatchCpuTwin) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<std::array<int, 4>> shapes = {
      {128, 8, 1, 1}, {128, 8, 32, 32}, {8, 2, 3, 8}, {64, 4, 0, 4}, {1024, 32, 40, 40}};
  for (const auto& [E, K, T, cap] : shapes) {
    std::vector<float> logits(static_cast<size_t>(cap) * E);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : logits) v = nd(rng);
    const size_t n = static_cast<size_t>(cap) * K;
    std::vector<int32_t> ids(n), counts(E), offsets(E + 1), sorted(n), row_of(n), active(E);
    std::vector<float> w(n);
    ASSERT_TRUE(moe_route(logits.data(), T, E, K, true, ids.data(), w.data(), counts.data(), offsets.data(),
                          sorted.data(), row_of.data(), active.data()));
    auto dl = test::must(test::upload(logits));
    auto dn = test::must(test::upload(std::vector<int32_t>{T}));
    auto gids = test::must(test::poisoned<int32_t>(n));
    auto gw = test::must(test::poisoned<float>(n));
    auto gc = test::must(test::poisoned<int32_t>(E));
    auto go = test::must(test::poisoned<int32_t>(E + 1));
    auto gs = test::must(test::poisoned<int32_t>(n));
    auto gr = test::must(test::poisoned<int32_t>(n));
    auto ga = test::must(test::poisoned<int32_t>(E));
    MoeRouteArgs a{};
    a.logits_f32 = dl.as<float>();
    a.num_tokens = dn.as<int32_t>();
    a.ids = gids.as<int32_t>(), a.weights = gw.as<float>(), a.counts = gc.as<int32_t>();
    a.offsets = go.as<int32_t>(), a.sorted_rows = gs.as<int32_t>(), a.row_of = gr.as<int32_t>();
    a.active = ga.as<int32_t>();
    a.max_tokens = cap, a.experts = E, a.top_k = K, a.norm_topk_prob = true;
    ASSERT_EQ(launch_moe_route(a, nullptr), cudaSuccess);
    EXPECT_EQ(test::must(test::download<int32_t>(ga, E)), active) << "E=" << E << " T=" << T;
    EXPECT_EQ(test::must(test::download<int32_t>(go, E + 1)), offsets) << "E=" << E << " T=" << T;
  }
}

TEST(MoeGroupedLinearWeights, RefusesMixedShapesByName) {
  std::vector<LinearWeights> v(4, LinearWeights{Format::kMXFP8, reinterpret_cast<const uint8_t*>(16),
                                                reinterpret_cast<const uint8_t*>(16), 64, 128});
  v[3].k = 96;
  auto w = MoeGroupedWeights::create("model.layers.0.mlp.experts.down_proj", v, 1);
  ASSERT_FALSE(w);
  EXPECT_NE(w.error().message.find("model.layers.0.mlp.experts.down_proj"), std::string::npos);
  EXPECT_NE(w.error().message.find("[64, 96]"), std::string::npos) << w.error().message;
  v[3].k = 128;
  EXPECT_FALSE(MoeGroupedWeights::create("experts", v, 3)) << "4 matrices are not a multiple of 3 parts";
}

}  // namespace
}  // namespace mxq::cuda
