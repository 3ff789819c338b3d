// The refit applier on a real model: what `mxq generate --model BASE --quantization Q --apply-delta STEP` runs
// (checkpoint deltas: base plus delta equals loading the target, in every quantization, a tied head).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "../io/temp_dir.h"
#include "applier_test_model.h"
#include "engine/sequence.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/cpu_backend.h"
#include "model/load_model.h"
#include "model/qwen3.h"
#include "refit/applier.h"
#include "refit/checkpoint_delta.h"
#include "refit/delta_encoder.h"

namespace mxq::refit {
namespace {

using test_model::native;

// ---- a real model: what `mxq generate --model BASE --quantization Q --apply-delta STEP` runs
// The target checkpoint is the base's f32 weights, each scaled by (1 + 1e-2 N(0,1)) (a large step, so scales
// move as well as values).
Status write_target_checkpoint(const std::string& base, const std::string& target) {
  auto file = SafetensorsFile::open(base + "/model.safetensors");
  if (!file) return tl::unexpected(file.error());
  std::mt19937 rng(17);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<std::vector<uint8_t>> data;
  data.reserve(file->tensors().size());
  std::vector<TensorToWrite> out;
  for (const TensorEntry& e : file->tensors()) {
    if (e.dtype != Dtype::kF32) return fail("{}: expected an f32 checkpoint", e.name);
    auto& bytes = data.emplace_back(e.nbytes());
    if (auto s = file->read(e, bytes); !s) return s;
    for (size_t i = 0; i + 4 <= bytes.size(); i += 4) {
      float x;
      std::memcpy(&x, bytes.data() + i, 4);
      x *= 1.0f + 1e-2f * noise(rng);
      std::memcpy(bytes.data() + i, &x, 4);
    }
    out.push_back({e.name, e.dtype, e.shape, bytes});
  }
  std::filesystem::copy_file(base + "/config.json", target + "/config.json");
  return write_safetensors(target + "/model.safetensors", out, file->metadata());
}

std::vector<float> logits_of(LoadedModel& m) {
  auto backend = make_cpu_backend(1);
  auto model = Qwen3Model::create(m.config, m.store, *backend);
  EXPECT_TRUE(model);
  const std::vector<int32_t> prompt = {1, 17, 42, 99};
  auto seq = Sequence::create(*model, 4);
  std::vector<float> logits(static_cast<size_t>(m.config.vocab_size));
  EXPECT_TRUE(seq && seq->append(prompt, logits.data()));
  return logits;
}

class CheckpointStep : public ::testing::TestWithParam<std::string> {};

// covers W-16, W-17 on a loaded model: base + delta == a load of the target, every byte and the logits
TEST_P(CheckpointStep, BasePlusDeltaEqualsLoadingTheTarget) {
  const std::string base = MXQ_SOURCE_DIR "/tests/golden/model/ckpt/qwen3-dense-f32";
  ScopedTempDir tmp;
  const std::string target = tmp.path() + "/target";
  std::filesystem::create_directory(target);
  ASSERT_TRUE(write_target_checkpoint(base, target));
  const Format q = *parse_format(GetParam());
  auto delta = make_checkpoint_delta(base, target, {q, 0, 1, false, 1});
  ASSERT_TRUE(delta) << delta.error().message;
  const std::vector<std::string> files = {tmp.path() + "/step.mxqd"};
  ASSERT_TRUE(write_delta_file(*delta, files[0]));

  LoadOptions opt;
  opt.quantization = q;
  auto live = load_model(base, opt), fresh = load_model(target, opt);
  ASSERT_TRUE(live && fresh);
  const std::vector<float> before = logits_of(*live);
  std::map<std::string, const uint8_t*> where;
  for (const auto& [name, t] : live->store.tensors()) where[name] = t.values.data();
  uint64_t version = 0;
  const Status s = apply_delta_files(live->store, version, files);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_EQ(version, 1u);
  EXPECT_TRUE(native(live->store) == native(fresh->store));
  for (const auto& [name, t] : live->store.tensors())
    EXPECT_EQ(t.values.data(), where[name]) << name << " moved";
  const std::vector<float> after = logits_of(*live), want = logits_of(*fresh);
  EXPECT_EQ(std::memcmp(after.data(), want.data(), after.size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(after.data(), before.data(), after.size() * sizeof(float)), 0) << "nothing changed";
  // the same file again is refused: the store is already at its new version (W-12)
  const Status again = apply_delta_files(live->store, version, files);
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().message.find("already applied"), std::string::npos) << again.error().message;
  EXPECT_NE(again.error().message.find(files[0]), std::string::npos) << again.error().message;
}

// covers W-18: in a tied checkpoint lm_head is the embedding matrix itself (one tensor in the store), so a
// step that moves the embedding refreshes the head with it: the delta has no lm_head record, and the logits
// after it equal a load of the target. The other W-18 cases have nothing to refresh in what mxq loads: no
// MTP / draft head or absorbed MLA in Qwen3 / Qwen3-MoE, and no fp8 KV scales (the KV cache is not fp8).
TEST(CheckpointStepTied, TheTiedHeadFollowsTheEmbedding) {
  const std::string base = MXQ_SOURCE_DIR "/tests/golden/model/ckpt/qwen3-dense-f32";  // tied, no lm_head
  ScopedTempDir tmp;
  const std::string target = tmp.path() + "/target";
  std::filesystem::create_directory(target);
  ASSERT_TRUE(write_target_checkpoint(base, target));
  auto delta = make_checkpoint_delta(base, target, {Format::kMXFP8, 0, 1, false, 1});
  ASSERT_TRUE(delta) << delta.error().message;
  bool has_embedding = false;
  for (const TensorDelta& t : delta->tensors) {
    EXPECT_NE(t.name, "lm_head.weight");
    has_embedding |= t.name == "model.embed_tokens.weight";
  }
  EXPECT_TRUE(has_embedding);

  LoadOptions opt;
  opt.quantization = Format::kMXFP8;
  auto live = load_model(base, opt), fresh = load_model(target, opt);
  ASSERT_TRUE(live && fresh);
  ASSERT_TRUE(live->config.tie_word_embeddings);
  EXPECT_FALSE(live->store.tensors().count("lm_head.weight"));
  const std::vector<float> before = logits_of(*live);
  uint64_t version = 0;
  const Status s = apply_delta(live->store, version, *delta);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_TRUE(native(live->store) == native(fresh->store));
  const std::vector<float> after = logits_of(*live), want = logits_of(*fresh);
  EXPECT_EQ(std::memcmp(after.data(), want.data(), after.size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(after.data(), before.data(), after.size() * sizeof(float)), 0) << "nothing changed";
}

INSTANTIATE_TEST_SUITE_P(Quantizations, CheckpointStep, ::testing::Values("mxfp8", "mxfp4", "fp8-b128"),
                         [](const auto& i) {
                           std::string n = i.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace mxq::refit
