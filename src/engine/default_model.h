// The embedded default model (models/default in the repository): where to find it and how it runs.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "base/error.h"
#include "format/formats.h"

namespace mxq {

// note: MXFP8 by default because that is the format mxq exists to serve; the checkpoint itself is bf16.
inline constexpr Format kDefaultModelQuantization = Format::kMXFP8;

// Where the default model is looked for, in order, for the binary at `exe`: an installed binary
// (<prefix>/bin/mxq -> <prefix>/share/mxq/models/default, what `cmake --install` lays out), then a build
// directory of a checkout (<repo>/build/mxq -> <repo>/models/default). Never the working directory: the
// binary finds the same model wherever it is run from.
std::vector<std::filesystem::path> default_model_candidates(const std::filesystem::path& exe);

// The first candidate for the running binary (/proc/self/exe) that is a directory, or an error naming every
// place searched and --model.
Result<std::string> default_model_dir();

}  // namespace mxq
