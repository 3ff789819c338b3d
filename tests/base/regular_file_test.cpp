#include "base/regular_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

namespace mxq {
namespace {

namespace fs = std::filesystem;

class RegularFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mxq_regular_file_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  fs::path dir_;
};

TEST_F(RegularFile, ReadsWholeAndHead) {
  const std::string p = write("a.json", "{\"x\": 1}");
  auto all = read_regular_file(p, 100);
  ASSERT_TRUE(all) << all.error().message;
  ASSERT_TRUE(*all);
  EXPECT_EQ(**all, "{\"x\": 1}");
  auto head = read_regular_file_head(p, 3);
  ASSERT_TRUE(head) << head.error().message;
  EXPECT_EQ(*head, "{\"x");
  auto longer = read_regular_file_head(p, 100);
  ASSERT_TRUE(longer);
  EXPECT_EQ(*longer, "{\"x\": 1}");
}

TEST_F(RegularFile, MissingIsNulloptForTheWholeAndAnErrorForTheHead) {
  auto all = read_regular_file((dir_ / "none").string(), 100);
  ASSERT_TRUE(all) << all.error().message;
  EXPECT_FALSE(*all);
  auto head = read_regular_file_head((dir_ / "none").string(), 8);
  ASSERT_FALSE(head);
  EXPECT_NE(head.error().message.find("no such file"), std::string::npos) << head.error().message;
}

TEST_F(RegularFile, RefusesPastTheBoundBeforeReading) {
  const std::string p = write("big", std::string(1000, 'x'));
  auto r = read_regular_file(p, 999);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("at most 999 bytes, the file has 1000"), std::string::npos) << r.error().message;
  EXPECT_TRUE(read_regular_file(p, 1000));
}

TEST_F(RegularFile, RefusesADirectoryAFifoAndACharacterDeviceByKind) {
  fs::create_directories(dir_ / "d");
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto [path, kind] : {std::pair<std::string, std::string>{(dir_ / "d").string(), "a directory"},
                            {fifo, "a FIFO"},
                            {"/dev/zero", "a character device"}}) {
    auto all = read_regular_file(path, uint64_t{1} << 30);
    ASSERT_FALSE(all) << path;
    EXPECT_NE(all.error().message.find("expected a regular file, got " + kind), std::string::npos)
        << all.error().message;
    auto head = read_regular_file_head(path, 8);
    ASSERT_FALSE(head) << path;
    EXPECT_NE(head.error().message.find(kind), std::string::npos) << head.error().message;
  }
  // a FIFO with no writer is refused at once, not waited on
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

}  // namespace
}  // namespace mxq
