// Writer tests: byte-for-byte equality with the file the python safetensors library wrote for the same
// tensors (tests/golden/make_safetensors_golden.py), determinism, round trip through the reader, refusals.
#include "io/safetensors_writer.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "io/safetensors.h"

namespace mxq {
namespace {

namespace fs = std::filesystem;

class ScopedTempDir {
 public:
  ScopedTempDir() {
    std::string tmpl = (fs::temp_directory_path() / "mxq_stw_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data()) != nullptr ? tmpl : "";
  }
  ~ScopedTempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  size_t entries() const { return static_cast<size_t>(std::distance(fs::directory_iterator(path_), {})); }

 private:
  std::string path_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<uint8_t> unhex(const std::string& hex) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

struct Golden {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorToWrite> tensors;
  std::map<std::string, std::string> metadata;
};

Golden load_golden_tensors() {
  const nlohmann::json j =
      nlohmann::json::parse(read_file(MXQ_SOURCE_DIR "/tests/golden/safetensors/all_dtypes.json"));
  Golden g;
  g.metadata = j["metadata"].get<std::map<std::string, std::string>>();
  g.storage.reserve(j["tensors"].size());
  for (const auto& [name, t] : j["tensors"].items()) {
    g.storage.push_back(unhex(t["hex"].get<std::string>()));
    Result<Dtype> d = parse_dtype(t["dtype"].get<std::string>());
    EXPECT_TRUE(d.has_value());
    g.tensors.push_back(
        {name, d.value_or(Dtype::kU8), t["shape"].get<std::vector<int64_t>>(), g.storage.back()});
  }
  return g;
}

TEST(SafetensorsWriter, ReproducesPythonLibraryFileByteForByte) {
  Golden g = load_golden_tensors();
  ASSERT_EQ(g.tensors.size(), 23u);
  ScopedTempDir dir;
  const std::string out = dir.path() + "/out.safetensors";
  ASSERT_TRUE(write_safetensors(out, g.tensors, g.metadata).has_value());
  const std::string want = read_file(MXQ_SOURCE_DIR "/tests/golden/safetensors/all_dtypes.safetensors");
  const std::string got = read_file(out);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want) << "first difference at byte "
                           << std::distance(got.begin(),
                                            std::mismatch(got.begin(), got.end(), want.begin()).first);
  // Input order does not matter.
  std::reverse(g.tensors.begin(), g.tensors.end());
  ASSERT_TRUE(write_safetensors(out, g.tensors, g.metadata).has_value());
  EXPECT_TRUE(read_file(out) == want);
  EXPECT_EQ(dir.entries(), 1u);  // no temp file left beside it
}

TEST(SafetensorsWriter, RoundTripThroughReader) {
  std::mt19937 rng(7);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorToWrite> tensors;
  const std::vector<std::pair<Dtype, std::vector<int64_t>>> specs = {
      {Dtype::kBF16, {3, 5}},    {Dtype::kU8, {7}},     {Dtype::kF4, {2, 6}},
      {Dtype::kF32, {}},         {Dtype::kI64, {0, 4}}, {Dtype::kF8_E4M3, {4, 32}},
      {Dtype::kF8_E8M0, {4, 1}}, {Dtype::kF64, {3}},    {Dtype::kBool, {1}}};
  storage.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& [dtype, shape] = specs[i];
    Result<uint64_t> n = tensor_nbytes(dtype, shape, "spec");
    ASSERT_TRUE(n.has_value());
    storage.emplace_back(*n);
    for (uint8_t& b : storage.back()) b = static_cast<uint8_t>(rng());
    tensors.push_back({fmt::format("layer.{}.{}", i % 3, dtype_name(dtype)), dtype, shape, storage.back()});
  }
  const std::map<std::string, std::string> meta = {
      {"z", "last"}, {"a", "first \"quoted\"\n"}, {"format", "pt"}};
  ScopedTempDir dir;
  const std::string path = dir.path() + "/rt.safetensors";
  ASSERT_TRUE(write_safetensors(path, tensors, meta).has_value());
  Result<SafetensorsFile> f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.has_value()) << f.error().message;
  EXPECT_EQ(f->metadata(), meta);
  EXPECT_EQ(f->data_offset() % 8, 0u);
  for (const TensorToWrite& t : tensors) {
    const TensorEntry* e = f->find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    EXPECT_EQ(e->dtype, t.dtype);
    EXPECT_EQ(e->shape, t.shape);
    // Larger dtypes first: every tensor starts at a multiple of its element size in the file.
    EXPECT_EQ((f->data_offset() + e->begin) % std::max(1, dtype_bits(e->dtype) / 8), 0u) << t.name;
    std::vector<uint8_t> got(e->nbytes());
    ASSERT_TRUE(f->read(*e, got).has_value());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), t.bytes.begin(), t.bytes.end())) << t.name;
  }
  const std::string first = read_file(path);
  ASSERT_TRUE(write_safetensors(path, tensors, meta).has_value());
  EXPECT_TRUE(read_file(path) == first);  // deterministic
}

