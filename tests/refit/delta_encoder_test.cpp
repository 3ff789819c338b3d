// Trainer-side encoder: changed-entry detection against a plain per-entry loop, delta application by a plain
// scatter reproducing the new planes and their XXH3-64, anchor choice, and the cross-language golden: the C++
// writer must produce the body bytes the Python client wrote, and read the file it compressed.
#include "refit/delta_encoder.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <fstream>
#include <iterator>
#include <random>

#include "../format/golden_npy.h"
#include "model/weight_store.h"

namespace mxq::refit {
namespace {

struct DiffCase {
  std::string name;
  int width;
  size_t bytes;
  double p;
};
void PrintTo(const DiffCase& c, std::ostream* os) { *os << c.name; }

class ChangedEntries : public ::testing::TestWithParam<DiffCase> {};

TEST_P(ChangedEntries, MatchPerEntryCompare) {
  const DiffCase& c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.bytes));
  std::vector<uint8_t> a(c.bytes), b;
  for (auto& x : a) x = static_cast<uint8_t>(rng());
  b = a;
  std::bernoulli_distribution flip(c.p);
  for (auto& x : b)
    if (flip(rng)) x ^= static_cast<uint8_t>(1 + rng() % 255);
  std::vector<int64_t> expect;
  for (size_t e = 0; e < c.bytes / c.width; ++e)
    for (int k = 0; k < c.width; ++k)
      if (a[e * c.width + k] != b[e * c.width + k]) {
        expect.push_back(static_cast<int64_t>(e));
        break;
      }
  EXPECT_EQ(changed_entries(a, b, c.width), expect);
}

INSTANTIATE_TEST_SUITE_P(Planes, ChangedEntries,
                         ::testing::Values(DiffCase{"w1_tail", 1, 1003, 0.01},
                                           DiffCase{"w1_dense", 1, 4096, 0.5},
                                           DiffCase{"w2_tail", 2, 1002, 0.02},
                                           DiffCase{"w4_tail", 4, 1004, 0.05},
                                           DiffCase{"w4_none", 4, 64, 0.0}, DiffCase{"w1_short", 1, 5, 1.0}),
                         [](const auto& info) { return info.param.name; });

// Applies a record to old planes by a plain scatter (what the applier does through a layout).
void scatter(const PlaneDelta& p, int w, std::vector<uint8_t>& plane) {
  for (size_t k = 0; k < p.indices.size(); ++k)
    for (int j = 0; j < w; ++j) plane[static_cast<size_t>(p.indices[k] * w + j)] = p.bytes[k * w + j];
}

TEST(DiffTensor, SparseRecordReproducesNewPlanesAndChecksum) {
  std::mt19937 rng(7);
  std::vector<uint8_t> ov(128 * 256), os(128 * 8);
  for (auto& x : ov) x = static_cast<uint8_t>(rng() % 0x7F);
  for (auto& x : os) x = static_cast<uint8_t>(100 + rng() % 30);
  auto nv = ov, ns = os;
  for (int i = 0; i < 300; ++i) nv[rng() % nv.size()] = static_cast<uint8_t>(rng() % 0x7F);
  ns[17] = 0;  // a 2^-127 scale is a legal change
  CanonicalPlanes o{ov, os}, n{nv, ns};
  auto t = diff_tensor("w", Format::kMXFP8, {128, 256}, &o, n);
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_FALSE(t->anchor);
  auto file = write_delta(Delta{1, 2, {*t}});
  ASSERT_TRUE(file) << file.error().message;
  auto back = read_delta(*file);
  ASSERT_TRUE(back) << back.error().message;
  auto v = ov, s = os;
  scatter(back->tensors[0].values, 1, v);
  scatter(back->tensors[0].scales, 1, s);
  EXPECT_EQ(v, nv);
  EXPECT_EQ(s, ns);
  std::vector<uint8_t> both(nv);
  both.insert(both.end(), ns.begin(), ns.end());
  EXPECT_EQ(back->tensors[0].checksum, XXH3_64bits(both.data(), both.size()));
}

