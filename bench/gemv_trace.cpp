// The ring GEMV's timeline rows (bench_gemv_trace.h).
#if defined(MXQ_HAVE_CUDA)
#include "bench/gemv_trace.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <vector>

#include "bench/bench_cuda.h"
#include "cuda/common/check.h"
#include "cuda/linear/gemv_mx_launch.h"

namespace mxq::cli {
namespace {

struct Block {
  uint64_t start, waited, data, end;
  uint32_t sm, id, grid, key;  // key: the low 32 bits of the launch's first values pointer
  uint64_t ck[6];              // warp 0's clock64 marks after the wait (gemv_mx_launch.h)
};

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// The whole launches among `blocks` (arrival order), in the order of their first arrival. note: a block of
// launch j can arrive after the first blocks of j + 1 (its atomicAdd lands late), so blocks are grouped by
// launch key: a key starts a new launch when its open one is full. Launches cut by the buffer's wrap, or
// whose block ids repeat, are left out.
std::vector<std::vector<Block>> launches_of(const std::vector<Block>& blocks) {
  std::vector<std::vector<Block>> all;
  std::map<uint32_t, size_t> open;  // key -> index in `all` of its launch still filling
  for (const Block& b : blocks) {
    auto it = open.find(b.key);
    if (it == open.end() || all[it->second].size() >= b.grid) {
      all.emplace_back();
      it = open.insert_or_assign(b.key, all.size() - 1).first;
    }
    all[it->second].push_back(b);
  }
  std::vector<std::vector<Block>> out;
  for (auto& l : all) {
    if (l.size() != l.front().grid) continue;  // note: the oldest launches lost records to the wrap
    std::set<uint32_t> ids;
    for (const Block& b : l) ids.insert(b.id);
    if (ids.size() == l.size()) out.push_back(std::move(l));
  }
  return out;
}

}  // namespace

void print_gemv_trace_header() {
  fmt::print(
      "trace rows: us/launch; medians over consecutive launches (j-1, j), µs after launch j-1's last block "
      "end: start first/last, past-wait first/last, end last (= period); per block: start -> first step "
      "data, wait -> end\n");
  fmt::print("{:<44} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>6}\n", "trace", "us", "traced",
             "start0", "start1", "wait0", "wait1", "period", "data", "compute", "step");
}

Status trace_gemv_row(const std::string& label, int launches, int reps, cudaStream_t stream,
                      const std::function<Status(int)>& launch) {
  // note: room for two replays of the largest persistent grid (2 blocks per SM); the slots wrap, so after
  // the run the buffer holds the last `capacity` blocks, the whole last replay among them.
  int dev = 0, sms = 0;
  MXQ_CUDA_CHECK(cudaGetDevice(&dev));
  MXQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int capacity = 2 * launches * 2 * sms;
  auto records = cuda::DeviceBuffer::alloc(static_cast<size_t>(capacity) * cuda::kGemvTraceWords * 8);
  auto count = cuda::DeviceBuffer::alloc(sizeof(unsigned int));
  if (!records || !count) return fail("gemv trace: device allocation failed");
  auto clean = time_graph(stream, launches, reps, launch);  // note: the same launches without the records
  if (!clean) return tl::unexpected(clean.error());
  MXQ_CUDA_CHECK(cudaMemsetAsync(count->as(), 0, sizeof(unsigned int), stream));
  cuda::set_gemv_trace({records->as<unsigned long long>(), count->as<unsigned int>(), capacity});
  auto us = time_graph(stream, launches, reps, launch);
  cuda::set_gemv_trace({});
  if (!us) return tl::unexpected(us.error());
  std::vector<uint64_t> words(static_cast<size_t>(capacity) * cuda::kGemvTraceWords);
  unsigned int n = 0;
  MXQ_CUDA_CHECK(cudaMemcpy(words.data(), records->as(), words.size() * 8, cudaMemcpyDeviceToHost));
  MXQ_CUDA_CHECK(cudaMemcpy(&n, count->as(), sizeof n, cudaMemcpyDeviceToHost));
  std::vector<Block> blocks;
  const uint32_t kept = std::min<uint32_t>(n, static_cast<uint32_t>(capacity));
  for (uint32_t a = n - kept; a < n; ++a) {
    const uint64_t* r =
        words.data() + static_cast<size_t>(a % static_cast<uint32_t>(capacity)) * cuda::kGemvTraceWords;
    blocks.push_back({r[0],
                      r[1],
                      r[2],
                      r[3],
                      static_cast<uint32_t>(r[4]),
                      static_cast<uint32_t>(r[4] >> 32),
                      static_cast<uint32_t>(r[5]),
                      static_cast<uint32_t>(r[5] >> 32),
                      {r[6], r[7], r[8], r[9], r[10], r[11]}});
  }
  // note: study aid: MXQ_GEMV_TRACE_DIR=dir keeps the raw records (arrival order) as dir/<label>.bin.
  if (const char* dir = std::getenv("MXQ_GEMV_TRACE_DIR")) {
    std::string name = label;
    for (char& c : name)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    if (FILE* f = std::fopen(fmt::format("{}/{}.bin", dir, name).c_str(), "wb")) {
      std::fwrite(blocks.data(), sizeof(Block), blocks.size(), f);
      std::fclose(f);
    }
  }
  const std::vector<std::vector<Block>> all = launches_of(blocks);
  if (all.size() < static_cast<size_t>(launches))
    return fail(
        "gemv trace {}: {} whole launches with distinct blocks among {} records, expected {} (not a ring "
        "launch?)",
        label, all.size(), blocks.size(), launches);
  // note: the last replay.
  const std::vector<std::vector<Block>> per(all.end() - launches, all.end());
  std::vector<double> start0, start1, wait0, wait1, period, data, compute;
  std::vector<double> cyc[6];  // warp 0's segments after the wait, cycles (gemv_mx_launch.h)
  uint64_t step = UINT64_MAX;
  std::vector<uint64_t> stamps;
  for (size_t j = 0; j < per.size(); ++j) {
    const auto& L = per[j];
    for (const Block& b : L) {
      data.push_back((b.data - b.start) * 1e-3);
      compute.push_back((b.end - b.waited) * 1e-3);
      // note: a mark the kernel did not reach (warps with one step: MXFP4 at K = 4096) reads below 0; its
      // segment is left out and the next one runs from the last mark reached.
      double prev = 0;
      for (int i = 0; i < 6; ++i) {
        const auto mark = static_cast<double>(static_cast<int64_t>(b.ck[i]));
        if (mark < 0) continue;
        cyc[i].push_back(mark - prev);
        prev = mark;
      }
      stamps.push_back(b.start);
    }
    if (j == 0) continue;
    uint64_t prev_end = 0;
    for (const Block& b : per[j - 1]) prev_end = std::max(prev_end, b.end);
    auto rel = [&](uint64_t t) { return (static_cast<double>(t) - static_cast<double>(prev_end)) * 1e-3; };
    uint64_t s0 = UINT64_MAX, s1 = 0, w0 = UINT64_MAX, w1 = 0, e1 = 0;
    for (const Block& b : L) {
      s0 = std::min(s0, b.start), s1 = std::max(s1, b.start);
      w0 = std::min(w0, b.waited), w1 = std::max(w1, b.waited), e1 = std::max(e1, b.end);
    }
    start0.push_back(rel(s0)), start1.push_back(rel(s1)), wait0.push_back(rel(w0)), wait1.push_back(rel(w1));
    period.push_back(rel(e1));
  }
  // note: the timer's step (the smallest nonzero gap between block starts) says how fine these numbers are.
  std::sort(stamps.begin(), stamps.end());
  for (size_t i = 1; i < stamps.size(); ++i)
    if (stamps[i] > stamps[i - 1]) step = std::min(step, stamps[i] - stamps[i - 1]);
  fmt::print(
      "{:<44} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>5}ns\n",
      label, *clean, *us, median(start0), median(start1), median(wait0), median(wait1), median(period),
      median(data), median(compute), step == UINT64_MAX ? 0 : step);
  fmt::print(
      "{:<44} cycles after the wait (warp 0, medians; nan: not reached): to step 0 {:.0f}, its data wait "
      "{:.0f}, step 0 {:.0f}, step 1 data wait {:.0f}, then to the end of tile 0's steps {:.0f}, sums "
      "{:.0f}\n",
      "", median(cyc[0]), median(cyc[1]), median(cyc[2]), median(cyc[3]), median(cyc[4]), median(cyc[5]));
  return {};
}

}  // namespace mxq::cli
#endif
