// Rough per-op timings of the engine ops at Qwen3-8B / Qwen3-30B-A3B shapes (not a benchmark subcommand:
// a quick check for the op author; `scripts/ops_gpu_tests timing`). CUDA-event median of 20 launches after 3
// warm-ups, inputs random, printing µs and the achieved GB/s (memory-bound ops) or TFLOP/s (prefill).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "cpu/rope.h"
#include "cuda/attention/attention_prefill.h"
#include "cuda/attention/paged_attention_decode.h"
#include "cuda/attention/qk_norm_rope_cache.h"
#include "cuda/ops/embedding.h"
#include "cuda/ops/moe_route.h"
#include "cuda/ops/rms_norm.h"
#include "cuda/ops/sample.h"
#include "cuda/ops/swiglu.h"

namespace {

void* dev(size_t bytes, std::mt19937_64& rng, int kind = 0) {  // kind 0: bf16 N(0,1), 1: zeros
  void* p = nullptr;
  cudaMalloc(&p, bytes);
  if (kind == 1) {
    cudaMemset(p, 0, bytes);
    return p;
  }
  std::vector<uint16_t> h(bytes / 2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : h) {
    const float f = nd(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    v = static_cast<uint16_t>(u >> 16);
  }
  cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice);
  return p;
}
template <class T>
T* upload(const std::vector<T>& v) {
  void* p = nullptr;
  cudaMalloc(&p, v.size() * sizeof(T));
  cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return static_cast<T*>(p);
}

double time_us(const std::function<cudaError_t()>& f) {
  for (int i = 0; i < 3; ++i)
    if (f() != cudaSuccess) return -1;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> t;
  for (int i = 0; i < 20; ++i) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms * 1000);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void line(const char* op, const char* shape, double us, double bytes, double flops = 0) {
  if (flops > 0)
    std::printf("%-24s %-44s %9.1f us %8.1f TFLOP/s\n", op, shape, us, flops / us / 1e6);
  else
    std::printf("%-24s %-44s %9.1f us %8.1f GB/s\n", op, shape, us, bytes / us / 1e3);
}

}  // namespace