TEST(SafetensorsWriter, EmptyFileHasPaddedHeader) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/e.safetensors";
  ASSERT_TRUE(write_safetensors(path, {}, {}).has_value());
  EXPECT_EQ(read_file(path), std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
}

struct WriterBadCase {
  std::string name;
  TensorToWrite tensor;
  std::string expect;
};
void PrintTo(const WriterBadCase& c, std::ostream* os) {
  *os << c.name << " (expects \"" << c.expect << "\")";
}

const uint8_t kFour[4] = {1, 2, 3, 4};

class SafetensorsWriterRefuses : public ::testing::TestWithParam<WriterBadCase> {};

TEST_P(SafetensorsWriterRefuses, ByNameAndLeavesNoFile) {
  const WriterBadCase& c = GetParam();
  ScopedTempDir dir;
  const std::string path = dir.path() + "/bad.safetensors";
  const std::vector<TensorToWrite> tensors = {c.tensor};
  Status s = write_safetensors(path, tensors, {});
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message.find(c.expect), std::string::npos) << s.error().message;
  EXPECT_EQ(dir.entries(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SafetensorsWriterRefuses,
    ::testing::Values(
        WriterBadCase{
            "size_mismatch", {"w", Dtype::kF32, {2}, kFour}, "w: byte count for F32 2, expected 8, got 4"},
        WriterBadCase{"f4_odd", {"p", Dtype::kF4, {3}, std::span(kFour, 2)}, "do not fill whole bytes"},
        WriterBadCase{"empty_name", {"", Dtype::kU8, {4}, kFour}, "empty tensor name"},
        WriterBadCase{"metadata_name", {"__metadata__", Dtype::kU8, {4}, kFour}, "tensor named __metadata__"},
        WriterBadCase{
            "nul_name", {std::string("a\0b", 3), Dtype::kU8, {4}, kFour}, "a\\x00b: name contains NUL"},
        WriterBadCase{"bad_utf8_name", {"w\xff", Dtype::kU8, {4}, kFour}, "tensor w\\xff: not valid UTF-8"},
        WriterBadCase{"negative_dim", {"n", Dtype::kU8, {-4}, kFour}, "expected dimensions >= 0, got -4"},
        WriterBadCase{
            "bad_dtype", {"d", static_cast<Dtype>(200), {4}, kFour}, "d: dtype, expected an enumerator"},
        WriterBadCase{"rank_17",
                      {"r", Dtype::kU8, std::vector<int64_t>(17, 1), std::span(kFour, 1)},
                      "r: rank, expected at most 16, got 17"}),
    [](const auto& info) { return info.param.name; });

TEST(SafetensorsWriter, RefusesDuplicatesBadMetadataAndMissingDirectory) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/x.safetensors";
  const std::vector<TensorToWrite> dup = {{"a", Dtype::kU8, {4}, kFour}, {"a", Dtype::kI8, {4}, kFour}};
  Status s = write_safetensors(path, dup, {});
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message.find("duplicate tensor a"), std::string::npos) << s.error().message;

  const std::vector<TensorToWrite> one = {{"a", Dtype::kU8, {4}, kFour}};
  s = write_safetensors(path, one, {{"k", "bad \xc3"}});
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message.find("__metadata__: not valid UTF-8"), std::string::npos) << s.error().message;
  EXPECT_EQ(dir.entries(), 0u);

  s = write_safetensors(dir.path() + "/no/such/dir/x.safetensors", one, {});
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message.find("cannot create a temporary file"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace mxq
