// The binary draws what the library reports: a bar on a terminal, periodic log lines otherwise.
#pragma once

#include <chrono>
#include <string>

#include "base/progress.h"

namespace mxq::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();  // ends the bar's line
  ProgressFn fn();  // callback for the library; never cancels

 private:
  void draw(const Progress& p);
  std::string label_;
  bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_log_;
};

}  // namespace mxq::cli
