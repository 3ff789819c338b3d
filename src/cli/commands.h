// Each mxq subcommand lives in its own file and registers itself on the CLI11 app here.
#pragma once

#include <CLI/CLI.hpp>

namespace mxq::cli {

// Exit codes: 0 ok, 1 internal failure, 2 bad input (checkpoint, flags, request).
inline constexpr int kExitBadInput = 2;

// Each add_* adds one subcommand; its callback sets `exit_code`.
void add_inspect(CLI::App& app, int& exit_code);
void add_quantize(CLI::App& app, int& exit_code);
void add_bench(CLI::App& app, int& exit_code);
void add_generate(CLI::App& app, int& exit_code);
void add_delta(CLI::App& app, int& exit_code);

}  // namespace mxq::cli
