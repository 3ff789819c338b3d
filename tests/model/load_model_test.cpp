// Loading: every scheme's bytes reach the store, online quantization reproduces checkpoints written by other
// tools, and bad checkpoints are refused by name.
#include "model/load_model.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/cpu_backend.h"
#include "model/qwen3.h"

namespace mxq {
namespace {

namespace fs = std::filesystem;
const std::string kCkpt = MXQ_SOURCE_DIR "/tests/golden/ckpt/";

// Online quantization of the bf16 checkpoint against the same model quantized by another tool
// (make_checkpoints.py: ModelOpt's MXFP8 export rule, compressed-tensors' MXFP4, DeepSeek's block FP8):
// every projection both quantize must hold identical bytes in both planes.
struct OnlineCase {
  Format format;
  std::string reference;
};
void PrintTo(const OnlineCase& c, std::ostream* os) { *os << traits(c.format).name << " vs " << c.reference; }

class OnlineQuantization : public ::testing::TestWithParam<OnlineCase> {};

TEST_P(OnlineQuantization, BytesEqualTheOtherToolsCheckpoint) {
  const OnlineCase& c = GetParam();
  auto online = load_model(kCkpt + "qwen3-dense-bf16", LoadOptions{c.format, 0, {}});
  ASSERT_TRUE(online) << online.error().message;
  auto stored = load_model(kCkpt + c.reference);
  ASSERT_TRUE(stored) << stored.error().message;
  int compared = 0;
  for (const auto& [name, ref] : stored->store.tensors()) {
    if (!is_quantized(ref.format)) continue;  // modules the reference left unquantized
    const QTensor& got = online->store.at(name);
    ASSERT_EQ(got.format, ref.format) << name;
    EXPECT_TRUE(std::equal(got.values.begin(), got.values.end(), ref.values.begin(), ref.values.end()))
        << name;
    EXPECT_TRUE(std::equal(got.scales.begin(), got.scales.end(), ref.scales.begin(), ref.scales.end()))
        << name;
    EXPECT_EQ(got.checksum, ref.checksum) << name;
    ++compared;
  }
  EXPECT_GE(compared, 7) << "a dense 2-layer model has 14 projections";
}

INSTANTIATE_TEST_SUITE_P(Schemes, OnlineQuantization,
                         ::testing::Values(OnlineCase{Format::kMXFP8, "modelopt-mxfp8"},
                                           OnlineCase{Format::kMXFP4, "ct-mxfp4"},
                                           OnlineCase{Format::kFP8_B128, "fp8-b128"}),
                         [](const auto& i) {
                           return std::string(i.param.reference == "ct-mxfp4"   ? "ct_mxfp4"
                                              : i.param.reference == "fp8-b128" ? "fp8_b128"
                                                                                : "modelopt_mxfp8");
                         });

// Online quantization == loading what `mxq quantize` wrote: every QTensor's planes byte for byte. The binary
// sits beside this test binary in the build directory.
struct QuantizeCliCase {
  std::string checkpoint, to;
};
void PrintTo(const QuantizeCliCase& c, std::ostream* os) { *os << c.checkpoint << " --to " << c.to; }

class OnlineEqualsQuantizeCli : public ::testing::TestWithParam<QuantizeCliCase> {};

TEST_P(OnlineEqualsQuantizeCli, EveryTensorByteIdentical) {
  const QuantizeCliCase& c = GetParam();
  const fs::path mxq = fs::read_symlink("/proc/self/exe").parent_path() / "mxq";
  ASSERT_TRUE(fs::exists(mxq)) << mxq;
  const fs::path out =
      fs::path(::testing::TempDir()) / ("mxq_q_" + c.to + "_" + fs::path(c.checkpoint).filename().string());
  fs::remove_all(out);
  const std::string src = MXQ_SOURCE_DIR "/tests/golden/" + c.checkpoint;
  const std::string cmd =
      fmt::format("'{}' quantize --to {} '{}' '{}' >/dev/null 2>&1", mxq.string(), c.to, src, out.string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  auto written = load_model(out.string());
  ASSERT_TRUE(written) << written.error().message;
  auto online = load_model(src, LoadOptions{*parse_format(c.to), 0, {}});
  ASSERT_TRUE(online) << online.error().message;
  ASSERT_EQ(written->store.tensors().size(), online->store.tensors().size());
  for (const auto& [name, w] : written->store.tensors()) {
    const QTensor* o = online->store.find(name);
    ASSERT_NE(o, nullptr) << name;
    EXPECT_EQ(o->format, w.format) << name;
    EXPECT_TRUE(std::equal(o->values.begin(), o->values.end(), w.values.begin(), w.values.end())) << name;
    EXPECT_TRUE(std::equal(o->scales.begin(), o->scales.end(), w.scales.begin(), w.scales.end())) << name;
  }
  fs::remove_all(out);
}

INSTANTIATE_TEST_SUITE_P(Cases, OnlineEqualsQuantizeCli,
                         ::testing::Values(QuantizeCliCase{"ckpt/qwen3-dense-bf16", "mxfp8"},
                                           QuantizeCliCase{"ckpt/qwen3-dense-bf16", "mxfp4"},
                                           QuantizeCliCase{"ckpt/qwen3-dense-bf16", "fp8-b128"},
                                           QuantizeCliCase{"ckpt/qwen3-moe-bf16", "mxfp8"},
                                           QuantizeCliCase{"model/ckpt/qwen3-moe-f32-stacked", "mxfp4"},
                                           QuantizeCliCase{"model/ckpt/qwen3-dense-f32", "fp8-b128"}),
                         [](const auto& i) { return std::to_string(i.index); });

// A copy of a golden checkpoint with config.json edited, refused with a message naming the problem.
struct BadCase {
  std::string name;
  std::string source;
  nlohmann::json patch;  // merged into config.json
  std::string quantization;
  std::string expect;  // substring of the error
};
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name << ": " << c.patch.dump(); }

class BadCheckpoint : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadCheckpoint, RefusedByName) {
  const BadCase& c = GetParam();
  const fs::path dir = fs::path(::testing::TempDir()) / ("mxq_bad_" + c.name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& f : fs::directory_iterator(kCkpt + c.source))
    fs::copy(f.path(), dir / f.path().filename());
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  cfg.merge_patch(c.patch);
  std::ofstream(dir / "config.json") << cfg.dump(2);

