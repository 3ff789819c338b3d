// Checkpoint directory tests: single file, index + shards, several files without an index, and the L-20 /
// L-21 refusals (tables of directory layouts written to temp dirs).
#include "io/checkpoint.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "io/safetensors_writer.h"

namespace mxq {
namespace {

namespace fs = std::filesystem;

class ScopedTempDir {
 public:
  ScopedTempDir() {
    std::string tmpl = (fs::temp_directory_path() / "mxq_ck_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data()) != nullptr ? tmpl : "";
  }
  ~ScopedTempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Two bytes per tensor that differ between names, so a read from the wrong file shows.
std::vector<uint8_t> bytes_of(const std::string& name) {
  return {static_cast<uint8_t>(name.size()), static_cast<uint8_t>(name.empty() ? 0 : name.back())};
}

// file name -> tensor names (each U8 [2]); a file whose only "name" is "!garbage" gets invalid bytes.
using Layout = std::map<std::string, std::vector<std::string>>;

void make_dir(const std::string& dir, const Layout& files, const std::optional<std::string>& index) {
  for (const auto& [file, names] : files) {
    const std::string path = dir + "/" + file;
    if (names == std::vector<std::string>{"!garbage"}) {
      std::ofstream(path, std::ios::binary) << "not a safetensors file";
      continue;
    }
    std::vector<std::vector<uint8_t>> storage;
    storage.reserve(names.size());
    std::vector<TensorToWrite> tensors;
    for (const std::string& n : names) {
      storage.push_back(bytes_of(n));
      tensors.push_back({n, Dtype::kU8, {2}, storage.back()});
    }
    ASSERT_TRUE(write_safetensors(path, tensors, {}).has_value());
  }
  if (index) std::ofstream(dir + "/" + std::string(kIndexFileName)) << *index;
}

std::string weight_map(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string s = R"({"metadata":{"total_size":8},"weight_map":{)";
  for (size_t i = 0; i < entries.size(); ++i) {
    s += fmt::format("{}\"{}\":\"{}\"", i ? "," : "", entries[i].first, entries[i].second);
  }
  return s + "}}";
}

struct DirCase {
  std::string id;
  std::string name;
  Layout files;
  std::optional<std::string> index;
  std::string expect;                             // "" = opens; otherwise a substring of the error
  std::map<std::string, std::string> owner = {};  // tensor -> file it must come from (when it opens)
};

void PrintTo(const DirCase& c, std::ostream* os) {
  *os << c.id << " " << c.name << " (" << c.files.size() << " files" << (c.index ? ", index" : "") << ")";
}

const std::string kS1 = "model-00001-of-00002.safetensors";
const std::string kS2 = "model-00002-of-00002.safetensors";

std::vector<DirCase> dir_cases() {
  return {
      {"valid",
       "single_file",
       {{"model.safetensors", {"a", "b"}}},
       std::nullopt,
       "",
       {{"a", "model.safetensors"}, {"b", "model.safetensors"}}},
      // transformers' rule: model.safetensors wins over any other file (e.g. Mistral's
      // consolidated.safetensors)
      {"valid",
       "single_file_beside_others",
       {{"model.safetensors", {"a"}}, {"consolidated.safetensors", {"a", "z"}}},
       std::nullopt,
       "",
       {{"a", "model.safetensors"}}},
      {"valid",
       "index_and_shards",
       {{kS1, {"a", "b"}}, {kS2, {"c"}}},
       weight_map({{"a", kS1}, {"b", kS1}, {"c", kS2}}),
       "",
       {{"a", kS1}, {"b", kS1}, {"c", kS2}}},
      {"valid",
       "index_ignores_unlisted_file",
       {{kS1, {"a"}}, {"consolidated.safetensors", {"a"}}},
       weight_map({{"a", kS1}}),
       "",
       {{"a", kS1}}},
      {"valid",
       "several_files_no_index",
       {{"x.safetensors", {"a"}}, {"y.safetensors", {"b", "c"}}},
       std::nullopt,
       "",
       {{"a", "x.safetensors"}, {"c", "y.safetensors"}}},
      // covers L-17: a tensor name that looks like a path is only a name
      {"L-17",
       "path_like_tensor_name",
       {{"model.safetensors", {"../../model.safetensors", "/etc/passwd"}}},
       std::nullopt,
       "",
       {{"/etc/passwd", "model.safetensors"}}},
      // covers L-20
      {"L-20",
       "missing_shard",
       {{kS1, {"a"}}},
       weight_map({{"a", kS1}, {"b", kS2}}),
       "shard model-00002-of-00002.safetensors is missing"},
      {"L-20",
       "shard_parent_dir",
       {{kS1, {"a"}}},
       weight_map({{"a", "../model.safetensors"}}),
       "a: shard ../model.safetensors, expected a plain file name"},
      {"L-20",
       "shard_subdir",
       {{kS1, {"a"}}},
       weight_map({{"a", "sub/x.safetensors"}}),
       "expected a plain file name"},
      {"L-20",
       "shard_absolute",
       {{kS1, {"a"}}},
       weight_map({{"a", "/tmp/x.safetensors"}}),
       "expected a plain file name"},
      {"L-20", "shard_dotdot", {{kS1, {"a"}}}, weight_map({{"a", ".."}}), "expected a plain file name"},
      {"L-20",
       "shard_not_safetensors",
       {{kS1, {"a"}}},
       weight_map({{"a", "pytorch_model.bin"}}),
       "shard pytorch_model.bin, expected a *.safetensors file"},
      {"L-20",
       "tensor_in_two_shards",
       {{kS1, {"a", "b"}}, {kS2, {"b"}}},
       weight_map({{"a", kS1}, {"b", kS2}}),
       "b: tensor present twice"},
      {"L-20",
       "index_names_tensor_shard_lacks",
       {{kS1, {"a"}}, {kS2, {"c"}}},
       weight_map({{"a", kS1}, {"b", kS1}, {"c", kS2}}),
       "b: listed in shard model-00001-of-00002.safetensors, which lacks it"},
      {"L-20",
       "index_puts_tensor_in_wrong_shard",
       {{kS1, {"a", "d"}}, {kS2, {"c"}}},
       weight_map({{"a", kS2}, {"c", kS2}, {"d", kS1}}),
       "a: listed in shard model-00002-of-00002.safetensors, expected model-00001"},
      {"L-20",
       "shard_tensor_not_in_index",
       {{kS1, {"a", "extra"}}, {kS2, {"c"}}},
       weight_map({{"a", kS1}, {"c", kS2}}),
       "extra: tensor in"},
      {"L-20",
       "several_files_same_tensor",
       {{"x.safetensors", {"a"}}, {"y.safetensors", {"a"}}},
       std::nullopt,
       "y.safetensors: a: tensor present twice, also in"},
      {"L-20",
       "invalid_shard",
       {{kS1, {"a"}}, {kS2, {"!garbage"}}},
       weight_map({{"a", kS1}, {"b", kS2}}),
       "model-00002-of-00002.safetensors: header length too large"},
      // covers L-07 (index)
      {"L-07",
       "duplicate_index_key",
       {{kS1, {"a"}}, {kS2, {"b"}}},
       R"({"weight_map":{"a":")" + kS1 + R"(","a":")" + kS2 + R"("}})",
       "duplicate key a"},
      {"L-07",
       "duplicate_top_level_key",
       {{kS1, {"a"}}},
       R"({"weight_map":{"a":")" + kS1 + R"("},"weight_map":{}})",
       "duplicate key weight_map"},
      // covers L-05 (index)
      {"L-05", "index_not_json", {{kS1, {"a"}}}, std::string("{\"weight_map\":"), "not valid JSON"},
      {"L-05",
       "index_too_deep",
       {{kS1, {"a"}}},
       R"({"metadata":)" + std::string(40, '[') + std::string(40, ']') + R"(,"weight_map":{"a":")" + kS1 +
           "\"}}",
       "nested too deep, expected at most 16 levels"},
      {"L-05",
       "index_without_weight_map",
       {{kS1, {"a"}}},
       std::string(R"({"metadata":{}})"),
       "expected an object with a \"weight_map\" object"},
      {"L-05",
       "weight_map_value_not_string",
       {{kS1, {"a"}}},
       std::string(R"({"weight_map":{"a":1}})"),
       "weight_map: a, expected a shard file name (string), got a number"},
      {"L-05",
       "weight_map_value_object",
       {{kS1, {"a"}}},
       std::string(R"({"weight_map":{"a":{"b":"c"}}})"),
       "weight_map: a, expected a shard file name (string), got an object"},
      {"L-05",
       "weight_map_not_object",
       {{kS1, {"a"}}},
       std::string(R"({"weight_map":["a"]})"),
       "weight_map, expected an object, got an array"},
      {"L-05",
       "index_top_level_array",
       {{kS1, {"a"}}},
       std::string("[]"),
       "expected a JSON object, got an array"},
      {"L-05",
       "index_huge_nesting",
       {{kS1, {"a"}}},
       R"({"metadata":)" + std::string(1000000, '['),
       "nested too deep"},
      {"L-05",
       "empty_weight_map",
       {{kS1, {"a"}}},
       std::string(R"({"weight_map":{}})"),
       "weight_map is empty"},
      {"valid", "empty_directory", {}, std::nullopt, "no checkpoint, expected model.safetensors"},
  };
}

class CheckpointDirs : public ::testing::TestWithParam<DirCase> {};

TEST_P(CheckpointDirs, OpensOrRefusesByName) {
  const DirCase& c = GetParam();
  ScopedTempDir dir;
  make_dir(dir.path(), c.files, c.index);
  Result<Checkpoint> ck = Checkpoint::open(dir.path());
  if (!c.expect.empty()) {
    ASSERT_FALSE(ck.has_value()) << c.name;
    EXPECT_NE(ck.error().message.find(c.expect), std::string::npos) << ck.error().message;
    EXPECT_NE(ck.error().message.find(dir.path()), std::string::npos) << ck.error().message;
    EXPECT_EQ(ck.error().message.find('\n'), std::string::npos);
    return;
  }
  ASSERT_TRUE(ck.has_value()) << ck.error().message;
  for (const auto& [tensor, file] : c.owner) {
    const SafetensorsFile* f = ck->file_of(tensor);
    ASSERT_NE(f, nullptr) << tensor;
    EXPECT_EQ(fs::path(f->path()).filename().string(), file) << tensor;
    std::vector<uint8_t> got(2);
    ASSERT_TRUE(ck->read(tensor, got).has_value());
    EXPECT_EQ(got, bytes_of(tensor));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CheckpointDirs, ::testing::ValuesIn(dir_cases()), [](const auto& info) {
  std::string id = info.param.id;
  id.erase(std::remove(id.begin(), id.end(), '-'), id.end());
  return id + "_" + info.param.name;
});

TEST(Checkpoint, MetaLookupAndRead) {
  ScopedTempDir dir;
  const std::vector<uint8_t> w(2 * 3 * 2, 7), s(2, 0x7f);
  const std::vector<TensorToWrite> shard1 = {{"model.embed_tokens.weight", Dtype::kBF16, {2, 3}, w}};
  const std::vector<TensorToWrite> shard2 = {{"model.norm.weight_scale", Dtype::kF8_E8M0, {2}, s}};
  ASSERT_TRUE(write_safetensors(dir.path() + "/" + kS1, shard1, {}).has_value());
  ASSERT_TRUE(write_safetensors(dir.path() + "/" + kS2, shard2, {}).has_value());
  std::ofstream(dir.path() + "/" + std::string(kIndexFileName))
      << weight_map({{"model.embed_tokens.weight", kS1}, {"model.norm.weight_scale", kS2}});
  Result<Checkpoint> ck = Checkpoint::open(dir.path());
  ASSERT_TRUE(ck.has_value()) << ck.error().message;
  EXPECT_EQ(ck->files().size(), 2u);
  const TensorMetaMap meta = ck->meta();
  ASSERT_EQ(meta.size(), 2u);
  EXPECT_EQ(meta.at("model.embed_tokens.weight").dtype, "BF16");
  EXPECT_EQ(meta.at("model.embed_tokens.weight").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(meta.at("model.norm.weight_scale").dtype, "F8_E8M0");
  ASSERT_NE(ck->find("model.norm.weight_scale"), nullptr);
  EXPECT_EQ(ck->find("model.norm.weight_scale")->nbytes(), 2u);
  EXPECT_EQ(ck->find("nope"), nullptr);
  EXPECT_EQ(ck->file_of("nope"), nullptr);
  std::vector<uint8_t> got(2);
  ASSERT_TRUE(ck->read("model.norm.weight_scale", got).has_value());
  EXPECT_EQ(got, s);
  Status missing = ck->read("nope", got);
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message.find("nope: no such tensor"), std::string::npos);
  // Still valid after a move (entries point into the files, which own them).
  Checkpoint moved = std::move(*ck);
  ASSERT_TRUE(moved.read("model.norm.weight_scale", got).has_value());
  EXPECT_EQ(got, s);
}

// covers L-21
struct NamesCase {
  std::string name;
  std::vector<std::string> required;
  ExtraTensors extra;
  std::string expect;  // "" = passes
};
void PrintTo(const NamesCase& c, std::ostream* os) { *os << c.name << " (expects \"" << c.expect << "\")"; }

class CheckpointNames : public ::testing::TestWithParam<NamesCase> {};

TEST_P(CheckpointNames, RequiredAndExtraTensors) {
  const NamesCase& c = GetParam();
  ScopedTempDir dir;
  make_dir(dir.path(), {{"model.safetensors", {"a", "b", "c"}}}, std::nullopt);
  Result<Checkpoint> ck = Checkpoint::open(dir.path());
  ASSERT_TRUE(ck.has_value()) << ck.error().message;
  Status s = ck->check_names(c.required, c.extra);
  if (c.expect.empty()) {
    EXPECT_TRUE(s.has_value()) << s.error().message;
  } else {
    ASSERT_FALSE(s.has_value());
    EXPECT_NE(s.error().message.find(c.expect), std::string::npos) << s.error().message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CheckpointNames,
    ::testing::Values(NamesCase{"exact", {"a", "b", "c"}, ExtraTensors::kReject, ""},
                      NamesCase{"extra_ignored", {"a"}, ExtraTensors::kIgnore, ""},
                      NamesCase{"extra_rejected",
                                {"a"},
                                ExtraTensors::kReject,
                                "b: unexpected tensor, expected none beyond the 1 required, got 2 more"},
                      NamesCase{"missing",
                                {"a", "x", "y"},
                                ExtraTensors::kIgnore,
                                "x: required tensor missing, expected 2 more tensor(s)"}),
    [](const auto& info) { return info.param.name; });

TEST(Checkpoint, NotADirectory) {
  ScopedTempDir dir;
  Result<Checkpoint> ck = Checkpoint::open(dir.path() + "/none");
  ASSERT_FALSE(ck.has_value());
  EXPECT_NE(ck.error().message.find("not a directory"), std::string::npos);
}

}  // namespace
}  // namespace mxq
