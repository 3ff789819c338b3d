// mxq-bench: one add_bench_<what> per benchmark, each in its own file (bench/<what>.cpp), registered by
// bench/main.cpp. The CUDA ones say so on a build without CUDA.
#pragma once

#include <CLI/CLI.hpp>

namespace mxq::cli {

void add_bench_quantize(CLI::App& app, int& exit_code);  // quantize.cpp
void add_bench_decode(CLI::App& app, int& exit_code);    // decode.cpp
void add_bench_linear(CLI::App& app, int& exit_code);    // linear.cpp (CUDA)
void add_bench_refit(CLI::App& app, int& exit_code);     // refit.cpp (CUDA)
void add_bench_gemm(CLI::App& app, int& exit_code);      // gemm.cpp (CUDA)
void add_bench_delta(CLI::App& app, int& exit_code);     // delta.cpp

}  // namespace mxq::cli
