// make_checkpoint_delta on the committed default model and golden checkpoints: an unchanged model gives empty
// sparse records, and what the trainer side must refuse is refused by name.
#include "refit/checkpoint_delta.h"

#include <gtest/gtest.h>

namespace mxq::refit {
namespace {

struct ModelCase {
  std::string name, dir;
  Format quantization;
};
void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.name; }
class CheckpointDeltaUnchanged : public ::testing::TestWithParam<ModelCase> {};

TEST_P(CheckpointDeltaUnchanged, OnlyEmptyRecordsThatValidate) {
  const std::string dir = std::string(MXQ_SOURCE_DIR) + GetParam().dir;
  const Format q = GetParam().quantization;
  auto d = make_checkpoint_delta(dir, dir, {q, 5, 6, false, 1});
  ASSERT_TRUE(d) << d.error().message;
  ASSERT_FALSE(d->tensors.empty());
  int quantized = 0;
  TensorTable table;
  for (const TensorDelta& t : d->tensors) {
    EXPECT_FALSE(t.anchor) << t.name;
    EXPECT_TRUE(t.values.indices.empty() && t.scales.indices.empty()) << t.name;
    quantized += t.format == q;
    table[t.name] = {t.format, t.shape};
  }
  EXPECT_GT(quantized, 0);
  EXPECT_TRUE(validate_delta(*d, table, 5));
}

INSTANTIATE_TEST_SUITE_P(
    Models, CheckpointDeltaUnchanged,
    ::testing::Values(ModelCase{"default_mxfp4", "/models/default", Format::kMXFP4},
                      ModelCase{"dense_mxfp8", "/tests/golden/ckpt/qwen3-dense-bf16", Format::kMXFP8},
                      // stacked [E, N, K] experts: FP8-B128 blocks are cut per expert
                      ModelCase{"moe_fp8_b128", "/tests/golden/ckpt/qwen3-moe-bf16", Format::kFP8_B128}),
    [](const auto& info) { return info.param.name; });

struct RefusalCase {
  std::string name, base, target;
  Format quantization;
  std::string expect;
};
void PrintTo(const RefusalCase& c, std::ostream* os) { *os << c.name; }
class CheckpointDeltaRefusal : public ::testing::TestWithParam<RefusalCase> {};

TEST_P(CheckpointDeltaRefusal, NamesTheCause) {
  const RefusalCase& c = GetParam();
  auto d = make_checkpoint_delta(std::string(MXQ_SOURCE_DIR) + c.base, std::string(MXQ_SOURCE_DIR) + c.target,
                                 {c.quantization, 0, 1, false, 1});
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find(c.expect), std::string::npos) << d.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    Bad, CheckpointDeltaRefusal,
    ::testing::Values(RefusalCase{"plain_quantization", "/models/default", "/models/default", Format::kBF16,
                                  "expected mxfp8"},
                      RefusalCase{"quantized_base", "/tests/golden/ckpt/ct-mxfp8",
                                  "/tests/golden/ckpt/ct-mxfp8", Format::kMXFP8, "already quantized"},
                      RefusalCase{"missing_target", "/models/default", "/models/absent", Format::kMXFP8,
                                  "absent"},
                      // covers W-07 / W-08 on the trainer side: the target is another model
                      RefusalCase{"other_model", "/models/default", "/tests/golden/ckpt/qwen3-dense-bf16",
                                  Format::kMXFP8, "target"}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace mxq::refit
