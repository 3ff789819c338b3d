// Each mxq subcommand lives in its own file and registers itself on the CLI11 app here.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>

#include "base/error.h"
#include "format/formats.h"

namespace mxq::cli {

// Exit codes: 0 ok, 1 internal failure, 2 bad input (checkpoint, flags, request).
inline constexpr int kExitBadInput = 2;

// Each add_* adds one subcommand; its callback sets `exit_code`.
void add_inspect(CLI::App& app, int& exit_code);
void add_quantize(CLI::App& app, int& exit_code);
void add_generate(CLI::App& app, int& exit_code);
void add_delta(CLI::App& app, int& exit_code);
void add_serve(CLI::App& app, int& exit_code);

// Parses argv into `app` (whose callbacks set `exit_code`) and returns the exit code: CLI11's own for
// --help / --version, kExitBadInput with one stderr line naming the command for a parse error (mxq, mxq-bench).
int parse_and_run(CLI::App& app, std::string_view name, int argc, char** argv, const int& exit_code);

// --device auto picks CUDA when this build has it and a GPU is visible (generate, serve; flags.cpp).
bool cuda_device_visible();

// --activation-quant (generate, serve, mxq-bench decode): "auto" (the default) → what the checkpoint
// declares (`declared`, Scheme::activations: kMXFP8 for compressed-tensors' dynamic MXFP8
// input_activations, the W8A8 mode; weight-only otherwise), "none" → kBF16 (weight-only), "mxfp8" → kMXFP8
// (the W8A8 mode of the MXFP8 / MXFP4 projections, cuda/linear/linear.h); mxfp8 with projections in another
// format (linear_format, after any --quantization) is refused by name, since it would change nothing.
Result<Format> parse_activation_quant(std::string_view flag, Format linear_format,
                                      Format declared = Format::kBF16);
// One line for stderr at load when the checkpoint declares activation quantization: the mode that runs and
// why (declared, or overridden by the flag); "" when the checkpoint declares none.
std::string activation_mode_notice(std::string_view dir, Format declared, Format running);

}  // namespace mxq::cli
