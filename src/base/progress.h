// Progress reporting: the library reports, the binary draws (a bar on a TTY, log lines otherwise).
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

namespace mxq {

struct Progress {
  std::string_view stage;  // "quantize", "load", "refit"
  std::string_view item;   // current tensor name
  int64_t done = 0;        // items (or bytes) finished
  int64_t total = 0;
};

// Return false to cancel; the caller then stops cleanly and reports cancellation.
using ProgressFn = std::function<bool(const Progress&)>;

}  // namespace mxq
