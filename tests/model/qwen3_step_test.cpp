// Qwen3Model::step batched against each sequence alone (engine/sequence.h: one sequence, its own pool, one
// step per chunk) on every golden case, bit for bit: three sequences of the case's runs share each step, cut
// into chunks with and without a sampling row, one prompt split in two, a one-token chunk beside prompts,
// then decode steps of all three; the MX cases also in the W8A8 mode. The block tables interleave the
// sequences' blocks. (Until the one forward landed, "alone" was the per-sequence forward over a contiguous
// cache, held bitwise equal to this batched step on the same cases.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/sequence.h"
#include "golden_cases.h"
#include "model/cpu_backend.h"
#include "model/load_model.h"
#include "model/qwen3.h"

namespace mxq {
namespace {

constexpr int64_t kBlockSize = 4, kSeqs = 3;

struct Chunk {
  int seq;
  std::vector<int32_t> ids;
  bool sample;
};

// The case's three runs as steps: prompts (run 0 in two chunks), then teacher-forced greedy tokens.
std::vector<std::vector<Chunk>> plan_steps(const nlohmann::json& runs) {
  std::vector<std::vector<int32_t>> p, g;
  for (int s = 0; s < kSeqs; ++s) {
    p.push_back(runs[s]["prompt"].get<std::vector<int32_t>>());
    g.push_back(runs[s]["greedy"].get<std::vector<int32_t>>());
  }
  const auto cut = static_cast<std::ptrdiff_t>(p[0].size() / 2);
  std::vector<std::vector<Chunk>> steps;
  steps.push_back({{0, {p[0].begin(), p[0].begin() + cut}, false}, {1, p[1], true}});
  steps.push_back({{0, {p[0].begin() + cut, p[0].end()}, true}, {1, {g[1][0]}, true}, {2, p[2], true}});
  for (size_t j = 0; j < 8; ++j)
    steps.push_back({{0, {g[0][j]}, true}, {1, {g[1][j + 1]}, true}, {2, {g[2][j]}, true}});
  return steps;
}

bool is_decode(const std::vector<Chunk>& step) {
  return std::all_of(step.begin(), step.end(), [](const Chunk& c) { return c.ids.size() == 1 && c.sample; });
}

struct Outcome {
  int seq;
  std::vector<float> logits;
};

// Each sequence alone, chunk by chunk in step order.
std::vector<Outcome> per_sequence(Qwen3Model& m, const std::vector<std::vector<Chunk>>& steps) {
  const int64_t vocab = m.config().vocab_size;
  std::vector<Sequence> seqs;
  for (int s = 0; s < kSeqs; ++s) seqs.push_back(*Sequence::create(m, 64, kBlockSize));
  std::vector<Outcome> out;
  for (const auto& step : steps)
    for (const Chunk& c : step) {
      std::vector<float> logits(static_cast<size_t>(vocab));
      EXPECT_TRUE(seqs[c.seq].append(c.ids, logits.data()));
      if (c.sample) out.push_back({c.seq, std::move(logits)});
    }
  return out;
}

// step(): the sequences together, paged; sequence s owns blocks s, s + 3, s + 6, ...
std::vector<Outcome> batched(Qwen3Model& m, Backend& b, const std::vector<std::vector<Chunk>>& steps) {
  const ModelConfig& c = m.config();
  const int64_t max_blocks = 64 / kBlockSize, vocab = c.vocab_size;
  auto kv = b.create_kv({.layers = c.num_hidden_layers,
                         .kv_heads = c.num_key_value_heads,
                         .head_dim = c.head_dim,
                         .num_blocks = kSeqs * max_blocks,
                         .block_size = kBlockSize,
                         .max_blocks = max_blocks,
                         .max_tokens = 64,
                         .max_seqs = kSeqs});
  EXPECT_TRUE(kv) << kv.error().message;
  std::vector<int64_t> fed(kSeqs, 0);
  std::vector<Outcome> out;
  for (const auto& step : steps) {
    StepMeta& meta = (*kv)->host_meta();
    int32_t t = 0, s = 0;
    std::vector<int32_t> sample_rows;
    meta.cu_seqlens[0] = 0;
    for (const Chunk& ch : step) {
      for (int32_t id : ch.ids) {
        const int64_t pos = fed[ch.seq]++;
        meta.ids[t] = id;
        meta.positions[t] = static_cast<int32_t>(pos);
        meta.slot_mapping[t] =
            static_cast<int32_t>(((pos / kBlockSize) * kSeqs + ch.seq) * kBlockSize + pos % kBlockSize);
        ++t;
      }
      for (int64_t j = 0; j < max_blocks; ++j)
        meta.block_tables[s * max_blocks + j] = static_cast<int32_t>(j * kSeqs + ch.seq);
      meta.seq_lens[s] = static_cast<int32_t>(fed[ch.seq]);
      meta.cu_seqlens[s + 1] = t;
      if (ch.sample) sample_rows.push_back(t - 1);
      ++s;
    }
    *meta.num_tokens = t;
    *meta.num_seqs = static_cast<int32_t>(sample_rows.size());
    ForwardShape shape;
    shape.rows = t, shape.seqs = s, shape.decode = is_decode(step);
    shape.sample_rows = static_cast<int32_t>(sample_rows.size());
    if (!shape.decode) shape.sample_token_rows = sample_rows;
    std::vector<float> logits(sample_rows.size() * static_cast<size_t>(vocab));
    auto st = m.step(**kv, shape, logits.data());
    EXPECT_TRUE(st) << st.error().message;
    size_t r = 0;
    for (const Chunk& ch : step)
      if (ch.sample) {
        out.push_back({ch.seq, {logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab}});
        ++r;
      }
  }
  return out;
}

class Qwen3Step : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(Qwen3Step, BatchedEqualsEachSequenceAlone) {
  const GoldenCase& gcase = GetParam();
  LoadOptions opt;
  if (!gcase.quantization.empty()) opt.quantization = *parse_format(gcase.quantization);
  auto model = load_model(kGolden + gcase.checkpoint, opt);
  ASSERT_TRUE(model) << model.error().message;
  const auto steps = plan_steps(golden()["cases"][gcase.index]["runs"]);
  std::vector<Format> modes = {Format::kBF16};
  const Format weights = model->store.find("model.layers.0.self_attn.q_proj.weight")->format;
  if (is_mx(weights)) modes.push_back(Format::kMXFP8);  // the W8A8 mode
  for (Format act : modes) {
    auto b1 = make_cpu_backend(2, act), b2 = make_cpu_backend(2, act);
    auto alone = Qwen3Model::create(model->config, model->store, *b1);
    auto together = Qwen3Model::create(model->config, model->store, *b2);
    ASSERT_TRUE(alone && together);
    const auto want = per_sequence(*alone, steps), got = batched(*together, *b2, steps);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].seq, want[i].seq);
      EXPECT_EQ(
          0, std::memcmp(got[i].logits.data(), want[i].logits.data(), got[i].logits.size() * sizeof(float)))
          << "sampling row " << i << " (sequence " << got[i].seq << ")"
          << (act == Format::kMXFP8 ? ", W8A8" : "");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Qwen3Step, ::testing::ValuesIn(golden_cases()), golden_case_name);

}  // namespace
}  // namespace mxq