int main() {
  using namespace mxq::cuda;
  std::mt19937_64 rng(1);
  const int H = 4096, Hq = 32, Hkv = 8, D = 128, I = 12288, V = 151936, bs = 16;
  for (int T : {32, 2048}) {
    auto* x = static_cast<uint16_t*>(dev(size_t(T) * H * 2, rng));
    auto* res = static_cast<float*>(dev(size_t(T) * H * 4, rng, 1));
    auto* w = static_cast<uint16_t*>(dev(H * 2, rng));
    auto* out = static_cast<uint16_t*>(dev(size_t(T) * H * 2, rng, 1));
    char shape[64];
    std::snprintf(shape, sizeof shape, "T=%d H=%d", T, H);
    line("add_rms_norm", shape,
         time_us([&] { return launch_add_rms_norm(x, res, w, 1e-6f, H, nullptr, T, out, nullptr); }),
         double(T) * H * (2 + 4 + 4 + 2));
    auto* gu = static_cast<uint16_t*>(dev(size_t(T) * 2 * I * 2, rng));
    auto* act = static_cast<uint16_t*>(dev(size_t(T) * I * 2, rng, 1));
    std::snprintf(shape, sizeof shape, "T=%d I=%d", T, I);
    line("swiglu_fused", shape, time_us([&] { return launch_swiglu_fused(gu, I, nullptr, T, act, nullptr); }),
         double(T) * I * 6);
    // qk_norm_rope_cache
    const int slots = T + 64;
    auto* qkv = static_cast<uint16_t*>(dev(size_t(T) * (Hq + 2 * Hkv) * D * 2, rng));
    auto* q = static_cast<uint16_t*>(dev(size_t(T) * Hq * D * 2, rng, 1));
    auto* kc = static_cast<uint16_t*>(dev(size_t(slots) * Hkv * D * 2, rng, 1));
    auto* vc = static_cast<uint16_t*>(dev(size_t(slots) * Hkv * D * 2, rng, 1));
    std::vector<int32_t> pos(T), slot(T);
    for (int t = 0; t < T; ++t) pos[t] = t, slot[t] = t;
    auto* dpos = upload(pos);
    auto* dslot = upload(slot);
    auto* freq = upload(*mxq::rope_inv_freq(1e6f, D));
    auto* bad = upload(std::vector<int32_t>{0x7FFFFFFF});
    QkNormRopeArgs qa{qkv, w, w, freq, dpos, dslot, nullptr, q, kc, vc, bad, T, slots, Hq, Hkv, D, 1e-6f};
    std::snprintf(shape, sizeof shape, "T=%d Hq=%d Hkv=%d D=%d", T, Hq, Hkv, D);
    line("qk_norm_rope_cache", shape, time_us([&] { return launch_qk_norm_rope_cache(qa, nullptr); }),
         double(T) * (Hq + 2 * Hkv) * D * 4);
  }
  // decode attention: batch S, every sequence `len` long
  for (auto [S, len] : {std::pair{1, 4096}, std::pair{32, 4096}, std::pair{32, 512}, std::pair{128, 2048}}) {
    const int max_blocks = (len + bs - 1) / bs, nblocks = S * max_blocks;
    auto* kc = static_cast<uint16_t*>(dev(size_t(nblocks) * bs * Hkv * D * 2, rng));
    auto* vc = static_cast<uint16_t*>(dev(size_t(nblocks) * bs * Hkv * D * 2, rng));
    std::vector<int32_t> tables(size_t(S) * max_blocks), lens(S, len);
    for (size_t i = 0; i < tables.size(); ++i) tables[i] = int32_t(i);
    std::shuffle(tables.begin(), tables.end(), rng);
    auto* dt = upload(tables);
    auto* dl = upload(lens);
    auto* q = static_cast<uint16_t*>(dev(size_t(S) * Hq * D * 2, rng));
    auto* out = static_cast<uint16_t*>(dev(size_t(S) * Hq * D * 2, rng, 1));
    auto* ws =
        static_cast<float*>(dev(paged_attention_decode_workspace_bytes(S, Hq, D, max_blocks, bs), rng, 1));
    PagedDecodeArgs a{q, kc, vc, dt, dl, ws, out, S, max_blocks, bs, Hq, Hkv, D};
    char shape[64];
    std::snprintf(shape, sizeof shape, "S=%d len=%d Hq=%d Hkv=%d D=%d", S, len, Hq, Hkv, D);
    line("paged_attention_decode", shape, time_us([&] { return launch_paged_attention_decode(a, nullptr); }),
         double(S) * len * Hkv * D * 4);
    if (S == 1) {  // prefill of one `len`-token prompt over the same cache
      auto* qp = static_cast<uint16_t*>(dev(size_t(len) * Hq * D * 2, rng));
      auto* op = static_cast<uint16_t*>(dev(size_t(len) * Hq * D * 2, rng, 1));
      auto* cu = upload(std::vector<int32_t>{0, len});
      PrefillArgs p{qp, kc, vc, dt, cu, dl, op, len, 1, max_blocks, bs, Hq, Hkv, D};
      std::snprintf(shape, sizeof shape, "T=%d causal Hq=%d Hkv=%d D=%d", len, Hq, Hkv, D);
      line("attention_prefill", shape, time_us([&] { return launch_attention_prefill(p, nullptr); }), 0,
           4.0 * Hq * D * double(len) * len / 2);
    }
  }
  // sampling at the Qwen3 vocabulary
  for (auto [S, mode] : {std::pair{1, 0}, std::pair{32, 0}, std::pair{32, 1}, std::pair{32, 2}}) {
    std::vector<float> logits(size_t(S) * V);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    for (auto& v : logits) v = nd(rng);
    auto* dl = upload(logits);
    auto* t = upload(std::vector<float>(S, mode == 0 ? 0.0f : 0.8f));
    auto* k = upload(std::vector<int32_t>(S, mode == 2 ? 50 : 0));
    auto* p = upload(std::vector<float>(S, mode == 2 ? 0.9f : 1.0f));
    auto* m = upload(std::vector<float>(S, 0.0f));
    auto* seed = upload(std::vector<uint64_t>(S, 7));
    auto* step = upload(std::vector<uint64_t>(S, 3));
    auto* tok = upload(std::vector<int32_t>(S));
    auto* lp = upload(std::vector<float>(S));
    auto* st = upload(std::vector<int32_t>(S));
    SampleArgs a{dl, t, k, p, m, seed, step, nullptr, tok, lp, st, V, S};
    const char* names[] = {"greedy", "temperature", "top_k 50 + top_p 0.9"};
    char shape[64];
    std::snprintf(shape, sizeof shape, "S=%d V=%d %s", S, V, names[mode]);
    line("sample", shape, time_us([&] { return launch_sample(a, nullptr); }), double(S) * V * 4);
  }
  // MoE routing at Qwen3-30B-A3B (E = 128, k = 8, H = 2048)
  for (int T : {32, 2048}) {
    const int E = 128, K = 8, Hm = 2048;
    auto* lg = static_cast<uint16_t*>(dev(size_t(T) * E * 2, rng));
    auto* ids = upload(std::vector<int32_t>(size_t(T) * K));
    auto* wts = upload(std::vector<float>(size_t(T) * K));
    auto* counts = upload(std::vector<int32_t>(E));
    auto* offsets = upload(std::vector<int32_t>(E + 1));
    auto* sorted = upload(std::vector<int32_t>(size_t(T) * K));
    auto* row_of = upload(std::vector<int32_t>(size_t(T) * K));
    MoeRouteArgs a{nullptr, lg, nullptr, ids, wts, counts, offsets, sorted, row_of, T, E, K, true};
    char shape[64];
    std::snprintf(shape, sizeof shape, "T=%d E=%d k=%d", T, E, K);
    line("moe_route", shape, time_us([&] { return launch_moe_route(a, nullptr); }), double(T) * E * 2);
    auto* y = static_cast<uint16_t*>(dev(size_t(T) * K * Hm * 2, rng));
    auto* out = static_cast<uint16_t*>(dev(size_t(T) * Hm * 2, rng, 1));
    std::snprintf(shape, sizeof shape, "T=%d k=%d H=%d", T, K, Hm);
    line("moe_combine", shape,
         time_us([&] { return launch_moe_combine(y, Hm, ids, wts, row_of, nullptr, T, K, out, nullptr); }),
         double(T) * (K + 1) * Hm * 2);
  }
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("final: %s\n", cudaGetErrorName(e));
  return e == cudaSuccess ? 0 : 1;
}
