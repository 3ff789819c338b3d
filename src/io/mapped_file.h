// A read-only memory mapping of one file, and the one copy routine that survives the file shrinking under it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "base/error.h"

namespace mxq {

class MappedFile {
 public:
  // Maps the whole file read-only (MAP_PRIVATE). An empty file maps to an empty span (mmap refuses length 0).
  static Result<MappedFile> open(const std::string& path);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::string& path() const { return path_; }
  // The bytes as they were when mapped. Touching a page past a later truncation raises SIGBUS: hot paths that
  // use this view accept that risk; everything else copies through copy_guarding_sigbus().
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  // Fails if the file's size or modification time differ from when it was mapped (fstat on the open
  // descriptor): truncation or an in-place rewrite after validation. A rename over the path is harmless (the
  // mapping keeps the old inode) and passes. `what` follows the path in the error ("<path>: <what>: ...").
  Status check_unchanged(std::string_view what) const;

 private:
  MappedFile() = default;
  void release();

  std::string path_;
  int fd_ = -1;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int64_t mtime_ns_ = 0;  // at open
};

// memcpy(dst, src, n), except that a SIGBUS raised while reading src (a mapped file truncated by another
// process) makes it return false instead of killing the process. Thread-safe: the jump target is per thread.
// A SIGBUS outside such a copy goes to whatever handler was installed before ours.
[[nodiscard]] bool copy_guarding_sigbus(const uint8_t* src, size_t n, uint8_t* dst);

}  // namespace mxq
