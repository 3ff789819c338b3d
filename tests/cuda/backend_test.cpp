// The one forward (model/qwen3.cpp) on the CUDA backend (model/cuda_backend.h) against the CUDA engine's own
// forward (Qwen3Cuda::forward) on the same steps of the same weights, bit for bit on every sampled logits
// row: two sequences over interleaved blocks, a prompt split across two mixed steps with a non-sampling
// chunk, a decode token beside a prompt chunk, then decode steps. The default model (dense) and a synthetic
// Qwen3-MoE (stacked experts and one module per expert: the host expert loop on mixed steps, the grouped
// launches on decode steps), in bf16, MXFP8, MXFP4, FP8-B128 and the W8A8 mode; and the same forward on the
// CPU backend (f32) within the engine tests' logit tolerance, batch for batch. Eager steps
// (docs/one-forward.md commit 6: graphs stay in CudaRunner for now).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "format/formats.h"
#include "model/cpu_backend.h"
#include "model/cuda_backend.h"
#include "model/load_model.h"
#include "model/qwen3.h"
#include "model/qwen3_cuda.h"
#include "synthetic_qwen3.h"

namespace mxq::cuda {
namespace {

constexpr int32_t kSeqs = 2, kBlockSize = 16, kMaxBlocks = 4, kTokens = 64;
constexpr uint64_t kCheckpointSeed = 1;

struct Chunk {
  int seq;
  std::vector<int32_t> ids;
  bool sample;
};

struct Case {
  const char* name;
  Kind kind;                 // kDense: models/default
  const char* quantization;  // "" = the checkpoint's bf16
  bool w8a8;
};

// Writes one step into `h`: sequence s owns blocks s, s + 2, s + 4, ...; `fed` counts each sequence's
// positions so far (advanced). Returns the token row of each sampling row.
std::vector<int32_t> fill(StepMeta& h, const std::vector<Chunk>& step, std::vector<int64_t> fed,
                          int32_t seqs) {
  int32_t t = 0, s = 0;
  std::vector<int32_t> sample_rows;
  h.cu_seqlens[0] = 0;
  for (const Chunk& c : step) {
    for (int32_t id : c.ids) {
      const int64_t p = fed[c.seq]++;
      h.ids[t] = id;
      h.positions[t] = static_cast<int32_t>(p);
      h.slot_mapping[t] =
          static_cast<int32_t>(((p / kBlockSize) * kSeqs + c.seq) * kBlockSize + p % kBlockSize);
      ++t;
    }
    for (int32_t j = 0; j < kMaxBlocks; ++j) h.block_tables[s * kMaxBlocks + j] = j * kSeqs + c.seq;
    h.seq_lens[s] = static_cast<int32_t>(fed[c.seq]);
    h.cu_seqlens[s + 1] = t;
    if (c.sample) sample_rows.push_back(t - 1);
    ++s;
  }
  for (int32_t i = s; i < seqs; ++i) h.seq_lens[i] = 0, h.cu_seqlens[i + 1] = t;
  *h.num_tokens = t;
  *h.num_seqs = static_cast<int32_t>(sample_rows.size());
  return sample_rows;
}

class CudaBackendForward : public ::testing::TestWithParam<Case> {};

TEST_P(CudaBackendForward, EqualsQwen3CudaBitwiseAndTheCpuBackendWithinTolerance) {
  const Case& c = GetParam();
  const char* src = std::getenv("MXQ_SOURCE_DIR");
  LoadOptions opt;
  opt.target = cuda_load_target();
  if (*c.quantization) opt.quantization = *parse_format(c.quantization);
  std::string dir = std::string(src ? src : MXQ_SOURCE_DIR) + "/models/default";
  if (c.kind != Kind::kDense) {
    dir = temp_dir(std::string("backend_") + c.name);
    // note: a fixed checkpoint: against the f32 oracle an MoE step can move by a whole expert where two router
    // logits nearly tie (top-k picks differently in bf16 and f32); one of seven fresh seeds showed 0.34 of the
    // logit scale on moe_stacked_fp8_b128 (mixed step, W8A8 q/k/v), the others 0.03-0.07
    write_checkpoint(dir, c.kind, kCheckpointSeed);
  }
  auto m = load_model(dir, opt);
  ASSERT_TRUE(m) << m.error().message;
  LoadOptions cpu_opt = opt;
  cpu_opt.target = {};
  auto cm = load_model(dir, cpu_opt);
  ASSERT_TRUE(cm) << cm.error().message;
  const ModelConfig& mc = m->config;
  const Format act = c.w8a8 ? Format::kMXFP8 : Format::kBF16;
  Qwen3CudaOptions o;
  o.max_num_seqs = kSeqs;
  o.max_num_batched_tokens = kTokens;
  o.max_model_len = kBlockSize * kMaxBlocks;
  o.block_size = kBlockSize;
  o.num_blocks = kSeqs * kMaxBlocks;
  o.act_quant = act;
  auto engine = Qwen3Cuda::create(mc, m->store, o);
  ASSERT_TRUE(engine) << engine.error().message;
  auto backend = make_cuda_backend({.act_quant = act});
  ASSERT_TRUE(backend) << backend.error().message;
  auto model = Qwen3Model::create(mc, m->store, **backend);
  ASSERT_TRUE(model) << model.error().message;
  auto pool = (*backend)->create_kv({.layers = mc.num_hidden_layers,
                                     .kv_heads = mc.num_key_value_heads,
                                     .head_dim = mc.head_dim,
                                     .num_blocks = kSeqs * kMaxBlocks,
                                     .block_size = kBlockSize,
                                     .max_blocks = kMaxBlocks,
                                     .max_tokens = kTokens,
                                     .max_seqs = kSeqs});
  ASSERT_TRUE(pool) << pool.error().message;
  // the same forward on the CPU backend (f32, the oracle)
  auto cpu = make_cpu_backend(2, act);
  auto cpu_model = Qwen3Model::create(cm->config, cm->store, *cpu);
  ASSERT_TRUE(cpu_model) << cpu_model.error().message;
  auto cpu_pool = cpu->create_kv((*pool)->shape());
  ASSERT_TRUE(cpu_pool) << cpu_pool.error().message;
  // note: the engine tests' tolerances (engine_cuda_test.cpp): FP8-B128 prompts past the GEMV's M and the
  // W8A8 mode quantize activations to E4M3
  const double tol = c.w8a8 || std::string_view(c.quantization) == "fp8-b128" ? 0.2 : 3e-2;
  double worst = 0;

  std::mt19937_64 rng(7);
  auto ids = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(mc.vocab_size));
    return v;
  };
  std::vector<std::vector<Chunk>> steps;
  steps.push_back({{0, ids(6), false}, {1, ids(7), true}});
  steps.push_back({{0, ids(11), true}, {1, ids(1), true}});
  for (int i = 0; i < 6; ++i) steps.push_back({{0, ids(1), true}, {1, ids(1), true}});

