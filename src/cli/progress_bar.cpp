#include "cli/progress_bar.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>

namespace mxq::cli {

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), tty_(isatty(STDERR_FILENO) == 1), last_log_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() {
  if (tty_ && drawn_) std::fputc('\n', stderr);
}

ProgressFn ProgressBar::fn() {
  return [this](const Progress& p) {
    draw(p);
    return true;
  };
}

void ProgressBar::draw(const Progress& p) {
  const double frac = p.total > 0 ? static_cast<double>(p.done) / static_cast<double>(p.total) : 1.0;
  if (tty_) {
    constexpr int kWidth = 30;
    const int fill = static_cast<int>(frac * kWidth);
    std::fprintf(stderr, "\r%s [%-*s] %3d%% %lld/%lld %-60.60s", label_.c_str(), kWidth,
                 std::string(static_cast<size_t>(fill), '#').c_str(), static_cast<int>(frac * 100),
                 static_cast<long long>(p.done), static_cast<long long>(p.total), std::string(p.item).c_str());
    std::fflush(stderr);
    drawn_ = true;
    return;
  }
  // note: off a terminal, one line every 2 s at most, plus the last one.
  const auto now = std::chrono::steady_clock::now();
  if (p.done == p.total || now - last_log_ >= std::chrono::seconds(2)) {
    spdlog::info("{}: {}/{} ({:.0f}%) {}", label_, p.done, p.total, frac * 100, p.item);
    last_log_ = now;
  }
}

}  // namespace mxq::cli
