#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>
#include <utility>

namespace mxq {

static_assert(sizeof(size_t) == 8, "mxq maps whole checkpoints: 64-bit only");

namespace {
int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}
}  // namespace

Result<MappedFile> MappedFile::open(const std::string& path) {
  MappedFile f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) return fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd_, &st) != 0) return fail("{}: cannot stat: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail("{}: not a regular file", path);
  if (st.st_size < 0) return fail("{}: negative file size {}", path, static_cast<int64_t>(st.st_size));
  f.size_ = static_cast<size_t>(st.st_size);
  f.mtime_ns_ = mtime_ns(st);
  if (f.size_ == 0) return f;
  void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, f.fd_, 0);
  if (p == MAP_FAILED) return fail("{}: cannot mmap {} bytes: {}", path, f.size_, std::strerror(errno));
  f.data_ = static_cast<const uint8_t*>(p);
  return f;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mtime_ns_ = other.mtime_ns_;
  }
  return *this;
}

MappedFile::~MappedFile() { release(); }

void MappedFile::release() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  fd_ = -1;
  size_ = 0;
}

Status MappedFile::check_unchanged(std::string_view what) const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return fail("{}: cannot stat: {}", path_, std::strerror(errno));
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) != size_) {
    return fail("{}: {}: file size changed after it was validated, expected {} bytes, got {}", path_, what,
                size_, static_cast<int64_t>(st.st_size));
  }
  if (mtime_ns(st) != mtime_ns_) {
    return fail("{}: {}: file modified after it was validated, expected mtime {} ns, got {} ns", path_, what,
                mtime_ns_, mtime_ns(st));
  }
  return {};
}

namespace {

// note: the jump target is thread_local so concurrent guarded copies on several threads each return to
// their own sigsetjmp; a SIGBUS is delivered to the thread that faulted.
thread_local sigjmp_buf* t_sigbus_target = nullptr;
struct sigaction g_previous_sigbus {};
std::once_flag g_install_once;
bool g_installed = false;

void on_sigbus(int, siginfo_t*, void*) {
  if (sigjmp_buf* target = t_sigbus_target) {
    t_sigbus_target = nullptr;
    siglongjmp(*target, 1);
  }
  // Not ours: hand the signal back. Restoring the old action and returning re-executes the faulting load,
  // which then goes to that action (the default one dumps core, as it would have without us).
  sigaction(SIGBUS, &g_previous_sigbus, nullptr);
}

void install_sigbus_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  g_installed = sigaction(SIGBUS, &sa, &g_previous_sigbus) == 0;
}

}  // namespace

bool copy_guarding_sigbus(const uint8_t* src, size_t n, uint8_t* dst) {
  if (n == 0) return true;
  std::call_once(g_install_once, install_sigbus_handler);
  if (!g_installed) {  // cannot guard; the size re-check by the caller is then the only protection
    std::memcpy(dst, src, n);
    return true;
  }
  sigjmp_buf target;
  // note: savemask=1 so the signal mask (SIGBUS blocked inside the handler) is restored by siglongjmp.
  if (sigsetjmp(target, 1) != 0) return false;
  t_sigbus_target = &target;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_sigbus_target = nullptr;
  return true;
}

}  // namespace mxq
