// The forward reads live weight bytes on every call: an apply_tensor between two forwards changes the next
// logits, and writing the old bytes back restores them bit for bit (A -> B -> A).
#include <gtest/gtest.h>

#include <cstring>

#include "engine/sequence.h"
#include "model/cpu_backend.h"
#include "model/load_model.h"
#include "model/qwen3.h"

namespace mxq {
namespace {

struct RefitCase {
  std::string checkpoint, quantization, tensor;
};
void PrintTo(const RefitCase& c, std::ostream* os) {
  *os << c.checkpoint << (c.quantization.empty() ? "" : " as " + c.quantization) << ": " << c.tensor;
}

std::vector<float> last_logits(Qwen3Model& model) {
  const ModelConfig& cfg = model.config();
  const std::vector<int32_t> prompt = {1, 17, 42, 99};
  auto seq = Sequence::create(model, 4);
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  EXPECT_TRUE(seq && seq->append(prompt, logits.data()));
  return logits;
}

class Qwen3Refit : public ::testing::TestWithParam<RefitCase> {};

// covers W-17 (A -> B -> A bit-exact) and W-16 (live buffers do not move) at the model level
TEST_P(Qwen3Refit, ForwardSeesEveryApplyAndRestoresBitExactly) {
  const RefitCase& c = GetParam();
  LoadOptions opt;
  if (!c.quantization.empty()) opt.quantization = *parse_format(c.quantization);
  auto m = load_model(MXQ_SOURCE_DIR "/tests/golden/" + c.checkpoint, opt);
  ASSERT_TRUE(m) << m.error().message;
  auto backend = make_cpu_backend(1);
  auto model = Qwen3Model::create(m->config, m->store, *backend);
  ASSERT_TRUE(model);
  const QTensor& t = m->store.at(c.tensor);
  const uint8_t* where = t.values.data();
  const std::vector<uint8_t> a_values(t.values.begin(), t.values.end()),
      a_scales(t.scales.begin(), t.scales.end());
  const std::vector<float> a = last_logits(*model);

  // B: every value byte of the tensor rotated by one position (same multiset of codes, so no NaN appears).
  std::vector<uint8_t> b_values(a_values.size());
  std::rotate_copy(a_values.begin(), a_values.begin() + 1, a_values.end(), b_values.begin());
  ASSERT_TRUE(m->store.apply_tensor(c.tensor, b_values, a_scales));
  const std::vector<float> b = last_logits(*model);
  EXPECT_NE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "the forward ignored the update";

  ASSERT_TRUE(m->store.apply_tensor(c.tensor, a_values, a_scales));
  const std::vector<float> again = last_logits(*model);
  EXPECT_EQ(std::memcmp(a.data(), again.data(), a.size() * sizeof(float)), 0)
      << "A -> B -> A is not bit-exact";
  EXPECT_EQ(t.values.data(), where) << "live buffers moved";
}

INSTANTIATE_TEST_SUITE_P(
    Tensors, Qwen3Refit,
    ::testing::Values(RefitCase{"ckpt/qwen3-dense-bf16", "", "model.layers.1.self_attn.q_norm.weight"},
                      RefitCase{"ckpt/ct-mxfp4", "", "model.layers.0.mlp.down_proj.weight"},
                      RefitCase{"ckpt/qwen3-dense-bf16", "mxfp8", "model.layers.0.self_attn.o_proj.weight"},
                      RefitCase{"model/ckpt/qwen3-moe-f32-stacked", "",
                                "model.layers.0.mlp.experts.gate_up_proj"},
                      RefitCase{"model/ckpt/qwen3-dense-f32", "", "model.embed_tokens.weight"}),
    [](const auto& i) { return std::to_string(i.index); });

}  // namespace
}  // namespace mxq