  std::vector<int64_t> fed(kSeqs, 0);
  const int64_t V = mc.vocab_size;
  int compared = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    const auto& step = steps[k];
    const bool decode =
        std::all_of(step.begin(), step.end(), [](const Chunk& ch) { return ch.ids.size() == 1; });
    const std::vector<int32_t> rows = fill((*engine)->host_meta(), step, fed, kSeqs);
    fill((*pool)->host_meta(), step, fed, kSeqs);
    fill((*cpu_pool)->host_meta(), step, fed, kSeqs);
    for (const Chunk& ch : step) fed[ch.seq] += static_cast<int64_t>(ch.ids.size());
    ForwardShape shape;
    shape.rows = decode ? kSeqs : *(*pool)->host_meta().num_tokens;
    shape.seqs = kSeqs, shape.decode = decode, shape.sample_rows = static_cast<int32_t>(rows.size());
    if (!decode) shape.sample_token_rows = rows;
    ASSERT_TRUE((*engine)->upload_meta(kSeqs));
    auto st = (*engine)->forward(shape);
    ASSERT_TRUE(st) << st.error().message;
    std::vector<float> got(rows.size() * static_cast<size_t>(V)), want(static_cast<size_t>(V));
    st = model->step(**pool, shape, got.data());
    ASSERT_TRUE(st) << st.error().message;
    std::vector<float> oracle(got.size());
    st = cpu_model->step(**cpu_pool, shape, oracle.data());
    ASSERT_TRUE(st) << st.error().message;
    for (size_t r = 0; r < rows.size(); ++r) {
      ASSERT_TRUE((*engine)->download_logits(static_cast<int32_t>(r), want));
      EXPECT_EQ(0, std::memcmp(got.data() + r * V, want.data(), want.size() * sizeof(float)))
          << "step " << k << (decode ? " (decode)" : " (mixed)") << ", sampling row " << r;
      // not a test of zeros: finite logits with a spread
      const auto [lo, hi] = std::minmax_element(want.begin(), want.end());
      ASSERT_TRUE(std::isfinite(*lo) && std::isfinite(*hi) && *hi - *lo > 1e-3f) << "step " << k;
      double err = 0, scale = 1e-30;
      for (int64_t i = 0; i < V; ++i) {
        err = std::max(err, std::abs(static_cast<double>(want[i]) - oracle[r * V + i]));
        scale = std::max(scale, std::abs(static_cast<double>(oracle[r * V + i])));
      }
      worst = std::max(worst, err / scale);
      EXPECT_LE(err, tol * scale) << "CPU backend, step " << k << ", sampling row " << r;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 1 + 2 + 6 * 2);
  std::printf("[ backend ] %s: worst relative logit error against the CPU backend %.3g\n", c.name, worst);
}

