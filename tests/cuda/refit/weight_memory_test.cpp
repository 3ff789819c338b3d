// The CUDA weight memory against its CPU twin (the host memory, layout/layout.cpp, libxxhash), bitwise, on
// fresh random bytes: full-plane writes and reads through identity and separable layouts (runs of 1..16
// bytes, padding, row permutations), sparse scatters with undo capture, the device index check, and the
// device XXH3-64 over values-then-scales for every XXH3 size class, multi-block, ragged tails and
// multi-MB planes.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <numeric>
#include <random>
#include <vector>

#include "../gpu_test_util.h"
#include "cuda/linear/gemv_layout.h"
#include "cuda/refit/xxh3_device.cuh"
#include "model/weight_memory_cuda.h"

namespace mxq::cuda {
namespace {

using test::fresh_seed;

// A tensor's two plane layouts.
struct Spec {
  PlaneLayout values, scales;
};

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
  for (int64_t c = 0; c < row_bytes; ++c)
    l.col_off.push_back(runs[static_cast<size_t>(c / run)] * run + c % run);
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
  ChecksumJob hj{&layouts[0], hn[0], &layouts[1], hn[1], &hsum},
      dj{&layouts[0], dn[0], &layouts[1], dn[1], &dsum};
  ASSERT_TRUE(host->checksums({&hj, 1}));
  ASSERT_TRUE((*dev)->checksums({&dj, 1}));
  std::vector<uint8_t> both = canon[0];
  both.insert(both.end(), canon[1].begin(), canon[1].end());
  EXPECT_EQ(hsum, XXH3_64bits(both.data(), both.size()));
  EXPECT_EQ(dsum, hsum) << "device XXH3 of " << both.size() << " bytes";

