// The CUDA weight memory against its CPU twin (the host memory, layout/layout.cpp, libxxhash), bitwise, on
// fresh random bytes: full-plane writes and reads through identity and separable layouts (runs of 1..16
// bytes, padding, row permutations), sparse scatters with undo capture, the device index check, and the
// device XXH3-64 over values-then-scales for every XXH3 size class, multi-block, ragged tails and
// multi-MB planes.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/weight_memory_cuda.h"
#include "cuda/xxh3_device.cuh"
#include "gpu_test_util.h"

namespace mxq::cuda {
namespace {

using test::fresh_seed;

std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// rows x row_bytes; run > 0: separable with whole runs of `run` bytes shuffled inside each row, rows
// shuffled and `pad` bytes of padding after each; run == 0: identity.
PlaneLayout make_layout(std::mt19937_64& rng, int64_t rows, int64_t row_bytes, int run, int64_t pad) {
  if (run == 0) return {PlaneKind::kIdentity, {rows, row_bytes}, rows * row_bytes, {}, {}};
  PlaneLayout l{PlaneKind::kSeparable, {rows, row_bytes}, rows * (row_bytes + pad), {}, {}};
  std::vector<int64_t> order(static_cast<size_t>(rows));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (int64_t r = 0; r < rows; ++r) l.row_off.push_back(order[static_cast<size_t>(r)] * (row_bytes + pad));
  std::vector<int64_t> runs(static_cast<size_t>(row_bytes / run));
  std::iota(runs.begin(), runs.end(), 0);
  std::shuffle(runs.begin(), runs.end(), rng);
  for (int64_t c = 0; c < row_bytes; ++c) l.col_off.push_back(runs[static_cast<size_t>(c / run)] * run + c % run);
  return l;
}

std::vector<uint8_t> download_span(std::span<const uint8_t> d) {
  std::vector<uint8_t> h(d.size());
  if (!d.empty()) {
    EXPECT_EQ(cudaMemcpy(h.data(), d.data(), d.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return h;
}

struct PlaneSpec {
  int64_t rows, row_bytes;
  int run;  // 0 identity
  int64_t pad;
};
struct MemCase {
  const char* name;
  PlaneSpec values, scales;
};
void PrintTo(const MemCase& c, std::ostream* os) { *os << c.name; }

class CudaWeightMemoryTwin : public ::testing::TestWithParam<MemCase> {};

// Write, read, scatter with undo and checksum on both memories; every byte must agree.
TEST_P(CudaWeightMemoryTwin, MatchesHostBitwise) {
  const MemCase& c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto dev = cuda_weight_memory();
  ASSERT_TRUE(dev) << dev.error().message;
  auto host = host_weight_memory();
  const PlaneLayout layouts[2] = {
      make_layout(rng, c.values.rows, c.values.row_bytes, c.values.run, c.values.pad),
      make_layout(rng, c.scales.rows, c.scales.row_bytes, c.scales.run, c.scales.pad)};
  std::span<uint8_t> hn[2], dn[2];
  std::vector<uint8_t> canon[2];
  for (int p = 0; p < 2; ++p) {
    auto h = host->allocate_plane(layouts[p]);
    auto d = (*dev)->allocate_plane(layouts[p]);
    ASSERT_TRUE(h && d);
    hn[p] = *h, dn[p] = *d;
    canon[p] = random_bytes(rng, static_cast<size_t>(layouts[p].canonical.bytes()));
    ASSERT_TRUE(host->write_plane(layouts[p], canon[p], hn[p]));
    ASSERT_TRUE((*dev)->write_plane(layouts[p], canon[p], dn[p]));  // pageable host source: staged
    ASSERT_TRUE((*dev)->sync());
    EXPECT_EQ(download_span(dn[p]), std::vector<uint8_t>(hn[p].begin(), hn[p].end())) << "write, plane " << p;
    std::vector<uint8_t> back(canon[p].size(), 0xAB);
    ASSERT_TRUE((*dev)->read_plane(layouts[p], dn[p], back));
    EXPECT_EQ(back, canon[p]) << "read, plane " << p;
  }
  uint64_t hsum = 0, dsum = 0;
  ChecksumJob hj{&layouts[0], hn[0], &layouts[1], hn[1], &hsum}, dj{&layouts[0], dn[0], &layouts[1], dn[1], &dsum};
  ASSERT_TRUE(host->checksums({&hj, 1}));
  ASSERT_TRUE((*dev)->checksums({&dj, 1}));
  std::vector<uint8_t> both = canon[0];
  both.insert(both.end(), canon[1].begin(), canon[1].end());
  EXPECT_EQ(hsum, XXH3_64bits(both.data(), both.size()));
  EXPECT_EQ(dsum, hsum) << "device XXH3 of " << both.size() << " bytes";

  // Sparse scatter with undo, entries of 1, 2 and 4 bytes where they tile; device-resident spans.
  for (int eb : {1, 2, 4}) {
    for (int p = 0; p < 2; ++p) {
      const int64_t bytes = layouts[p].canonical.bytes();
      if (bytes == 0 || bytes % eb) continue;
      std::vector<int64_t> idx;
      std::bernoulli_distribution pick(0.1);
      for (int64_t i = 0; i < bytes / eb; ++i)
        if (pick(rng)) idx.push_back(i);
      if (idx.empty()) idx.push_back(bytes / eb - 1);
      const auto vals = random_bytes(rng, idx.size() * static_cast<size_t>(eb));
      std::vector<uint8_t> hundo(vals.size());
      ASSERT_TRUE(host->scatter(layouts[p], idx, eb, vals, hundo, hn[p], "h"));
      auto di = test::upload(idx), dv = test::upload(vals);
      auto du = test::poisoned<uint8_t>(vals.size());
      ASSERT_TRUE(di && dv && du);
      ASSERT_TRUE((*dev)->scatter(layouts[p], {di->as<int64_t>(), idx.size()}, eb,
                                  {dv->as<uint8_t>(), vals.size()}, {du->as<uint8_t>(), vals.size()}, dn[p], "d"));
      ASSERT_TRUE((*dev)->sync());
      EXPECT_EQ(download_span({du->as<uint8_t>(), vals.size()}), hundo) << "undo, entry " << eb;
      EXPECT_EQ(download_span(dn[p]), std::vector<uint8_t>(hn[p].begin(), hn[p].end())) << "scatter " << eb;
    }
  }
  ASSERT_TRUE(host->checksums({&hj, 1}));
  ASSERT_TRUE((*dev)->checksums({&dj, 1}));
  EXPECT_EQ(dsum, hsum) << "after scatter";
  for (int p = 0; p < 2; ++p) host->free_plane(hn[p]), (*dev)->free_plane(dn[p]);
}

// Sizes cover XXH3's classes over values + scales: 0, 1-3, 4-8, 9-16, 17-128, 129-240, 241+ (one partial
// block), whole blocks, ragged tails, the values/scales seam inside a word and a block, and multi-MB planes.
INSTANTIATE_TEST_SUITE_P(
    Sizes, CudaWeightMemoryTwin,
    ::testing::Values(MemCase{"empty", {0, 0, 0, 0}, {0, 0, 0, 0}}, MemCase{"b1", {1, 1, 0, 0}, {0, 0, 0, 0}},
                      MemCase{"b3", {1, 2, 0, 0}, {1, 1, 0, 0}}, MemCase{"b7", {1, 4, 1, 0}, {1, 3, 0, 0}},
                      MemCase{"b8", {2, 4, 2, 1}, {0, 0, 0, 0}}, MemCase{"b13", {3, 3, 1, 2}, {1, 4, 0, 0}},
                      MemCase{"b16", {2, 8, 8, 0}, {0, 0, 0, 0}}, MemCase{"b17", {4, 4, 4, 3}, {1, 1, 0, 0}},
                      MemCase{"b100", {5, 16, 4, 0}, {4, 5, 1, 1}}, MemCase{"b128", {4, 32, 16, 16}, {0, 0, 0, 0}},
                      MemCase{"b129", {4, 32, 2, 0}, {1, 1, 0, 0}}, MemCase{"b200", {6, 32, 4, 4}, {1, 8, 0, 0}},
                      MemCase{"b240", {7, 32, 8, 0}, {2, 8, 0, 0}}, MemCase{"b241", {7, 32, 4, 0}, {1, 17, 1, 0}},
                      MemCase{"b1000", {10, 96, 4, 0}, {1, 40, 0, 0}}, MemCase{"b1024", {16, 64, 4, 0}, {0, 0, 0, 0}},
                      MemCase{"b1025", {16, 64, 4, 0}, {1, 1, 0, 0}}, MemCase{"b2049", {32, 64, 16, 0}, {1, 1, 1, 0}},
                      MemCase{"seam_in_word", {37, 99, 1, 5}, {13, 7, 1, 0}},
                      MemCase{"gemv_like_4k", {64, 4096, 4, 0}, {64, 128, 0, 0}},
                      MemCase{"ragged_tail", {31, 1000, 8, 24}, {31, 31, 1, 1}},
                      MemCase{"identity_3mb", {1, (3 << 20) + 17, 0, 0}, {1, 4097, 0, 0}},
                      MemCase{"separable_8mb", {2048, 4096, 4, 0}, {2048, 128, 0, 0}},
                      MemCase{"transposed_run1", {300, 200, 1, 0}, {300, 7, 1, 3}}),
    [](const auto& info) { return std::string(info.param.name); });

// Many tensors hashed in one batch (the applier's path): each equals libxxhash.
TEST(CudaWeightMemory, ChecksumBatchOfManyTensors) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto dev = cuda_weight_memory();
  ASSERT_TRUE(dev);
  std::vector<PlaneLayout> layouts;
  layouts.reserve(80);
  std::vector<std::vector<uint8_t>> canon;
  std::vector<std::span<uint8_t>> live;
  for (int k = 0; k < 40; ++k) {
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 64), width = 4 * (1 + static_cast<int64_t>(rng() % 300));
    layouts.push_back(make_layout(rng, rows, width, k % 3 == 0 ? 0 : 4, k % 2));
    layouts.push_back(make_layout(rng, rows, 1 + static_cast<int64_t>(rng() % 9), 0, 0));
  }
  for (const PlaneLayout& l : layouts) {
    auto d = (*dev)->allocate_plane(l);
    ASSERT_TRUE(d);
    live.push_back(*d);
    canon.push_back(random_bytes(rng, static_cast<size_t>(l.canonical.bytes())));
    ASSERT_TRUE((*dev)->write_plane(l, canon.back(), live.back()));
  }
  std::vector<uint64_t> sums(40);
  std::vector<ChecksumJob> jobs;
  for (size_t k = 0; k < 40; ++k)
    jobs.push_back({&layouts[2 * k], live[2 * k], &layouts[2 * k + 1], live[2 * k + 1], &sums[k]});
  ASSERT_TRUE((*dev)->checksums(jobs));
  for (size_t k = 0; k < 40; ++k) {
    std::vector<uint8_t> both = canon[2 * k];
    both.insert(both.end(), canon[2 * k + 1].begin(), canon[2 * k + 1].end());
    EXPECT_EQ(sums[k], XXH3_64bits(both.data(), both.size())) << "tensor " << k << ", " << both.size() << " bytes";
  }
}

// Device-resident indices out of order or out of range: nothing written, the refusal names the call.
TEST(CudaWeightMemory, DeviceIndexCheckRefusesBeforeWriting) {
  std::mt19937_64 rng(fresh_seed());
  auto dev = cuda_weight_memory();
  ASSERT_TRUE(dev);
  const PlaneLayout l = make_layout(rng, 8, 64, 4, 0);
  auto live = (*dev)->allocate_plane(l);
  ASSERT_TRUE(live);
  const auto canon = random_bytes(rng, 512);
  ASSERT_TRUE((*dev)->write_plane(l, canon, *live));
  for (const std::vector<int64_t>& bad : {std::vector<int64_t>{3, 9, 9, 20}, std::vector<int64_t>{1, 2, 512},
                                          std::vector<int64_t>{-1, 4}}) {
    auto di = test::upload(bad);
    auto dv = test::upload(random_bytes(rng, bad.size()));
    ASSERT_TRUE(di && dv);
    ASSERT_TRUE((*dev)->scatter(l, {di->as<int64_t>(), bad.size()}, 1, {dv->as<uint8_t>(), bad.size()}, {}, *live,
                                "w values"));
    auto s = (*dev)->sync();
    ASSERT_FALSE(s);
    EXPECT_NE(s.error().message.find("w values"), std::string::npos) << s.error().message;
    std::vector<uint8_t> back(512);
    ASSERT_TRUE((*dev)->read_plane(l, *live, back));
    EXPECT_EQ(back, canon);
  }
  EXPECT_TRUE((*dev)->sync()) << "the status word is reset after a report";
}

// The host reference of the split long path equals libxxhash (what the device kernels implement).
TEST(Xxh3Split, HostReferenceEqualsLibxxhash) {
  std::mt19937_64 rng(fresh_seed());
  for (uint64_t len : {241ull, 1024ull, 1025ull, 2048ull, 4097ull, 65536ull + 63}) {
    const auto b = random_bytes(rng, len);
    EXPECT_EQ(xxh3::hash_long_reference(b.data(), len), XXH3_64bits(b.data(), len)) << len;
  }
  for (uint64_t len = 0; len <= 240; ++len) {
    const auto b = random_bytes(rng, len);
    EXPECT_EQ(xxh3::hash_short(b.data(), len), XXH3_64bits(b.data(), len)) << len;
  }
}

}  // namespace
}  // namespace mxq::cuda