TEST(DiffTensor, AnchorWhenNewForcedOrNoSmaller) {
  std::vector<uint8_t> ov(64, 1), nv(64, 2);
  CanonicalPlanes o{ov, {}}, n{nv, {}};
  auto all_changed = diff_tensor("w", Format::kBF16, {32}, &o, n);
  ASSERT_TRUE(all_changed);
  EXPECT_TRUE(all_changed->anchor);  // 17 + 4 + 64 bytes sparse vs 64 full
  EXPECT_TRUE(diff_tensor("w", Format::kBF16, {32}, nullptr, n)->anchor);
  EXPECT_TRUE(diff_tensor("w", Format::kBF16, {32}, &o, o, true)->anchor);
  auto same = diff_tensor("w", Format::kBF16, {32}, &o, o);
  EXPECT_FALSE(same->anchor);
  EXPECT_TRUE(same->values.indices.empty());
  auto wrong = diff_tensor("w", Format::kBF16, {33}, &o, n);  // covers W-08 on the trainer side
  ASSERT_FALSE(wrong);
  EXPECT_NE(wrong.error().message.find("expected 66 + 0"), std::string::npos) << wrong.error().message;
}

// ---- cross-language golden (tests/golden/make_refit_golden.py)
// ------------------------------------------------
struct GoldenTensor {
  std::string name;
  Format format;
  std::vector<int64_t> shape;
};
const GoldenTensor kGolden[] = {
    {"layers.0.mlp.up_proj.weight", Format::kMXFP8, {64, 128}},
    {"layers.0.mlp.down_proj.weight", Format::kMXFP4, {32, 64}},
    {"layers.0.self_attn.q_proj.weight", Format::kFP8_B128, {130, 260}},
    {"layers.0.input_layernorm.weight", Format::kBF16, {300}},
    {"lm_head.weight", Format::kF32, {8, 8}},
    {"layers.0.mlp.experts.gate_up_proj", Format::kMXFP8, {2, 16, 64}},
};

std::vector<uint8_t> read_golden(const std::string& name) {
  std::ifstream f(std::string(MXQ_SOURCE_DIR) + "/tests/golden/refit/" + name, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(GoldenDelta, CppWriterMatchesPythonClientBytes) {
  Delta d{7, 8, {}};
  for (size_t i = 0; i < std::size(kGolden); ++i) {
    const auto& g = kGolden[i];
    auto planes = [&](const char* which) {
      return std::array{testing::load_npy(fmt::format("../refit/t{}_{}_values", i, which)).data,
                        testing::load_npy(fmt::format("../refit/t{}_{}_scales", i, which)).data};
    };
    auto ol = planes("old"), nw = planes("new");
    CanonicalPlanes o{ol[0], ol[1]}, n{nw[0], nw[1]};
    auto t = diff_tensor(g.name, g.format, g.shape, &o, n);
    ASSERT_TRUE(t) << t.error().message;
    d.tensors.push_back(std::move(*t));
  }
  auto body = encode_delta_body(d);
  ASSERT_TRUE(body) << body.error().message;
  const auto golden_body = read_golden("delta_body.bin");
  ASSERT_FALSE(golden_body.empty()) << "run tests/golden/make_refit_golden.py";
  EXPECT_EQ(*body, golden_body);
  // The Python client compressed with its own zstd build; the C++ reader must take that file as is.
  auto from_python = read_delta(read_golden("delta.mxqd"));
  ASSERT_TRUE(from_python) << from_python.error().message;
  EXPECT_EQ(*encode_delta_body(*from_python), golden_body);
}

// XXH3-64 (seed 0, values then scales, one stream) against the xxhash PyPI package on random planes.
TEST(GoldenDelta, ChecksumMatchesPythonXxhash) {
  const auto blob = testing::load_npy("../refit/checksum_blob").data;
  const auto sizes = testing::load_npy("../refit/checksum_sizes").as<int64_t>();
  const auto sums = testing::load_npy("../refit/checksum_xxh3").as<uint64_t>();
  ASSERT_EQ(sizes.size(), 2 * sums.size());
  size_t at = 0;
  for (size_t i = 0; i < sums.size(); ++i) {
    const auto a = static_cast<size_t>(sizes[2 * i]), b = static_cast<size_t>(sizes[2 * i + 1]);
    std::vector<uint8_t> values(blob.begin() + at, blob.begin() + at + a),
        scales(blob.begin() + at + a, blob.begin() + at + a + b);
    EXPECT_EQ(canonical_checksum(values, scales), sums[i]) << a << " + " << b << " bytes";
    at += a + b;
  }
}

}  // namespace
}  // namespace mxq::refit