  // Sparse scatter with undo, entries of 1, 2 and 4 bytes where they tile, int64 and int32 indices;
  // device-resident spans.
  for (auto [eb, width] : {std::pair{1, 8}, {1, 4}, {2, 8}, {2, 4}, {4, 8}, {4, 4}}) {
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
      if (width == 8) {
        ASSERT_TRUE((*dev)->scatter(layouts[p], {di->as<int64_t>(), idx.size()}, eb,
                                    {dv->as<uint8_t>(), vals.size()}, {du->as<uint8_t>(), vals.size()}, dn[p],
                                    "d"));
      } else {
        const std::vector<int32_t> idx32(idx.begin(), idx.end());
        auto di32 = test::upload(idx32);
        ASSERT_TRUE(di32);
        ASSERT_TRUE((*dev)->scatter32(layouts[p], {di32->as<int32_t>(), idx.size()}, eb,
                                      {dv->as<uint8_t>(), vals.size()}, {du->as<uint8_t>(), vals.size()},
                                      dn[p], "d"));
        ASSERT_TRUE((*dev)->sync());
      }
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
    ::testing::Values(
        MemCase{"empty", {0, 0, 0, 0}, {0, 0, 0, 0}}, MemCase{"b1", {1, 1, 0, 0}, {0, 0, 0, 0}},
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
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 64),
                  width = 4 * (1 + static_cast<int64_t>(rng() % 300));
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
    EXPECT_EQ(sums[k], XXH3_64bits(both.data(), both.size()))
        << "tensor " << k << ", " << both.size() << " bytes";
  }
}

// The GEMV native layout of MXFP8 values [rows, k] (as mxq-bench refit builds it from gemv_native_elem).
PlaneLayout gemv_values_layout(int64_t rows, int64_t k) {
  PlaneLayout l{PlaneKind::kSeparable, {rows, k}, rows * k, {}, {}};
  for (int64_t r = 0; r < rows; ++r) l.row_off.push_back(r * k);
  for (int64_t c = 0; c < k; ++c) l.col_off.push_back(gemv_native_elem(Format::kMXFP8, k, c));
  return l;
}

// Full writes of many tensors in one batch (write_tensors: the batched kernel with fused block sums and
// chains, or the plane-by-plane path for what it does not take) against the host memory, bitwise, with the
// checksums against libxxhash; both checksum modes, tiles staged in shared memory or not, the batched
// kernels off (the fallback), device and host sources; then the hash of the live planes (checksums) must
// agree too.
TEST(CudaWeightMemory, WriteTensorsBatchMatchesHost) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<Spec> specs;
  // GEMV (4x4 word transpose) shapes, incl. a K with a partial last group and a multi-batch chain; rows of
  // 64 and 320 bytes (a lane's stripes step across 1 or 2 rows), many tiles with a ragged scales tail
  // (1100 x 128 scale bytes: 2 full tiles, a 9.5 KiB one whose last block is half there).
  for (auto [rows, k] : {std::pair<int64_t, int64_t>{512, 4096},
                         {16, 64},
                         {8, 192},
                         {33, 160},
                         {3, 1024},
                         {16, 320},
                         {1100, 4096}})
    specs.push_back({gemv_values_layout(rows, k), make_layout(rng, rows, k / 32, 0, 0)});
  // The GEMV transpose with its rows in reverse order: transpose4 without rows back to back (the staged
  // write stores such a plane lane by lane instead of whole tiles).
  {
    PlaneLayout l = gemv_values_layout(48, 1024);
    std::reverse(l.row_off.begin(), l.row_off.end());
    specs.push_back({l, make_layout(rng, 48, 32, 0, 0)});
  }
  // Identity planes over several tiles: values 70 KiB (the second tile mostly empty), scales a tail of
  // less than one block.
  specs.push_back({make_layout(rng, 1, 70 * 1024, 0, 0), make_layout(rng, 1, 1008, 0, 0)});
  // note: the specs so far are identity or GEMV transpose4 planes: a batch of only those takes the warp
  // write (refit_write_warp.cu); the separable planes below send a batch to refit_batch.cu.
  const size_t warp_eligible = specs.size();
  // Random separable planes of every run, identity planes, scales of 16-byte multiples or not, padding.
  for (int run : {16, 8, 4, 2, 1, 0})
    for (int64_t rows : {int64_t{7}, int64_t{64}}) {
      const int64_t w = 16 * (1 + static_cast<int64_t>(rng() % 40));
      specs.push_back(
          {make_layout(rng, rows * 64, w, run, 0), make_layout(rng, rows, 16 * (1 + rng() % 3), 0, 0)});
    }
  specs.push_back({make_layout(rng, 64, 256, 4, 0), make_layout(rng, 64, 7, 0, 0)});    // scales % 16 != 0
  specs.push_back({make_layout(rng, 10, 1000, 8, 0), make_layout(rng, 10, 32, 0, 0)});  // values % 1024 != 0
  specs.push_back({make_layout(rng, 64, 256, 4, 16), make_layout(rng, 64, 16, 0, 0)});  // padded native
  specs.push_back({make_layout(rng, 4, 256, 4, 0), make_layout(rng, 0, 0, 0, 0)});      // no scales
  struct Mode {
    bool reread, batched, staged, warp;
  };
  for (auto [reread, batched, staged, warp] : {Mode{false, true, false, false},
                                               {false, true, true, false},
                                               {true, true, false, false},
                                               {false, false, false, false},
                                               {false, true, true, true},
                                               {true, true, true, true}})
    for (size_t n : {specs.size(), warp_eligible})
      for (bool device_src : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << "checksum_from_live " << reread << ", batched " << batched << ", staged " << staged
                     << ", warp " << warp << ", tensors " << n << ", device sources " << device_src);
        CudaMemoryOptions o;
        o.checksum_from_live = reread;
        o.batched_kernels = batched;
        o.staged_full_write = staged;
        o.warp_full_write = warp;
        o.host_stage_bytes = 1 << 20;  // several staging groups
        auto dev = cuda_weight_memory(o);
        ASSERT_TRUE(dev);
        auto host = host_weight_memory();
        std::vector<std::span<uint8_t>> hv(n), hs(n), dv(n), ds(n);
        std::vector<std::vector<uint8_t>> cv(n), cs(n);
        std::vector<DeviceBuffer> src;
        std::vector<TensorWriteJob> jobs(n);
        std::vector<uint64_t> sums(n, 0);
        for (size_t k = 0; k < n; ++k) {
          auto a = host->allocate_plane(specs[k].values), b = host->allocate_plane(specs[k].scales);
          auto c = (*dev)->allocate_plane(specs[k].values), d = (*dev)->allocate_plane(specs[k].scales);
          ASSERT_TRUE(a && b && c && d);
          hv[k] = *a, hs[k] = *b, dv[k] = *c, ds[k] = *d;
          cv[k] = random_bytes(rng, static_cast<size_t>(specs[k].values.canonical.bytes()));
          cs[k] = random_bytes(rng, static_cast<size_t>(specs[k].scales.canonical.bytes()));
          ASSERT_TRUE(host->write_plane(specs[k].values, cv[k], hv[k]));
          ASSERT_TRUE(host->write_plane(specs[k].scales, cs[k], hs[k]));
          std::span<const uint8_t> sv = cv[k], ss = cs[k];
          if (device_src) {
            // note: tensor 1 gets a source off 16-byte alignment (the plane-by-plane path).
            const size_t shift = k == 1 ? 1 : 0;
            auto buf = DeviceBuffer::alloc(cv[k].size() + cs[k].size() + 32);
            ASSERT_TRUE(buf);
            uint8_t* at = buf->as<uint8_t>() + shift;
            const size_t soff = (cv[k].size() + shift + 15) / 16 * 16 - shift;
            if (!cv[k].empty()) {
              ASSERT_EQ(cudaMemcpy(at, cv[k].data(), cv[k].size(), cudaMemcpyHostToDevice), cudaSuccess);
            }
            if (!cs[k].empty()) {
              ASSERT_EQ(cudaMemcpy(at + soff, cs[k].data(), cs[k].size(), cudaMemcpyHostToDevice),
                        cudaSuccess);
            }
            sv = {at, cv[k].size()}, ss = {at + soff, cs[k].size()};
            src.push_back(std::move(*buf));
          }
          jobs[k] = {"t", &specs[k].values, sv, dv[k], &specs[k].scales, ss, ds[k], &sums[k]};
        }
        // Poison the live planes first: every byte must come from this write.
        for (size_t k = 0; k < n; ++k) {
          if (!dv[k].empty()) {
            ASSERT_EQ(cudaMemset(dv[k].data(), 0xA5, dv[k].size()), cudaSuccess);
          }
          if (!ds[k].empty()) {
            ASSERT_EQ(cudaMemset(ds[k].data(), 0xA5, ds[k].size()), cudaSuccess);
          }
        }
        ASSERT_TRUE((*dev)->write_tensors(jobs));
        for (size_t k = 0; k < n; ++k) {
          std::vector<uint8_t> both = cv[k];
          both.insert(both.end(), cs[k].begin(), cs[k].end());
          EXPECT_EQ(sums[k], XXH3_64bits(both.data(), both.size()))
              << "tensor " << k << ", " << both.size() << " bytes";
          EXPECT_EQ(download_span(dv[k]), std::vector<uint8_t>(hv[k].begin(), hv[k].end()))
              << "values of tensor " << k;
          EXPECT_EQ(download_span(ds[k]), std::vector<uint8_t>(hs[k].begin(), hs[k].end()))
              << "scales of tensor " << k;
        }
        std::vector<uint64_t> again(n, 0);
        std::vector<ChecksumJob> cj;
        for (size_t k = 0; k < n; ++k)
          cj.push_back({&specs[k].values, dv[k], &specs[k].scales, ds[k], &again[k]});
        ASSERT_TRUE((*dev)->checksums(cj));
        EXPECT_EQ(again, sums) << "hash of the live planes";
        for (size_t k = 0; k < n; ++k) {
          host->free_plane(hv[k]), host->free_plane(hs[k]);
          (*dev)->free_plane(dv[k]), (*dev)->free_plane(ds[k]);
        }
      }
}

