// The embedded default model (models/default in the repository): where to find it and how it runs.
#pragma once

#include <string>

#include "format/formats.h"

namespace mxq {

// note: MXFP8 by default because that is the format mxq exists to serve; the checkpoint itself is bf16.
inline constexpr Format kDefaultModelQuantization = Format::kMXFP8;

// "models/default" under the working directory if it exists, else next to the binary's build directory
// (<repo>/build/mxq -> <repo>/models/default); the plain relative path otherwise, for the error message.
std::string default_model_dir();

}  // namespace mxq
