// Loading: every scheme's bytes reach the store, online quantization reproduces checkpoints written by other
// tools, and bad checkpoints are refused by name.
#include "model/load_model.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "format/codec.h"
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

// covers N-15 as it applies to mxq: a quantized checkpoint is never dequantized and requantized (its planes are
// loaded as stored; requantizing one is refused by name, BadCase requantize_quantized), so the hazard left is
// our quantizer vs the trainer-side library's on the same real bf16 weights: identical bytes, checked here.
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

// Copies a safetensors file with its header JSON replaced by edit(header, data bytes) and `extra` bytes
// appended to the data.
void rewrite_header(const fs::path& from, const fs::path& to,
                    const std::function<nlohmann::json(const nlohmann::json&, const std::string&)>& edit,
                    const std::string& extra = "") {
  std::ifstream in(from, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), {});
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  const std::string data = file.substr(8 + n);
  std::string text = edit(nlohmann::json::parse(file.substr(8, n)), data).dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t len = text.size();
  std::ofstream out(to, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << text << data << extra;
}

// Issue 22: compressed-tensors FP8_BLOCK (float-quantized, strategy block [128, 128]) is quant_method fp8's
// math with weight_scale (BF16 multiplier) for weight_scale_inv. The golden (make_ct_fp8_block_golden.py)
// rewritten as quant_method fp8 (same bytes, tensors renamed to weight_scale_inv) must load to identical
// planes, and each scale plane is the file's BF16 widened to f32 (exact).
TEST(LoadCtFp8Block, PlanesEqualTheQuantMethodFp8Path) {
  const fs::path src = kCkpt + "ct-fp8-block";
  auto ct = load_model(src.string());
  ASSERT_TRUE(ct) << ct.error().message;
  EXPECT_EQ(ct->scheme, SchemeKind::kCtFp8Block128);
  EXPECT_EQ(ct->linear_format, Format::kFP8_B128);
  EXPECT_EQ(ct->activations, Format::kFP8_B128);

  const fs::path dir = fs::path(::testing::TempDir()) / "mxq_ct_fp8_block_as_fp8";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy(src / "generation_config.json", dir / "generation_config.json");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src / "config.json"));
  cfg["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                                {"weight_block_size", {128, 128}}, {"modules_to_not_convert", {"lm_head"}}};
  std::ofstream(dir / "config.json") << cfg.dump(2);
  std::map<std::string, std::vector<uint8_t>> bf16_scales;
  rewrite_header(src / "model.safetensors", dir / "model.safetensors",
                 [&](const nlohmann::json& header, const std::string& data) {
                   nlohmann::json renamed;
                   for (const auto& [name, m] : header.items()) {
                     if (!name.ends_with(".weight_scale")) {
                       renamed[name] = m;
                       continue;
                     }
                     renamed[name + "_inv"] = m;
                     const auto b = m["data_offsets"][0].get<size_t>(), e = m["data_offsets"][1].get<size_t>();
                     bf16_scales[name] = std::vector<uint8_t>(data.begin() + b, data.begin() + e);
                   }
                   return renamed;
                 });
  auto fp8 = load_model(dir.string());
  ASSERT_TRUE(fp8) << fp8.error().message;
  EXPECT_EQ(fp8->scheme, SchemeKind::kFp8Block128);

  int compared = 0;
  for (const auto& [name, ref] : fp8->store.tensors()) {
    const QTensor& got = ct->store.at(name);
    ASSERT_EQ(got.format, ref.format) << name;
    EXPECT_TRUE(std::equal(got.values.begin(), got.values.end(), ref.values.begin(), ref.values.end())) << name;
    EXPECT_TRUE(std::equal(got.scales.begin(), got.scales.end(), ref.scales.begin(), ref.scales.end())) << name;
    if (ref.format != Format::kFP8_B128) continue;
    const std::string module = name.substr(0, name.size() - std::string_view(".weight").size());
    const std::vector<uint8_t>& bf16 = bf16_scales.at(module + ".weight_scale");
    ASSERT_EQ(got.scales.size(), bf16.size() * 2) << name;
    for (size_t i = 0; i < bf16.size() / 2; ++i) {
      uint16_t h;
      float f;
      std::memcpy(&h, bf16.data() + 2 * i, 2);
      std::memcpy(&f, got.scales.data() + 4 * i, 4);
      EXPECT_EQ(f, bf16_to_f32(h)) << name << " scale " << i;
    }
    ++compared;
  }
  EXPECT_EQ(compared, 14) << "a dense 2-layer model has 14 projections";
  fs::remove_all(dir);
}