// A full write of a batch of ~1600 tiles (three waves of resident blocks): tiles of unstaged planes
// (separable, GEMV rows apart) between staged ones, chains run while later tensors' tiles stream; bytes
// against the host memory, checksums against libxxhash, four times over the same live planes (the
// counters start again): rounds 1 and 2 from round 0's source buffers with new bytes (the same jobs: the
// memory runs its cached batch again in round 1; in round 2 a checksum batch has taken its scratch first,
// so it builds the batch anew), round 3 from fresh buffers. Then the same with no separable plane by the
// warp write (~26000 warps, refit_write_warp.cu).
class WriteTensorsBatchManyTiles : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(CudaWeightMemory, WriteTensorsBatchManyTiles, ::testing::Bool());
TEST_P(WriteTensorsBatchManyTiles, MatchesHostTwice) {
  const bool warp_only = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << ", warp write only " << warp_only);
  std::mt19937_64 rng(seed);
  std::vector<Spec> specs;
  for (int k = 0; k < 40; ++k) {
    if (k % 9 == 4 && !warp_only) {
      specs.push_back({make_layout(rng, 4096, 256, 4, 0), make_layout(rng, 4096, 8, 0, 0)});
    } else if (k % 13 == 6) {
      PlaneLayout l = gemv_values_layout(256, 4096);
      std::reverse(l.row_off.begin(), l.row_off.end());
      specs.push_back({l, make_layout(rng, 256, 128, 0, 0)});
    } else if (k % 11 == 2) {
      specs.push_back({make_layout(rng, 1, 3 << 20, 0, 0), make_layout(rng, 1, 4096 + 48, 0, 0)});
    } else {
      const int64_t rows = 256 * (1 + static_cast<int64_t>(rng() % 4));
      specs.push_back({gemv_values_layout(rows, 4096), make_layout(rng, rows, 128, 0, 0)});
    }
  }
  CudaMemoryOptions o;
  o.warp_full_write = warp_only;
  auto dev = cuda_weight_memory(o);
  ASSERT_TRUE(dev);
  auto host = host_weight_memory();
  const size_t n = specs.size();
  std::vector<std::span<uint8_t>> hv(n), hs(n), dv(n), ds(n);
  std::vector<DeviceBuffer> src;
  std::vector<TensorWriteJob> jobs(n);
  std::vector<uint64_t> sums(n, 0), want(n, 0);
  for (size_t k = 0; k < n; ++k) {
    auto a = host->allocate_plane(specs[k].values), b = host->allocate_plane(specs[k].scales);
    auto c = (*dev)->allocate_plane(specs[k].values), d = (*dev)->allocate_plane(specs[k].scales);
    ASSERT_TRUE(a && b && c && d);
    hv[k] = *a, hs[k] = *b, dv[k] = *c, ds[k] = *d;
  }
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    const bool reuse = round == 1 || round == 2;
    if (round == 2) {
      std::vector<uint64_t> live(n, 0);
      std::vector<ChecksumJob> cj;
      for (size_t k = 0; k < n; ++k)
        cj.push_back({&specs[k].values, dv[k], &specs[k].scales, ds[k], &live[k]});
      ASSERT_TRUE((*dev)->checksums(cj));
      EXPECT_EQ(live, want) << "hash of round 1's live planes";
    }
    if (!reuse) src.clear();
    for (size_t k = 0; k < n; ++k) {
      std::vector<uint8_t> both = random_bytes(rng, static_cast<size_t>(specs[k].values.canonical.bytes()));
      const size_t vb = both.size();
      std::vector<uint8_t> cs = random_bytes(rng, static_cast<size_t>(specs[k].scales.canonical.bytes()));
      both.insert(both.end(), cs.begin(), cs.end());
      want[k] = XXH3_64bits(both.data(), both.size());
      ASSERT_TRUE(host->write_plane(specs[k].values, {both.data(), vb}, hv[k]));
      ASSERT_TRUE(host->write_plane(specs[k].scales, cs, hs[k]));
      const size_t soff = (vb + 15) / 16 * 16;
      if (!reuse) {
        auto buf = DeviceBuffer::alloc(both.size() + 16);
        ASSERT_TRUE(buf);
        src.push_back(std::move(*buf));
      }
      uint8_t* at = src[k].as<uint8_t>();
      ASSERT_EQ(cudaMemcpy(at, both.data(), vb, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(at + soff, cs.data(), cs.size(), cudaMemcpyHostToDevice), cudaSuccess);
      jobs[k] = {"t",   &specs[k].values, {at, vb}, dv[k], &specs[k].scales, {at + soff, cs.size()},
                 ds[k], &sums[k]};
      ASSERT_EQ(cudaMemset(dv[k].data(), 0xA5, dv[k].size()), cudaSuccess);
      ASSERT_EQ(cudaMemset(ds[k].data(), 0xA5, ds[k].size()), cudaSuccess);
    }
    std::fill(sums.begin(), sums.end(), 0);
    ASSERT_TRUE((*dev)->write_tensors(jobs));
    for (size_t k = 0; k < n; ++k) {
      EXPECT_EQ(sums[k], want[k]) << "tensor " << k;
      EXPECT_TRUE(download_span(dv[k]) == std::vector<uint8_t>(hv[k].begin(), hv[k].end()))
          << "values of tensor " << k;
      EXPECT_TRUE(download_span(ds[k]) == std::vector<uint8_t>(hs[k].begin(), hs[k].end()))
          << "scales of tensor " << k;
    }
  }
  for (size_t k = 0; k < n; ++k) {
    host->free_plane(hv[k]), host->free_plane(hs[k]);
    (*dev)->free_plane(dv[k]), (*dev)->free_plane(ds[k]);
  }
}

