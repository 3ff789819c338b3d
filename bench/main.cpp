// mxq-bench: the benchmarks, ceilings and kernel studies of mxq, apart from the product (as llama-bench is
// apart from llama-cli): one subcommand per benchmark (bench.h). Results: bench/RESULTS.md.
#include <fmt/format.h>

#include <cstdio>

#include "bench/bench.h"
#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"mxq-bench: throughput of mxq's kernels, engine and refit against the ceilings measured in the "
               "same run"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("mxq-bench ") + MXQ_VERSION);
  int exit_code = 0;
  mxq::cli::add_bench_quantize(app, exit_code);
  mxq::cli::add_bench_linear(app, exit_code);
  mxq::cli::add_bench_decode(app, exit_code);
  mxq::cli::add_bench_refit(app, exit_code);
  mxq::cli::add_bench_gemm(app, exit_code);
  mxq::cli::add_bench_delta(app, exit_code);
  return mxq::cli::parse_and_run(app, "mxq-bench", argc, argv, exit_code);
}