// Issue 22: a compressed-tensors checkpoint declaring dynamic MXFP8 input_activations (the MXFP8 preset)
// carries the declaration to the loaded model, which --activation-quant auto runs (W8A8).
TEST(LoadActivations, DeclaredMxfp8InputActivationsReachTheModel) {
  auto plain = load_model(kCkpt + "ct-mxfp8");
  ASSERT_TRUE(plain) << plain.error().message;
  EXPECT_EQ(plain->activations, Format::kBF16);
  const fs::path dir = fs::path(::testing::TempDir()) / "mxq_ct_mxfp8_w8a8";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& f : fs::directory_iterator(kCkpt + "ct-mxfp8")) fs::copy(f.path(), dir / f.path().filename());
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  cfg["quantization_config"]["config_groups"]["group_0"]["input_activations"] = {
      {"dynamic", true},      {"group_size", 32},     {"num_bits", 8},
      {"scale_dtype", "torch.uint8"}, {"strategy", "group"}, {"symmetric", true}, {"type", "float"}};
  std::ofstream(dir / "config.json") << cfg.dump(2);
  auto w8a8 = load_model(dir.string());
  ASSERT_TRUE(w8a8) << w8a8.error().message;
  EXPECT_EQ(w8a8->activations, Format::kMXFP8);
  fs::remove_all(dir);
}

// Issue 22: control characters from config strings and tensor names reached error lines raw (multi-line
// messages, terminal escapes), and a 1 MB config value was echoed whole. Each message is one line, escaped,
// and bounded.
TEST(LoadUntrustedStrings, MessagesAreOneLineEscapedAndBounded) {
  const fs::path src = kCkpt + "qwen3-dense-bf16";
  const std::string huge(size_t{1} << 20, 'x');
  struct Case {
    std::string name;
    nlohmann::json patch;
    std::string extra_tensor;  // added to the header: BF16 [1], two zero bytes after the data
    std::string expect;
  };
  const Case cases[] = {
      {"arch_escape", {{"architectures", {"Qwen3\n\x1b[31mX"}}}, "",
       "architecture \"Qwen3\\x0a\\x1b[31mX\" (model_type \"qwen3\") is not supported"},
      {"huge_int_value", {{"hidden_size", huge}}, "", "hidden_size: expected an integer, got string \"xxx"},
      {"huge_theta", {{"rope_parameters", {{"rope_theta", huge}, {"rope_type", "default"}}}}, "",
       "rope_parameters.rope_theta: expected a number"},
      {"huge_arch", {{"architectures", {huge}}}, "", "...(1048576 bytes)"},
      {"tensor_name_newline", nlohmann::json::object(), "lm_head\n\x1b[2J.weight", "lm_head\\x0a\\x1b[2J.weight"},
  };
  for (const Case& c : cases) {
    const fs::path dir = fs::path(::testing::TempDir()) / ("mxq_untrusted_" + c.name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src / "config.json"));
    cfg.merge_patch(c.patch);
    std::ofstream(dir / "config.json") << cfg.dump(2);
    rewrite_header(src / "model.safetensors", dir / "model.safetensors",
                   [&](const nlohmann::json& header, const std::string& data) {
                     nlohmann::json h = header;
                     const size_t end = data.size();
                     if (!c.extra_tensor.empty())
                       h[c.extra_tensor] = {{"dtype", "BF16"}, {"shape", {1}}, {"data_offsets", {end, end + 2}}};
                     return h;
                   },
                   c.extra_tensor.empty() ? "" : std::string(2, '\0'));
    auto m = load_model(dir.string());
    ASSERT_FALSE(m) << c.name;
    const std::string& e = m.error().message;
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.name << ": " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << c.name << ": " << e;
    EXPECT_EQ(e.find('\x1b'), std::string::npos) << c.name << ": " << e;
    EXPECT_LT(e.size(), 1000u) << c.name;
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace mxq