// Incremental checksums: after a full write, sparse scatters (int32 and int64 indices, entries of 1, 2, 4
// bytes, sparse to dense) keep each tensor's block sums current; every checksum equals libxxhash of a host
// mirror. A refused scatter changes nothing, one without undo bytes falls back to a full hash, and a live
// byte changed behind the memory's back is NOT seen (the chains run over the kept sums, no re-read).
TEST(CudaWeightMemory, IncrementalChecksumsFollowSparseWrites) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  CudaMemoryOptions o;
  o.incremental_checksums = true;
  auto dev = cuda_weight_memory(o);
  ASSERT_TRUE(dev);
  std::vector<Spec> specs = {
      {gemv_values_layout(64, 1024), make_layout(rng, 64, 32, 0, 0)},
      {make_layout(rng, 128, 256, 4, 0), make_layout(rng, 128, 16, 0, 0)},
      {make_layout(rng, 1, 4096, 0, 0), make_layout(rng, 3, 16, 0, 0)},  // stream tail of 48 bytes
      {make_layout(rng, 96, 64, 2, 0), make_layout(rng, 0, 0, 0, 0)},    // no scales: last block is the tail
      {make_layout(rng, 300, 1024, 8, 0), make_layout(rng, 300, 32, 0, 0)}};
  const size_t n = specs.size();
  std::vector<std::array<std::vector<uint8_t>, 2>> mirror(n);
  std::vector<std::array<std::span<uint8_t>, 2>> live(n);
  std::vector<uint64_t> sums(n);
  std::vector<TensorWriteJob> jobs;
  for (size_t k = 0; k < n; ++k) {
    for (int p = 0; p < 2; ++p) {
      const PlaneLayout& l = p == 0 ? specs[k].values : specs[k].scales;
      auto d = (*dev)->allocate_plane(l);
      ASSERT_TRUE(d);
      live[k][p] = *d;
      mirror[k][p] = random_bytes(rng, static_cast<size_t>(l.canonical.bytes()));
    }
    jobs.push_back({"t", &specs[k].values, mirror[k][0], live[k][0], &specs[k].scales, mirror[k][1],
                    live[k][1], &sums[k]});
  }
  auto expect_all = [&](const char* what) {
    std::vector<uint64_t> got(n, 0);
    std::vector<ChecksumJob> cj;
    for (size_t k = 0; k < n; ++k)
      cj.push_back({&specs[k].values, live[k][0], &specs[k].scales, live[k][1], &got[k]});
    ASSERT_TRUE((*dev)->checksums(cj));
    for (size_t k = 0; k < n; ++k) {
      std::vector<uint8_t> both = mirror[k][0];
      both.insert(both.end(), mirror[k][1].begin(), mirror[k][1].end());
      EXPECT_EQ(got[k], XXH3_64bits(both.data(), both.size())) << what << ", tensor " << k;
    }
  };
  ASSERT_TRUE((*dev)->write_tensors(jobs));
  expect_all("after the full write");
  for (int round = 0; round < 24; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    const size_t k = rng() % n;
    const int p = specs[k].scales.canonical.bytes() == 0 ? 0 : static_cast<int>(rng() % 2);
    const PlaneLayout& l = p == 0 ? specs[k].values : specs[k].scales;
    const int64_t bytes = l.canonical.bytes();
    int eb = 1 << (rng() % 3);
    while (bytes % eb) eb /= 2;
    const double density = std::array<double, 3>{0.002, 0.05, 0.6}[rng() % 3];
    std::vector<int64_t> idx;
    std::bernoulli_distribution pick(density);
    for (int64_t i = 0; i < bytes / eb; ++i)
      if (pick(rng)) idx.push_back(i);
    if (idx.empty()) idx.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(bytes / eb)));
    const auto vals = random_bytes(rng, idx.size() * static_cast<size_t>(eb));
    std::vector<uint8_t> expect_undo(vals.size());
    for (size_t j = 0; j < idx.size(); ++j)
      for (int b = 0; b < eb; ++b) {
        uint8_t& m = mirror[k][p][static_cast<size_t>(idx[j] * eb + b)];
        expect_undo[j * static_cast<size_t>(eb) + static_cast<size_t>(b)] = m;
        m = vals[j * static_cast<size_t>(eb) + static_cast<size_t>(b)];
      }
    auto dv = test::upload(vals);
    auto du = test::poisoned<uint8_t>(vals.size());
    ASSERT_TRUE(dv && du);
    const bool with_undo = round != 7;  // note: one scatter without old bytes: the tensor is re-hashed
    const std::span<uint8_t> undo =
        with_undo ? std::span<uint8_t>{du->as<uint8_t>(), vals.size()} : std::span<uint8_t>{};
    if (round % 2 == 0) {
      auto di = test::upload(idx);
      ASSERT_TRUE(di);
      ASSERT_TRUE((*dev)->scatter(l, {di->as<int64_t>(), idx.size()}, eb, {dv->as<uint8_t>(), vals.size()},
                                  undo, live[k][p], "inc"));
      ASSERT_TRUE((*dev)->sync());
    } else {
      const std::vector<int32_t> idx32(idx.begin(), idx.end());
      auto di = test::upload(idx32);
      ASSERT_TRUE(di);
      ASSERT_TRUE((*dev)->scatter32(l, {di->as<int32_t>(), idx.size()}, eb, {dv->as<uint8_t>(), vals.size()},
                                    undo, live[k][p], "inc"));
      ASSERT_TRUE((*dev)->sync());
    }
    if (with_undo) {
      EXPECT_EQ(download_span({du->as<uint8_t>(), vals.size()}), expect_undo);
    }
    expect_all("after a sparse write");
    if (round == 11) {
      // A refused call (indices out of order) writes nothing and leaves the sums alone.
      const std::vector<int64_t> bad{5, 3};
      auto di = test::upload(bad);
      auto bv = test::upload(random_bytes(rng, 2 * static_cast<size_t>(eb)));
      auto bu = test::poisoned<uint8_t>(2 * static_cast<size_t>(eb));
      ASSERT_TRUE(di && bv && bu);
      ASSERT_TRUE((*dev)->scatter(l, {di->as<int64_t>(), 2}, eb,
                                  {bv->as<uint8_t>(), 2 * static_cast<size_t>(eb)},
                                  {bu->as<uint8_t>(), 2 * static_cast<size_t>(eb)}, live[k][p], "bad"));
      EXPECT_FALSE((*dev)->sync());
      expect_all("after a refused write");
    }
  }
  // A live byte changed behind the memory's back (block 0 of tensor 0, a full block): the kept sums do not
  // see it, a full hash would. Proves the checksum after a scatter runs from the kept sums.
  std::vector<uint64_t> got(1, 0);
  ChecksumJob cj{&specs[0].values, live[0][0], &specs[0].scales, live[0][1], &got[0]};
  const uint8_t flipped = static_cast<uint8_t>(~mirror[0][0][0]);
  // note: canonical byte 0 of the GEMV layout is native byte 0.
  ASSERT_EQ(cudaMemcpy(live[0][0].data(), &flipped, 1, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE((*dev)->checksums({&cj, 1}));
  std::vector<uint8_t> both = mirror[0][0];
  both.insert(both.end(), mirror[0][1].begin(), mirror[0][1].end());
  EXPECT_EQ(got[0], XXH3_64bits(both.data(), both.size())) << "kept sums, no re-read";
  for (size_t k = 0; k < n; ++k) (*dev)->free_plane(live[k][0]), (*dev)->free_plane(live[k][1]);
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
  for (const std::vector<int64_t>& bad :
       {std::vector<int64_t>{3, 9, 9, 20}, std::vector<int64_t>{1, 2, 512}, std::vector<int64_t>{-1, 4}}) {
    auto di = test::upload(bad);
    auto dv = test::upload(random_bytes(rng, bad.size()));
    ASSERT_TRUE(di && dv);
    ASSERT_TRUE((*dev)->scatter(l, {di->as<int64_t>(), bad.size()}, 1, {dv->as<uint8_t>(), bad.size()}, {},
                                *live, "w values"));
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
