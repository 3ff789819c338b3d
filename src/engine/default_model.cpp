#include "engine/default_model.h"

#include <filesystem>

namespace mxq {

std::string default_model_dir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory("models/default", ec)) return "models/default";
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const fs::path beside = exe.parent_path().parent_path() / "models" / "default";
  if (!ec && fs::is_directory(beside, ec)) return beside.string();
  return "models/default";
}

}  // namespace mxq
