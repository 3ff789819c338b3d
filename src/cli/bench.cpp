// mxq bench: registers the `bench` command; each benchmark adds itself as a sub-subcommand (bench.h).
#include "cli/bench.h"

#include "cli/commands.h"

namespace mxq::cli {

void add_bench_linear(CLI::App& bench, int& exit_code);  // bench_linear.cpp (cuda); belongs in bench.h
void add_bench_refit(CLI::App& bench, int& exit_code);   // bench_refit.cpp (cuda)

void add_bench(CLI::App& app, int& exit_code) {
  auto* bench = app.add_subcommand("bench", "Measure throughput of mxq kernels");
  bench->require_subcommand(1);
  add_bench_quantize(*bench, exit_code);
  add_bench_linear(*bench, exit_code);
  add_bench_decode(*bench, exit_code);
  add_bench_refit(*bench, exit_code);
}

}  // namespace mxq::cli
