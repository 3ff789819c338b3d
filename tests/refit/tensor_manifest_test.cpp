// plan_manifest, the host half of /update_weights_from_tensor: a manifest is checked against the engine's
// tensor table before the buffer is read, and every refusal names the tensor and field (W-03, W-07, W-08).
#include "refit/tensor_manifest.h"

#include <gtest/gtest.h>

#include <functional>

namespace mxq::refit {
namespace {

// An 8B-like slice: a quantized projection, stacked experts, a plain norm.
const TensorTable kTable = {
    {"model.layers.0.mlp.up_proj.weight", {Format::kMXFP8, {64, 128}}},
    {"model.layers.0.mlp.experts.gate_up_proj", {Format::kMXFP4, {2, 8, 64}}},
    {"model.norm.weight", {Format::kBF16, {64}}},
};

// bf16 sources for the quantized tensors, the norm as it is, packed at 16-byte offsets.
TensorManifest good() {
  TensorManifest m;
  m.tensors = {{"model.layers.0.mlp.up_proj.weight", Format::kBF16, {64, 128}, 0, 0, {}},
               {"model.layers.0.mlp.experts.gate_up_proj", Format::kBF16, {2, 8, 64}, 16384, 0, {}},
               {"model.norm.weight", Format::kBF16, {64}, 16384 + 2048, 0, {}}};
  m.size = 16384 + 2048 + 128;
  return m;
}

TEST(PlanManifest, SourcesAreQuantizedAndPlainTensorsCopied) {
  auto plan = plan_manifest(good(), kTable);
  ASSERT_TRUE(plan) << plan.error().message;
  ASSERT_EQ(plan->size(), 3u);
  EXPECT_TRUE((*plan)[0].quantize);
  EXPECT_EQ((*plan)[0].source_bytes, 64u * 128 * 2);
  EXPECT_EQ((*plan)[0].planes[0].bytes, 64 * 128);
  EXPECT_EQ((*plan)[0].planes[1].bytes, 64 * 4);
  EXPECT_TRUE((*plan)[1].quantize);
  EXPECT_EQ((*plan)[1].planes[0].bytes, 2 * 8 * 32);  // two E2M1 per byte
  EXPECT_FALSE((*plan)[2].quantize);
  EXPECT_EQ((*plan)[2].source_bytes, 128u);
}

TEST(PlanManifest, CanonicalPlanesInTheLiveFormat) {
  TensorManifest m = good();
  m.tensors[0] = {"model.layers.0.mlp.up_proj.weight", Format::kMXFP8, {64, 128}, 0, 8192, 0x1234};
  auto plan = plan_manifest(m, kTable);
  ASSERT_TRUE(plan) << plan.error().message;
  EXPECT_FALSE((*plan)[0].quantize);
  EXPECT_EQ((*plan)[0].source_bytes, 8192u);
}

struct Refusal {
  std::string name;
  std::string needle;  // the message must contain it
  std::function<void(TensorManifest&)> spoil;
};
void PrintTo(const Refusal& r, std::ostream* os) { *os << r.name; }

class PlanManifestRefuses : public ::testing::TestWithParam<Refusal> {};

TEST_P(PlanManifestRefuses, ByName) {
  TensorManifest m = good();
  GetParam().spoil(m);
  auto plan = plan_manifest(m, kTable);
  ASSERT_FALSE(plan);
  EXPECT_NE(plan.error().message.find(GetParam().needle), std::string::npos) << plan.error().message;
  EXPECT_EQ(plan.error().message.find('\n'), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PlanManifestRefuses,
    ::testing::Values(
        // covers W-07
        Refusal{"missing", "1 missing [model.norm.weight]", [](TensorManifest& m) { m.tensors.pop_back(); }},
        Refusal{"unknown", "1 unknown [model.norm.bias]",
                [](TensorManifest& m) { m.tensors[2].name = "model.norm.bias"; }},
        Refusal{"duplicated", "1 duplicated", [](TensorManifest& m) { m.tensors.push_back(m.tensors[2]); }},
        // covers W-08
        Refusal{"cast", "model.norm.weight: manifest dtype f32, the live tensor is bf16 (W-08",
                [](TensorManifest& m) { m.tensors[2].dtype = Format::kF32; }},
        Refusal{"other_quantized_format", "manifest dtype mxfp4, the live tensor is mxfp8",
                [](TensorManifest& m) { m.tensors[0].dtype = Format::kMXFP4; }},
        Refusal{"shape", "manifest shape [128, 64], the live tensor is [64, 128] (W-08)",
                [](TensorManifest& m) { m.tensors[0].shape = {128, 64}; }},
        // covers W-03
        Refusal{"past_the_end", "run past the buffer's", [](TensorManifest& m) { m.size -= 16; }},
        Refusal{"scales_past_the_end", "scales_offset",
                [](TensorManifest& m) {
                  m.tensors[0] = {"model.layers.0.mlp.up_proj.weight", Format::kMXFP8, {64, 128}, 0, 18432, {}};
                }},
        Refusal{"unaligned", "offset 8 is not a multiple of 16", [](TensorManifest& m) { m.tensors[0].offset = 8; }},
        Refusal{"unaligned_ipc_offset", "ipc_offset 4", [](TensorManifest& m) { m.ipc_offset = 4; }},
        Refusal{"offset_overflow", "run past the buffer's",
                [](TensorManifest& m) { m.tensors[2].offset = ~uint64_t{0} - 15; }},
        Refusal{"scales_for_a_source", "scales_offset given for bf16 source weights",
                [](TensorManifest& m) { m.tensors[0].scales_offset = 16; }}),
    [](const auto& i) { return i.param.name; });

TEST(ManifestDtype, TorchAndMxqNames) {
  EXPECT_EQ(*parse_manifest_dtype("bfloat16"), Format::kBF16);
  EXPECT_EQ(*parse_manifest_dtype("bf16"), Format::kBF16);
  EXPECT_EQ(*parse_manifest_dtype("float32"), Format::kF32);
  EXPECT_EQ(*parse_manifest_dtype("fp8-b128"), Format::kFP8_B128);
  auto bad = parse_manifest_dtype("e4m3");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("dtype \"e4m3\""), std::string::npos);
}

}  // namespace
}  // namespace mxq::refit