INSTANTIATE_TEST_SUITE_P(Default, CudaBackendForward,
                         ::testing::Values(Case{"dense_bf16", Kind::kDense, "", false},
                                           Case{"dense_mxfp8", Kind::kDense, "mxfp8", false},
                                           Case{"dense_mxfp4", Kind::kDense, "mxfp4", false},
                                           Case{"dense_fp8_b128", Kind::kDense, "fp8-b128", false},
                                           Case{"dense_mxfp8_a8", Kind::kDense, "mxfp8", true},
                                           Case{"moe_stacked_bf16", Kind::kMoeStacked, "", false},
                                           Case{"moe_stacked_mxfp8", Kind::kMoeStacked, "mxfp8", false},
                                           Case{"moe_stacked_mxfp4_a8", Kind::kMoeStacked, "mxfp4", true},
                                           Case{"moe_stacked_fp8_b128", Kind::kMoeStacked, "fp8-b128", false},
                                           Case{"moe_experts_bf16", Kind::kMoeExperts, "", false},
                                           Case{"moe_experts_mxfp8_a8", Kind::kMoeExperts, "mxfp8", true},
                                           Case{"moe_experts_mxfp4", Kind::kMoeExperts, "mxfp4", false}),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// Step ops outside a step, the MoE chain out of order and an activation mode without kernels are refused by
// name.
TEST(CudaBackendRefusals, ByName) {
  auto backend = make_cuda_backend();
  ASSERT_TRUE(backend) << backend.error().message;
  auto x = (*backend)->alloc(ActType::kF32, 1, 8);
  ASSERT_TRUE(x);
  auto st = (*backend)->moe_route(0, *x, 1, false);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("outside run_step"), std::string::npos) << st.error().message;
  auto pool = (*backend)->create_kv({.layers = 1,
                                     .kv_heads = 1,
                                     .head_dim = 64,
                                     .num_blocks = 1,
                                     .block_size = 16,
                                     .max_blocks = 1,
                                     .max_tokens = 1,
                                     .max_seqs = 1});
  ASSERT_TRUE(pool) << pool.error().message;
  *(*pool)->host_meta().num_tokens = 1;
  ForwardShape shape;
  shape.rows = 1, shape.seqs = 1, shape.decode = true, shape.sample_rows = 1;
  st = (*backend)->run_step(**pool, shape, [&] { return (*backend)->moe_swiglu(0, *x, *x); });
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("layer 0 was not routed"), std::string::npos) << st.error().message;
  std::vector<float> h(8);
  st = (*backend)->to_host(*x, 1, h.data());
  EXPECT_TRUE(st) << st.error().message;
  auto bad = make_cuda_backend({.act_quant = Format::kMXFP4});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("expected bf16 or mxfp8"), std::string::npos) << bad.error().message;
}

}  // namespace
}  // namespace mxq::cuda
