#include "engine/default_model.h"

#include <fmt/format.h>

namespace mxq {

namespace fs = std::filesystem;

std::vector<fs::path> default_model_candidates(const fs::path& exe) {
  const fs::path prefix = exe.parent_path().parent_path();  // <prefix>/bin/mxq or <repo>/build/mxq
  return {prefix / "share" / "mxq" / "models" / "default", prefix / "models" / "default"};
}

Result<std::string> default_model_dir() {
  std::error_code ec;
  // note: /proc/self/exe is the binary itself, whatever argv[0] or the working directory are; symlinks to it
  // (a PATH entry pointing at build/mxq) resolve to the real file.
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec)
    return fail("no --model given, and the default model cannot be located: /proc/self/exe: {}",
                ec.message());
  const std::vector<fs::path> candidates = default_model_candidates(exe);
  for (const fs::path& dir : candidates)
    if (fs::is_directory(dir, ec)) return dir.string();
  std::string searched;
  for (const fs::path& dir : candidates) searched += (searched.empty() ? "" : ", ") + dir.string();
  return fail(
      "no --model given, and the default model is not installed beside {} (searched {}); give --model DIR",
      exe.string(), searched);
}

}  // namespace mxq
