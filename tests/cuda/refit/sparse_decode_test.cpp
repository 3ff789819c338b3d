// WeightMemory::decode_sparse on the device (sparse_decode.cu) against its CPU twin refit::decode_indices
// and the W-05 policy: many index sets in one batch (every encoding for every set, ragged plane sizes, empty
// and full sets, varints of 1-4 bytes straddling the 4 KiB decode chunks) decode to the same positions
// bitwise; a corruption of one set (or one new byte) is refused in exactly that job, as the host refuses it.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <vector>

#include "../gpu_test_util.h"
#include "model/weight_memory_cuda.h"
#include "model/weight_store.h"
#include "refit/index_codec.h"

namespace mxq::cuda {
namespace {

using refit::IndexEncoding;

struct Set {
  int64_t entries;
  std::vector<int64_t> indices;
  IndexEncoding encoding;
  std::vector<uint8_t> data;   // wire bytes
  std::vector<uint8_t> index;  // what the device gets (runs: the run table)
  std::vector<uint8_t> bytes;  // new E4M3 bytes, one per entry
};

std::vector<int64_t> random_set(std::mt19937_64& rng, int64_t entries, double p, int run) {
  std::vector<int64_t> out;
  if (p >= 1.0) {
    for (int64_t i = 0; i < entries; ++i) out.push_back(i);
    return out;
  }
  if (p <= 0) return out;
  std::geometric_distribution<int64_t> gap(std::min(1.0, p / run));
  for (int64_t at = gap(rng); at < entries; at += run + gap(rng))
    for (int64_t i = at; i < std::min(entries, at + run); ++i) out.push_back(i);
  return out;
}

std::vector<Set> make_sets(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Set> sets;
  const int64_t sizes[] = {1, 7, 8, 9, 4096 * 8 + 3, 100003, 1 << 20};
  const double densities[] = {0.0, 1e-5, 1e-3, 0.05, 0.3, 1.0};
  for (int64_t entries : sizes)
    for (double p : densities)
      for (int run : {1, 16})
        for (int e = 0; e < refit::kIndexEncodingCount; ++e) {
          Set s;
          s.entries = entries;
          s.indices = random_set(rng, entries, p, run);
          if (p == 1e-5 && s.indices.empty()) s.indices.push_back(entries - 1);  // one entry, at the end
          s.encoding = static_cast<IndexEncoding>(e);
          refit::encode_indices(s.encoding, s.indices, entries, s.data);
          for (size_t k = 0; k < s.indices.size(); ++k) {
            auto b = static_cast<uint8_t>(rng());
            s.bytes.push_back((b & 0x7F) == 0x7F ? b ^ 1 : b);
          }
          sets.push_back(std::move(s));
        }
  // note: gaps of 200 (2-byte varints after a 1-byte first one) start at odd offsets, so one straddles
  // every 4 KiB chunk boundary; gaps of 20000 take 3 bytes.
  for (int64_t step : {200, 20000}) {
    Set s;
    s.entries = int64_t{1} << 22;
    for (int64_t i = 0; i < s.entries; i += step) s.indices.push_back(i);
    s.encoding = IndexEncoding::kGaps;
    refit::encode_indices(s.encoding, s.indices, s.entries, s.data);
    s.bytes.assign(s.indices.size(), 0x38);
    sets.push_back(std::move(s));
  }
  return sets;
}

// Device image of the sets (index then bytes, 16-byte aligned), jobs over it, positions scratch; then the
// decode. Returns the refusal and the decoded positions.
struct Outcome {
  std::optional<SparseRefusal> refused;
  std::vector<int32_t> positions;
  bool ok = false;
};
Outcome decode(WeightStore& store, std::vector<Set>& sets) {
  Outcome o;
  WeightMemory& mem = store.memory();
  const QTensor& t = store.at("w");
  std::vector<size_t> at;
  std::vector<uint8_t> image;
  auto up16 = [&] { image.resize((image.size() + 15) / 16 * 16); };
  for (Set& s : sets) {
    if (s.encoding == IndexEncoding::kRuns) {
      auto table = refit::decode_run_table(s.data, static_cast<int64_t>(s.indices.size()), s.entries);
      EXPECT_TRUE(table) << table.error().message;
      s.index.resize(table->size() * 4);
      std::memcpy(s.index.data(), table->data(), s.index.size());
    } else {
      s.index = s.data;
    }
    at.push_back(image.size());
    image.insert(image.end(), s.index.begin(), s.index.end());
    up16();
    at.push_back(image.size());
    image.insert(image.end(), s.bytes.begin(), s.bytes.end());
    up16();
  }
  size_t entries = 0;
  for (const Set& s : sets) entries += s.indices.size();
  auto dev = mem.allocate_scratch(image.size());
  auto pos = mem.allocate_scratch(entries * 4 + 16);
  if (!dev || !pos || !mem.upload(image, *dev)) return o;
  // note: positions poisoned, so an entry the decode skips shows
  // note: on the memory's (non-blocking) stream, so the decode comes after it
  if (cudaMemsetAsync(pos->data(), 0xA5, pos->size(), weight_memory_stream(mem)) != cudaSuccess) return o;
  std::vector<SparsePlaneJob> jobs;
  for (size_t k = 0; k < sets.size(); ++k) {
    const Set& s = sets[k];
    SparsePlaneJob j;
    j.what = "w values";
    j.layout = &t.layout.values;
    j.native = t.values;
    j.encoding = static_cast<uint8_t>(s.encoding);
    j.index = dev->subspan(at[2 * k], s.index.size());
    j.count = static_cast<int64_t>(s.indices.size());
    j.entries = s.entries;
    j.entry_bytes = 1;
    j.policy = NewBytePolicy::kE4M3;
    j.bytes = dev->subspan(at[2 * k + 1], s.bytes.size());
    jobs.push_back(j);
  }
  auto r = mem.decode_sparse(jobs, *pos);
  EXPECT_TRUE(r) << (r ? "" : r.error().message);
  if (!r) return o;
  o.refused = *r;
  o.positions.resize(entries);
  EXPECT_EQ(cudaMemcpy(o.positions.data(), pos->data(), entries * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  mem.free_scratch(*dev);
  mem.free_scratch(*pos);
  o.ok = true;
  return o;
}

WeightStore small_store() {
  auto mem = cuda_weight_memory();
  EXPECT_TRUE(mem);
  WeightStore store(std::move(*mem));
  EXPECT_TRUE(store.add("w", Format::kBF16, {64}));
  return store;
}

TEST(CudaSparseDecode, PositionsMatchDecodeIndicesBitwise) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  WeightStore store = small_store();
  std::vector<Set> sets = make_sets(seed);
  int multi_byte = 0;
  for (const Set& s : sets)
    if (s.encoding == IndexEncoding::kGaps)
      for (uint8_t b : s.data) multi_byte += b >= 0x80;
  EXPECT_GT(multi_byte, 20000) << "varints of several bytes";
  Outcome o = decode(store, sets);
  ASSERT_TRUE(o.ok);
  EXPECT_FALSE(o.refused) << "job " << o.refused->job << " position " << o.refused->position;
  size_t at = 0;
  for (size_t k = 0; k < sets.size(); ++k) {
    const Set& s = sets[k];
    auto want = refit::decode_indices(s.encoding, s.data, static_cast<int64_t>(s.indices.size()), s.entries);
    ASSERT_TRUE(want);
    std::vector<int64_t> got(o.positions.begin() + static_cast<std::ptrdiff_t>(at),
                             o.positions.begin() + static_cast<std::ptrdiff_t>(at + s.indices.size()));
    EXPECT_EQ(got, *want) << "job " << k << ": " << s.entries << " entries, " << s.indices.size() << " set, "
                          << refit::encoding_name(s.encoding);
    at += s.indices.size();
  }
}

// Each case corrupts one set (wire bytes or new bytes) and says whether it applies to it.
struct Corruption {
  std::string name;
  std::function<bool(Set&)> apply;
};

TEST(CudaSparseDecode, OneCorruptSetIsRefusedInItsJob) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  WeightStore store = small_store();
  const std::vector<Set> clean = make_sets(seed);
  auto gaps = [](Set& s) { return s.encoding == IndexEncoding::kGaps && s.data.size() >= 12; };
  const std::vector<Corruption> cases = {
      {"zero gap",
       [&](Set& s) {
         if (!gaps(s)) return false;
         for (size_t i = 1; i < s.data.size(); ++i)
           if (s.data[i] < 0x80 && s.data[i - 1] < 0x80) return s.data[i] = 0, true;
         return false;
       }},
      {"non-minimal varint",
       [&](Set& s) {
         if (!gaps(s)) return false;
         for (size_t i = 1; i + 1 < s.data.size(); ++i)
           if (s.data[i] < 0x80 && s.data[i - 1] < 0x80 && s.data[i + 1] < 0x80)
             return s.data[i] |= 0x80, s.data[i + 1] = 0, true;
         return false;
       }},
      {"ten-byte varint",
       [&](Set& s) {
         if (!gaps(s)) return false;
         for (size_t i = 0; i < 10; ++i) s.data[s.data.size() - 11 + i] = 0x81;
         return true;
       }},
      {"cut off", [&](Set& s) { return gaps(s) ? (s.data.back() |= 0x80, true) : false; }},
      {"past the plane",
       [&](Set& s) {
         if (!gaps(s) || s.data[s.data.size() - 2] >= 0x80) return false;
         s.data.pop_back();  // the last gap becomes `entries`
         for (auto v = static_cast<uint64_t>(s.entries); true; v >>= 7) {
           if (v < 0x80) {
             s.data.push_back(static_cast<uint8_t>(v));
             break;
           }
           s.data.push_back(static_cast<uint8_t>(v | 0x80));
         }
         return true;
       }},
      {"bitmap pad bit",
       [&](Set& s) {
         if (s.encoding != IndexEncoding::kBitmap || s.entries % 8 == 0 || s.indices.empty()) return false;
         s.data.back() |= 0x80;
         return true;
       }},
      {"bitmap count",
       [&](Set& s) {
         if (s.encoding != IndexEncoding::kBitmap || s.indices.empty()) return false;
         s.data[static_cast<size_t>(s.indices[0] / 8)] &= static_cast<uint8_t>(~(1u << (s.indices[0] % 8)));
         return true;
       }},
      {"E4M3 NaN",
       [&](Set& s) { return s.bytes.empty() ? false : (s.bytes[s.bytes.size() / 2] = 0xFF, true); }},
  };
  std::mt19937_64 rng(seed);
  int applied = 0;
  for (const Corruption& c : cases) {
    std::vector<Set> sets = clean;
    // note: a random job the case applies to, not always the first
    std::vector<size_t> fits;
    for (size_t k = 0; k < sets.size(); ++k) {
      Set trial = sets[k];
      if (c.apply(trial)) fits.push_back(k);
    }
    if (fits.empty()) continue;
    const size_t k = fits[rng() % fits.size()];
    ASSERT_TRUE(c.apply(sets[k]));
    const Set& s = sets[k];
    const bool policy = c.name == "E4M3 NaN";
    auto host = refit::decode_indices(s.encoding, s.data, static_cast<int64_t>(s.indices.size()), s.entries);
    ASSERT_TRUE(policy || !host) << c.name << ": the host refuses it too";
    ++applied;
    Outcome o = decode(store, sets);
    ASSERT_TRUE(o.ok);
    ASSERT_TRUE(o.refused) << c.name << " in job " << k;
    EXPECT_EQ(o.refused->job, k) << c.name << ": " << (policy ? "policy" : host.error().message);
  }
  EXPECT_GE(applied, 6);
}

}  // namespace
}  // namespace mxq::cuda
