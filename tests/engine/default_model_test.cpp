// Where the binary looks for the embedded default model: beside an install, then beside a checkout's build
// directory; never the working directory (issue 22: outside the repo `mxq generate` failed).
#include "engine/default_model.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace mxq {
namespace {

TEST(DefaultModel, CandidatesAreTheInstallPrefixThenTheCheckout) {
  const auto c = default_model_candidates("/opt/mxq/bin/mxq");
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0], "/opt/mxq/share/mxq/models/default");
  EXPECT_EQ(c[1], "/opt/mxq/models/default");
  EXPECT_EQ(default_model_candidates("/src/mxq/build/mxq")[1], "/src/mxq/models/default");
  for (const auto& p : c) EXPECT_TRUE(p.is_absolute()) << p;  // nothing relative to the working directory
}

TEST(DefaultModel, FoundBesideTheBuildDirectoryWhateverTheWorkingDirectory) {
  // mxq_tests sits in the build directory, as build/mxq does. ctest runs it from the source tree, whose
  // models/default must not matter: found only when the build directory sits in the checkout.
  namespace fs = std::filesystem;
  const fs::path exe = fs::read_symlink("/proc/self/exe");
  const bool in_checkout = fs::equivalent(exe.parent_path().parent_path(), MXQ_SOURCE_DIR);
  auto dir = default_model_dir();
  if (in_checkout) {
    ASSERT_TRUE(dir) << dir.error().message;
    EXPECT_TRUE(fs::equivalent(*dir, fs::path(MXQ_SOURCE_DIR) / "models" / "default")) << *dir;
  } else {
    ASSERT_FALSE(dir) << *dir;
    EXPECT_NE(dir.error().message.find("share/mxq/models/default"), std::string::npos) << dir.error().message;
    EXPECT_NE(dir.error().message.find("--model"), std::string::npos) << dir.error().message;
  }
}

}  // namespace
}  // namespace mxq
