#include "base/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mxq {
namespace {

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// -1 with `missing` set when the path does not exist. note: O_NONBLOCK makes open() of a FIFO return at once
// instead of waiting for a writer; fstat on the open descriptor then refuses it (and /dev/zero) before any read.
Result<int64_t> open_regular(const std::string& path, Fd& f, bool& missing) {
  missing = false;
  f.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (f.fd < 0) {
    if (errno == ENOENT) {
      missing = true;
      return -1;
    }
    return fail("{}: cannot open: {}", path, std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return fail("{}: cannot stat: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail("{}: expected a regular file, got {}", path, file_kind(st.st_mode));
  return static_cast<int64_t>(st.st_size);
}

// Appends up to `limit` bytes; stops at EOF. Returns whether more bytes follow the limit.
Result<bool> read_up_to(const std::string& path, int fd, uint64_t limit, std::string& out) {
  char buf[65536];
  while (out.size() < limit) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(sizeof buf, limit - out.size()));
    const ssize_t n = ::read(fd, buf, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("{}: read failed: {}", path, std::strerror(errno));
    if (n == 0) return false;
    out.append(buf, static_cast<size_t>(n));
  }
  char one;
  for (;;) {
    const ssize_t n = ::read(fd, &one, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("{}: read failed: {}", path, std::strerror(errno));
    return n > 0;
  }
}

}  // namespace

Result<std::optional<std::string>> read_regular_file(const std::string& path, uint64_t max_bytes) {
  Fd f;
  bool missing = false;
  auto size = open_regular(path, f, missing);
  if (!size) return tl::unexpected(size.error());
  if (missing) return std::optional<std::string>();
  if (static_cast<uint64_t>(*size) > max_bytes)
    return fail("{}: expected at most {} bytes, the file has {}", path, max_bytes, *size);
  // note: read until EOF, not st_size bytes: a file that grew after fstat is refused rather than cut, and
  // procfs-like files that report size 0 are read whole.
  std::string text;
  text.reserve(static_cast<size_t>(*size));
  auto more = read_up_to(path, f.fd, max_bytes, text);
  if (!more) return tl::unexpected(more.error());
  if (*more) return fail("{}: expected at most {} bytes, the file is larger", path, max_bytes);
  return std::optional<std::string>(std::move(text));
}

Result<std::string> read_regular_file_head(const std::string& path, size_t n) {
  Fd f;
  bool missing = false;
  auto size = open_regular(path, f, missing);
  if (!size) return tl::unexpected(size.error());
  if (missing) return fail("{}: no such file", path);
  std::string head;
  if (auto more = read_up_to(path, f.fd, n, head); !more) return tl::unexpected(more.error());
  return head;
}

}  // namespace mxq