  LoadOptions opt;
  if (!c.quantization.empty()) opt.quantization = *parse_format(c.quantization);
  auto m = load_model(dir.string(), opt);
  std::string error;
  if (!m) {
    error = m.error().message;
  } else {
    auto backend = make_cpu_backend(1);
    auto q = Qwen3Model::create(m->config, m->store, *backend);
    ASSERT_FALSE(q) << "loaded and built a model from a bad checkpoint";
    error = q.error().message;
  }
  EXPECT_NE(error.find(c.expect), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << "one line: " << error;
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadCheckpoint,
    ::testing::Values(
        BadCase{"unknown_architecture",
                "qwen3-dense-bf16",
                {{"architectures", {"LlamaForCausalLM"}}},
                "",
                "LlamaForCausalLM"},
        // covers L-21
        BadCase{"missing_tensor", "qwen3-dense-bf16", {{"num_hidden_layers", 3}}, "", "model.layers.2."},
        BadCase{"shape_mismatch", "qwen3-dense-bf16", {{"intermediate_size", 96}}, "", "expected [96, 64]"},
        BadCase{
            "moe_shape_mismatch", "qwen3-moe-bf16", {{"moe_intermediate_size", 32}}, "", "expected [32, 64]"},
        BadCase{
            "tied_but_lm_head_shape", "qwen3-dense-bf16", {{"vocab_size", 300}}, "", "expected [300, 64]"},
        BadCase{"requantize_quantized", "ct-mxfp8", nlohmann::json::object(), "mxfp4", "already quantized"},
        BadCase{"rope_type",
                "qwen3-dense-bf16",
                {{"rope_parameters",
                  {{"rope_type", "yarn"},
                   {"factor", 4.0},
                   {"rope_theta", 10000.0},
                   {"original_max_position_embeddings", 512}}}},
                "",
                "yarn"}),
    [](const auto& i) { return i.param.name; });

}  // namespace
}  // namespace mxq
