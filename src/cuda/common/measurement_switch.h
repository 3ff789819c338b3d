// The measurement switches (docs/cuda-engine.md, "Measurement switches"): environment variables that make a
// launcher run an older kernel variant process-wide, so that a benchmark can time both from one build.
#pragma once

#include <cstdlib>
#include <cstring>

namespace mxq::cuda {

// True when the environment variable `name` is set to exactly `value`; callers read it once (a static).
inline bool measurement_switch(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

}  // namespace mxq::cuda
