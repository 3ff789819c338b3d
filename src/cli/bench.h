// `mxq bench <what>`: one add_bench_<what> per benchmark, each in its own file (bench_<what>.cpp).
#pragma once

#include <CLI/CLI.hpp>

namespace mxq::cli {

void add_bench_quantize(CLI::App& bench, int& exit_code);  // bench_quantize.cpp

}  // namespace mxq::cli
